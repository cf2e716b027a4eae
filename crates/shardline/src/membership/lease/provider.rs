//! `Leases`: membership, leader election and self-fencing on a coordination store.
//!
//! Every decision is the core's [`LeaseEngine`] (see its module docs: member keys renewed every
//! TTL/3, self-fencing before the lease can lapse, leaders with terms from a durable counter,
//! members gone once their key is confirmed missing). This module carries out its commands: it
//! runs the store operations (encoding and decoding the values, see `values`), holds the hosting
//! lease, and publishes the views. One operation runs at a time; a new one replaces the one in
//! flight, whose answer the engine no longer wants.

use std::sync::Arc;
use std::time::Duration;

use shardline_core::lease::{
    LeaseCommand, LeaseEngine, LeaseEvent, LeaseKeys, LeaseView, MemberRecord, PeerChecks, StoreAnswer, StoreOp,
};
use shardline_core::Engine;
use shardline_core::NodeId;
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};

use super::keepalive;
use super::shard_maps::ShardMaps;
use super::store::CoordinationStore;
use super::values::{decode_entry, encode_value};
use crate::clock::Clock;
use crate::driver::owned::{self, Flow, Runner};
use crate::error::ConfigError;
use crate::membership::{
    BoxFuture, ClusterView, Control, ControlHandle, HostingLease, MembershipHandle, MembershipProvider, PeerLink,
    ProviderContext,
};

/// Settings of lease-based membership.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Lease TTL (default 3 s: a crashed node's key expires 2–3 s after its last renewal, so
    /// its shards move within about 3 s); keys are renewed every TTL/3. etcd counts it in
    /// whole seconds.
    pub ttl: Duration,
    /// A node stops its shards when it has not renewed for `ttl − safety_margin` (default 1 s).
    pub safety_margin: Duration,
    /// Failed renewals in a row after which a node downs itself (default 3).
    pub max_failures: u32,
    /// How long a member whose lease vanished stays "unknown" before it is down (default 0:
    /// its own self-fencing already guarantees it stopped).
    pub unknown_grace: Duration,
    /// Numbered membership slots (default off): each node holds the smallest free number under
    /// `{cluster}/slots/`, which orders members for the `Ranges` strategy. A freed number stays
    /// a hole until the next node takes it, so the others keep their places.
    pub numbered_slots: bool,
    /// Keep-alives between members and the split-brain race (default on: a keep-alive every
    /// 500 ms, unreachable after 2 s of silence, the race once the unreachable members stayed
    /// the same for 5 s). `None`: members are judged by their keys alone, and one cut from its
    /// peers but not from the store keeps its shards, unreachable, for as long as the cut lasts.
    pub split_brain: Option<PeerChecks>,
    /// Terms are taken above this (default 0): set it to the journal's highest fence term
    /// ([`Journal::highest_term`](crate::journal::Journal::highest_term)), so that a cluster
    /// whose store was replaced, or that ran on gossip before, is not refused by its own fences.
    /// A fence found above it later raises it for the next term taken.
    pub term_floor: u64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            ttl: Duration::from_secs(3),
            safety_margin: Duration::from_secs(1),
            max_failures: 3,
            unknown_grace: Duration::ZERO,
            numbered_slots: false,
            split_brain: Some(PeerChecks::default()),
            term_floor: 0,
        }
    }
}

/// Lease-based membership on a coordination store. See the module docs.
pub struct Leases {
    store: Arc<dyn CoordinationStore>,
    cluster: String,
    config: LeaseConfig,
}

impl Leases {
    /// Membership of `cluster` on `store`.
    pub fn new(store: Arc<dyn CoordinationStore>, cluster: impl Into<String>, config: LeaseConfig) -> Self {
        Leases { store, cluster: cluster.into(), config }
    }
}

