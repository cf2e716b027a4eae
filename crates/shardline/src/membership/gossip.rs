//! `Gossip`: nodes join through seed addresses and keep their membership with SWIM.
//!
//! Every decision is the core's [`GossipEngine`] (see its module docs: SWIM probes on the `foca`
//! crate, status broadcasts, the oldest `Up` reachable member leads with a term above every term
//! heard). This module carries out its commands over the node's transport and publishes its
//! views; it decides nothing.
//!
//! - Data for a member that is not down goes on the member's connection (the one the sharding
//!   layer uses, so a member that cannot be probed is one whose traffic does not get through).
//!   Data for a seed known by address only, or for a member held down (announces that find the
//!   other side of a healed partition), goes on a short-lived connection of its own.
//! - Gossip is lossy by design (SWIM repeats and probes indirectly): data that cannot be queued
//!   is counted and dropped, never waited for.
//!
//! - Members in doubt have their address checked ([`GossipCommand::CheckAddress`]): a handshake
//!   on a connection of its own, whose answer (a refusal, the node listening there, or nothing)
//!   goes back to the engine, which takes a refusal or another node as proof that the member's
//!   process is gone.
//!
//! **Split-brain resolution is on by default** (`KeepMajority`, see [`GossipConfig`]): a
//! partition keeps its larger side, and the other stops its shards before they are taken over.
//! With it, the node hosts only while a majority answered it within the resolver's window
//! ([`GossipEngine::hosting_until`], kept in the handle's [`HostingLease`], which every entry
//! point checks as it checks a lease provider's): a paused process wakes up unable to process
//! anything, and a node cut off (both ways or one way) stops before the others take over. As a
//! lease's, the lapse is final: the node is fenced and comes back as a new incarnation.
//! [`GossipConfig::without_split_brain`] turns all of that off, and then both sides of a
//! partition host the same shards.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;

use shardline_core::gossip::{
    AddressAnswer, GossipCommand, GossipConfig, GossipEngine, GossipEvent, GossipId, GossipView,
};
use shardline_core::NodeId;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::{
    BoxFuture, ClusterView, Control, ControlHandle, HostingLease, MembershipHandle, MembershipProvider, PeerLink,
    ProviderContext,
};
use crate::clock::Clock;
use crate::driver::owned::{self, Flow, Runner};
use crate::error::{ConfigError, TransportError};

/// Gossip membership joining through seed addresses. See the module docs.
///
/// ```
/// use shardline::membership::Gossip;
///
/// // The first seed starts the cluster (after trying the others for a moment); every other
/// // node joins through any seed that answers.
/// let provider = Gossip::new(["10.0.0.1:7101", "10.0.0.2:7101"]).term_floor(42);
/// # let _ = provider;
/// ```
#[derive(Clone, Debug)]
pub struct Gossip {
    seeds: Vec<String>,
    config: GossipConfig,
}

impl Gossip {
    /// Seed addresses (`host:port`). A node whose own address is the first seed starts a
    /// cluster; with no seed at all, the node is a cluster of its own at once.
    pub fn new<S: Into<String>>(seeds: impl IntoIterator<Item = S>) -> Self {
        Gossip { seeds: seeds.into_iter().map(Into::into).collect(), config: GossipConfig::default() }
    }

    /// With settings (probe period, suspicion time, …).
    pub fn with_config(mut self, config: GossipConfig) -> Self {
        self.config = config;
        self
    }

    /// Leads only with terms above `floor`. Gossip keeps terms growing while any member lives;
    /// a cluster restarted from scratch starts again from here. Set it to the journal's highest
    /// fence term ([`Journal::highest_term`](crate::journal::Journal::highest_term)) or the
    /// restarted cluster's writes would be fenced out by its own earlier incarnation.
    pub fn term_floor(mut self, floor: u64) -> Self {
        self.config.term_floor = floor;
        self
    }

    /// This node comes back as a new incarnation after it was declared down (its runtime knows:
    /// [`Cluster::downed`](crate::Cluster::downed) ended the previous one). As the first seed it
    /// then starts no cluster while it reaches nobody, since the cluster that downed it may be
    /// just out of reach; it forms one only once the members it reaches are all restarted too
    /// ([`GossipConfig::rejoin`]). A term floor above zero (a journal whose fences show that a
    /// cluster ran) has the same effect; the only seed, which has nobody to try, waits two
    /// announce periods for the members that outlived it before it starts a cluster alone.
    pub fn rejoining(mut self) -> Self {
        self.config.rejoin = true;
        self
    }
}