/// Runs one store operation.
async fn execute(store: Arc<dyn CoordinationStore>, op: StoreOp) -> StoreAnswer {
    let failed = |e: super::store::StoreError| StoreAnswer::Failed(e.to_string());
    let ttl = |ms: u64| Duration::from_millis(ms);
    match op {
        StoreOp::CreateEphemeral { key, value, ttl_ms } => match encode_value(&value) {
            Ok(v) => store.create_ephemeral(&key, v, ttl(ttl_ms)).await.map_or_else(failed, StoreAnswer::Written),
            // Nothing written: the lease lapses and the node fences itself, instead of
            // publishing an empty record.
            Err(e) => StoreAnswer::Failed(e.to_string()),
        },
        StoreOp::Refresh { key, value, revision, ttl_ms } => match encode_value(&value) {
            Ok(v) => {
                let started = std::time::Instant::now();
                let r = store.refresh(&key, v, revision, ttl(ttl_ms)).await;
                metrics::histogram!("shardline_lease_renewal_seconds").record(started.elapsed().as_secs_f64());
                r.map_or_else(failed, StoreAnswer::Written)
            }
            Err(e) => StoreAnswer::Failed(e.to_string()),
        },
        StoreOp::CompareAndPut { key, value, revision } => match encode_value(&value) {
            Ok(v) => store.compare_and_put(&key, v, revision).await.map_or_else(failed, StoreAnswer::Written),
            Err(e) => StoreAnswer::Failed(e.to_string()),
        },
        StoreOp::Get { key, kind } => match store.get(&key).await {
            Ok(e) => StoreAnswer::Entry(e.map(|e| decode_entry(e, kind))),
            Err(e) => failed(e),
        },
        StoreOp::List { prefix, kind } => match store.list(&prefix).await {
            Ok(entries) => StoreAnswer::Entries(entries.into_iter().map(|e| decode_entry(e, kind)).collect()),
            Err(e) => failed(e),
        },
        StoreOp::Delete { key, revision } => match store.delete(&key, revision).await {
            Ok(_) => StoreAnswer::Deleted,
            Err(e) => failed(e),
        },
    }
}

impl MembershipProvider for Leases {
    fn start(self: Box<Self>, ctx: ProviderContext) -> BoxFuture<'static, Result<MembershipHandle, ConfigError>> {
        Box::pin(async move {
            let ms = |d: Duration| d.as_millis().min(u128::from(u64::MAX)) as u64;
            let mut config = shardline_core::lease::LeaseConfig::default();
            config.ttl_ms = ms(self.config.ttl);
            config.safety_margin_ms = ms(self.config.safety_margin);
            config.max_failures = self.config.max_failures;
            config.unknown_grace_ms = ms(self.config.unknown_grace);
            config.numbered_slots = self.config.numbered_slots;
            config.split_brain = self.config.split_brain.clone();
            config.term_floor = self.config.term_floor;
            config.validate().map_err(|e| ConfigError::Invalid { name: "ttl", reason: e.to_string() })?;
            let me = MemberRecord {
                roles: ctx.roles.clone(),
                weight: ctx.weight,
                ..MemberRecord::up(ctx.me.clone(), ctx.addr.to_string(), ctx.app_version.clone())
            };
            let keys = LeaseKeys::new(&self.cluster, &ctx.me.name);
            // The store must answer at start: a backend that is down is a clear error.
            self.store.list(&keys.members_prefix).await.map_err(|e| ConfigError::Membership(e.to_string()))?;
            let maps = ShardMaps::new(self.store.clone(), &self.cluster);
            let engine = LeaseEngine::new(config, keys, me, ctx.clock.now_ms())
                .map_err(|e| ConfigError::Invalid { name: "ttl", reason: e.to_string() })?;
            let lease = HostingLease::new(ctx.clock);
            let (view_tx, views) = watch::channel(ClusterView::default());
            let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
            let mut driver = Driver {
                engine,
                store: self.store.clone(),
                clock: ctx.clock,
                lease: lease.clone(),
                view_tx,
                in_flight: None,
                link: ctx.peers.clone(),
                addr: ctx.addr.to_string(),
                inbox: ctx.gossip,
                control: ctl_rx,
                exited: false,
                halted: false,
            };
            // The first rounds (member key, leadership, members) before the node goes on, so that
            // its first view is a real one; bounded by the TTL if the store is slow.
            let _ = tokio::time::timeout(self.config.ttl, driver.settle()).await;
            tokio::spawn(owned::run(driver));
            Ok(MembershipHandle {
                views,
                control: Arc::new(ControlHandle(ctl_tx)),
                lease: Some(lease),
                maps: Some(maps),
            })
        })
    }
}

/// The store operation in flight, with the engine's id for it.
type InFlight = (u64, BoxFuture<'static, StoreAnswer>);

/// What the lease driver hears.
enum Input {
    Control(Control),
    Answer(u64, StoreAnswer),
    Heard(NodeId, Vec<u8>),
}

/// Carries out a [`LeaseEngine`]'s commands.
struct Driver {
    engine: LeaseEngine,
    store: Arc<dyn CoordinationStore>,
    /// The node's clock.
    clock: Clock,
    lease: HostingLease,
    view_tx: watch::Sender<ClusterView>,
    in_flight: Option<InFlight>,
    /// How keep-alives reach the members.
    link: Arc<dyn PeerLink>,
    /// This node's listen address, for the answers to its keep-alives.
    addr: String,
    /// Keep-alives from peers.
    inbox: mpsc::Receiver<(NodeId, Vec<u8>)>,
    /// The node's leave, exit and halt.
    control: mpsc::UnboundedReceiver<Control>,
    /// The node exits: only a halt is heard from now on.
    exited: bool,
    /// Halted, or the control channel closed: it is not read again.
    halted: bool,
}

impl Runner for Driver {
    type Engine = LeaseEngine;
    type Input = Input;

    fn engine(&mut self) -> &mut LeaseEngine {
        &mut self.engine
    }
    fn clock(&self) -> &Clock {
        &self.clock
    }
    async fn next_input(&mut self) -> Option<Input> {
        // An exit deletes the keys, keep-alives answered meanwhile; once it is done, nothing
        // but a halt is heard.
        let listen = !(self.exited && owned::idle(self));
        let halted = self.halted;
        let (in_flight, inbox, control) = (&mut self.in_flight, &mut self.inbox, &mut self.control);
        let answer = async {
            match in_flight.as_mut() {
                Some((id, f)) => (*id, f.await),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            (id, answer) = answer => Some(Input::Answer(id, answer)),
            Some((from, data)) = inbox.recv(), if listen => Some(Input::Heard(from, data)),
            c = control.recv(), if !halted => Some(Input::Control(c.unwrap_or(Control::Halt))),
        }
    }
    fn handle(&mut self, input: Input, now: u64) -> Flow {
        match input {
            Input::Answer(id, answer) => {
                self.in_flight = None;
                self.engine.handle_answer(now, id, answer);
            }
            Input::Heard(from, data) => self.heard(&from, &data),
            Input::Control(Control::Halt) => {
                self.halted = true;
                // Downed by the split-brain resolver: hosting is revoked already, and the keys
                // go before the node stops (bounded by the TTL), so that the winner's side need
                // not wait for them to expire.
                return match self.engine.is_exiting() {
                    true => Flow::Finish(self.engine_ttl()),
                    false => Flow::Stop,
                };
            }
            Input::Control(_) if self.exited => {}
            Input::Control(Control::Leave) => self.engine.handle_leave(now),
            // The keys are deleted (each bounded by the TTL), so that the others need not wait
            // for them to expire.
            Input::Control(Control::Exit) => {
                self.exited = true;
                self.engine.handle_exit(now);
            }
            // The store orders terms for every cluster on it, but not for a journal written
            // before it (a replaced store, a cluster that ran on gossip).
            Input::Control(Control::FencedAbove(term)) => self.engine.handle_fenced_above(now, term),
        }
        Flow::Go
    }
    fn carry_out(&mut self, command: LeaseCommand) {
        match command {
            LeaseCommand::Store { id, op } => {
                self.in_flight = Some((id, Box::pin(execute(self.store.clone(), op))));
            }
            LeaseCommand::ExtendHosting { until } => self.lease.extend_to(until),
            LeaseCommand::RevokeHosting => self.lease.revoke(),
            LeaseCommand::Publish(view) => self.publish(view),
            LeaseCommand::Log(event) => log(&event),
            LeaseCommand::KeepAlive { to } => keepalive::ping_all(self.link.as_ref(), &self.addr, &to),
        }
    }
    fn busy(&self) -> bool {
        self.in_flight.is_some()
    }
}

impl Driver {
    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Runs until the engine is idle: nothing in flight, and nothing due before its next round.
    async fn settle(&mut self) {
        owned::carry_out(self);
        loop {
            let due = self.engine.poll_timeout().is_some_and(|t| t <= self.now());
            // A new incarnation waiting for a member's answer is settled too: answers arrive
            // only once the node serves, after this.
            if self.in_flight.is_none() && !due {
                return;
            }
            if !matches!(owned::step(self).await, Flow::Go) {
                return;
            }
        }
    }

    /// A keep-alive from `from` (the only data peers send this provider).
    fn heard(&mut self, from: &NodeId, data: &[u8]) {
        match keepalive::receive(self.link.as_ref(), from, data) {
            Ok(()) => {
                let now = self.now();
                self.engine.handle_heard(now, from);
            }
            Err(e) => {
                warn!(error = %e, "keep-alive refused");
                metrics::counter!("shardline_lease_bad_keepalives_total").increment(1);
            }
        }
    }

    fn engine_ttl(&self) -> Duration {
        Duration::from_millis(self.engine.ttl_ms())
    }

    /// Sends the view to the node (when it changed).
    fn publish(&self, v: LeaseView) {
        crate::membership::publish_view(&self.view_tx, v.view, v.leader, &v.addresses);
    }
}

/// Logs (and counts) what the engine reports.
fn log(event: &LeaseEvent) {
    match event {
        LeaseEvent::Fenced { reason } => warn!(reason, "fencing this node: its lease cannot be kept"),
        LeaseEvent::RenewalFailed { error, failures } => {
            warn!(error = %error, failures, "cannot renew the membership lease")
        }
        LeaseEvent::WaitingForPreviousIncarnation => {
            info!("waiting for the previous incarnation's lease to expire")
        }
        LeaseEvent::Leads { term } => info!(term, "this node leads the cluster"),
        LeaseEvent::LeadershipLost { reason } => warn!(reason, "leadership given up"),
        LeaseEvent::MemberGone { node } => info!(node = %node, "member lease gone"),
        LeaseEvent::BadValue { key, reason } => {
            warn!(%key, %reason, "coordination store value refused");
            metrics::counter!("shardline_lease_bad_values_total").increment(1);
        }
        LeaseEvent::SlotTaken { slot } => info!(slot, "membership slot taken"),
        LeaseEvent::SlotLost { slot } => warn!(slot, "membership slot lost; taking a new one"),
        LeaseEvent::Unreachable { node } => warn!(%node, "member unreachable: no keep-alive answered"),
        LeaseEvent::ReachableAgain { node } => info!(%node, "member reachable again"),
        LeaseEvent::SplitBrainRace { reachable, unreachable, delay_ms } => {
            warn!(reachable, unreachable, delay_ms, "unreachable members stable: racing for the split-brain key")
        }
        LeaseEvent::SplitBrainWon { downed } => {
            let downed: Vec<String> = downed.iter().map(ToString::to_string).collect();
            warn!(downed = ?downed, "split brain resolved: this side survives, the unreachable members are downed")
        }
        LeaseEvent::SplitBrainLost => info!("split brain: another member decided"),
        LeaseEvent::DownedBySplitBrain { by } => {
            error!(winner = %by, "downed by the split-brain resolver: stopping every shard and rejoining")
        }
        LeaseEvent::WaitingToReachAMember => {
            info!("members hold keys but none answered yet: joining once one does")
        }
    }
    debug!(?event, "lease engine");
}