/// Resolves seed addresses to the form members announce (`ip:port`); one that cannot be resolved
/// is a configuration error.
async fn resolve(seeds: &[String]) -> Result<Vec<String>, ConfigError> {
    let mut out = Vec::new();
    for s in seeds {
        let resolved = tokio::net::lookup_host(s.as_str())
            .await
            .map_err(|e| ConfigError::Invalid { name: "seeds", reason: format!("{s}: {e}") })?
            .next()
            .ok_or_else(|| ConfigError::Invalid { name: "seeds", reason: format!("{s}: no address") })?;
        out.push(resolved.to_string());
    }
    Ok(out)
}

/// The engine's randomness: different for every node incarnation.
fn random_seed(me: &NodeId) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    me.hash(&mut h);
    std::process::id().hash(&mut h);
    h.finish()
}

impl MembershipProvider for Gossip {
    fn start(self: Box<Self>, ctx: ProviderContext) -> BoxFuture<'static, Result<MembershipHandle, ConfigError>> {
        Box::pin(async move {
            let seeds = resolve(&self.seeds).await?;
            let me = GossipId {
                addr: ctx.addr.to_string(),
                node: Some(ctx.me.clone()),
                app_version: ctx.app_version.clone(),
                roles: ctx.roles.clone(),
                weight: ctx.weight,
            };
            let engine = GossipEngine::new(self.config.clone(), me, &seeds, ctx.clock.now_ms(), random_seed(&ctx.me))
                .ok_or_else(|| {
                    ConfigError::Membership(
                        "gossip settings out of range, or a split-brain policy gossip alone cannot carry out (LeaseMajority)"
                            .into(),
                    )
                })?;
            let (view_tx, views) = watch::channel(ClusterView::default());
            let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
            let (answers, answers_rx) = mpsc::unbounded_channel();
            // Bounded only with a resolver: without one a partition hosts on both sides anyway.
            let lease = engine.hosting_until().map(|_| HostingLease::new(ctx.clock));
            let driver = Driver {
                engine,
                clock: ctx.clock,
                peers: ctx.peers,
                view_tx,
                down: BTreeSet::new(),
                answers,
                lease: lease.clone(),
                data: ctx.gossip,
                control: ctl_rx,
                answered: answers_rx,
            };
            driver.extend_lease();
            tokio::spawn(owned::run(driver));
            Ok(MembershipHandle { views, control: Arc::new(ControlHandle(ctl_tx)), lease, maps: None })
        })
    }
}

/// Carries out a [`GossipEngine`]'s commands.
struct Driver {
    engine: GossipEngine,
    clock: Clock,
    peers: Arc<dyn PeerLink>,
    view_tx: watch::Sender<ClusterView>,
    /// Members the last view holds down or removed: their connections are gone.
    down: BTreeSet<NodeId>,
    /// Where address checks report what they found.
    answers: mpsc::UnboundedSender<(GossipId, AddressAnswer)>,
    /// Until when this node may host, as the engine last said.
    lease: Option<HostingLease>,
    /// Gossip frames from peers.
    data: mpsc::Receiver<(NodeId, Vec<u8>)>,
    /// The node's leave, exit and halt.
    control: mpsc::UnboundedReceiver<Control>,
    /// What address checks found (`answers` is their sender).
    answered: mpsc::UnboundedReceiver<(GossipId, AddressAnswer)>,
}

/// What the gossip driver hears.
enum Input {
    Control(Control),
    Data(Vec<u8>),
    Address(GossipId, AddressAnswer),
}

impl Runner for Driver {
    type Engine = GossipEngine;
    type Input = Input;

    fn engine(&mut self) -> &mut GossipEngine {
        &mut self.engine
    }
    fn clock(&self) -> &Clock {
        &self.clock
    }
    async fn next_input(&mut self) -> Option<Input> {
        tokio::select! {
            c = self.control.recv() => Some(Input::Control(c.unwrap_or(Control::Halt))),
            d = self.data.recv() => d.map(|(_, bytes)| Input::Data(bytes)),
            Some((member, answer)) = self.answered.recv() => Some(Input::Address(member, answer)),
        }
    }
    fn handle(&mut self, input: Input, now: u64) -> Flow {
        match input {
            Input::Control(Control::Leave) => self.engine.handle_leave(now),
            Input::Control(Control::Exit) => {
                // The goodbye goes out on the transport's queues; this node is done.
                self.engine.handle_exit(now);
                return Flow::Stop;
            }
            Input::Control(Control::FencedAbove(term)) => self.engine.handle_fenced_above(now, term),
            Input::Control(Control::Halt) => return Flow::Stop,
            Input::Data(bytes) => self.engine.handle_data(now, &bytes),
            Input::Address(member, answer) => self.engine.handle_address(now, &member, answer),
        }
        Flow::Go
    }
    fn carry_out(&mut self, command: GossipCommand) {
        match command {
            GossipCommand::Send { to, data } => self.send(to, data),
            GossipCommand::CheckAddress { member } => self.check_address(member),
            GossipCommand::Publish(view) => self.publish(view),
            GossipCommand::Log(event) => log(&event),
        }
    }
    fn settle(&mut self) {
        self.extend_lease();
    }
}

impl Driver {
    /// Moves the lease to the engine's bound (earlier too: a member joined, answers grew old).
    fn extend_lease(&self) {
        let (Some(lease), Some(until)) = (&self.lease, self.engine.hosting_until()) else { return };
        let now = self.clock.now_ms();
        if until <= now {
            // Ended, at its end or now (declared down), whichever came first: the ownership log
            // dates the stops of a lapsed node from there. Never granted (a node that has not
            // joined a formed cluster yet, or not been answered yet): nothing to end.
            if lease.valid_until().is_some() {
                lease.revoke();
            }
            return;
        }
        // A day past now stands for "no end" (an instant that far out would overflow).
        lease.extend_to(until.min(now.saturating_add(86_400_000)));
    }

    fn send(&self, to: GossipId, data: Vec<u8>) {
        let addr: SocketAddr = match to.addr.parse() {
            Ok(a) => a,
            Err(e) => {
                warn!(addr = %to.addr, error = %e, "gossip member with an unreadable address: not sent");
                metrics::counter!("shardline_gossip_unsent_total").increment(1);
                return;
            }
        };
        match to.node {
            Some(node) if !self.down.contains(&node) => {
                if let Err(why) = self.peers.send(&node, addr, data) {
                    debug!(%node, why, "gossip not queued (SWIM repeats it)");
                    metrics::counter!("shardline_gossip_unsent_total").increment(1);
                }
            }
            _ => {
                let sent = self.peers.send_to_address(addr, data);
                tokio::spawn(async move {
                    if let Err(e) = sent.await {
                        debug!(%addr, error = %e, "seed or downed member not reachable");
                    }
                });
            }
        }
    }

    /// Connects to `member`'s address in the background; the answer comes back to `run`.
    fn check_address(&self, member: GossipId) {
        let Ok(addr) = member.addr.parse::<SocketAddr>() else { return };
        let identify = self.peers.identify(addr);
        let answers = self.answers.clone();
        tokio::spawn(async move {
            let answer = match identify.await {
                Ok(node) => AddressAnswer::Node(node),
                Err(TransportError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    AddressAnswer::Refused
                }
                Err(e) => {
                    debug!(%addr, error = %e, "address check: no answer");
                    AddressAnswer::Silent
                }
            };
            let _ = answers.send((member, answer));
        });
    }

    fn publish(&mut self, v: GossipView) {
        self.down = v.view.members().filter(|m| m.status.is_fenced()).map(|m| m.node.clone()).collect();
        super::publish_view(&self.view_tx, v.view, v.leader, &v.addresses);
    }
}

fn log(event: &GossipEvent) {
    match event {
        GossipEvent::Joined => info!("joined the cluster"),
        GossipEvent::Leads { term } => info!(term, "this node leads the cluster"),
        GossipEvent::DownedUnreachable { nodes } => {
            warn!(?nodes, "split-brain resolver: this side survives and downs the members it cannot reach")
        }
        GossipEvent::MemberDown { node } => warn!(%node, "member declared down"),
        GossipEvent::MemberGone { node, evidence } => warn!(%node, evidence, "member's process is gone: down at once"),
        GossipEvent::MemberLeft { node } => info!(%node, "member left the cluster"),
        GossipEvent::DeclaredDown => warn!("this node was declared down by the cluster"),
        GossipEvent::LostMajority { silent_ms } => warn!(
            silent_ms,
            "no majority of the cluster answered this node within the window: it downs itself (paused or cut off)"
        ),
        GossipEvent::Unreachable { nodes } if nodes.is_empty() => info!("every member is reachable again"),
        GossipEvent::Unreachable { nodes } => {
            let nodes: Vec<String> = nodes.iter().map(ToString::to_string).collect();
            warn!(nodes = %nodes.join(","), "members unreachable; the split-brain resolver waits for this set to stay the same")
        }
        GossipEvent::DownedWhenUnstable { unstable_ms } => warn!(
            unstable_ms,
            "split-brain resolver: the unreachable members kept changing for too long to decide; this node downs itself"
        ),
        GossipEvent::DecisionDeferred { late } => {
            let late: Vec<String> = late.iter().map(ToString::to_string).collect();
            info!(late = %late.join(","), "split-brain resolver: a reachable member's status is late; the decision waits")
        }
        GossipEvent::BadData { error } => {
            warn!(%error, "gossip data that cannot be read: dropped");
            metrics::counter!("shardline_gossip_bad_data_total").increment(1);
        }
    }
}
