//! The region of one entity type: what the commands of the core's `RegionEngine` do, on the
//! shared driver (the engine behind a lock, one wake-up task).
//!
//! Messages for shards this node hosts skip the engine's lock: `routes` holds, per shard, the
//! host a send would be delivered to (`RegionEngine::local_epoch`), refreshed under the lock after
//! every input that can change it. Every caller on the node used to take that one lock per ask.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use shardline_core::{
    Epoch, NodeId, RegionCommand, RegionConfig, RegionEngine, RegionMessage, RememberPace, SendFailure, ShardId, Term,
    ToRegion, TypeKey,
};
use tracing::{debug, warn};

use super::ask::deadlines::Deadlines;
use super::claim::ShardClaim;
use super::entity::Entity;
use super::envelope::{Body, Envelope};
use super::host::{Budget, HostEnv, ShardHost};
use super::message::{ReplyAddr, WireEnvelope};
use super::refusal::{refuse, Refusal};
use super::settings::EntitySettings;
use crate::driver::shared::{Carrier, Shared};
use crate::error::Error;
use crate::sharding::message::PeerMessage;
use crate::sharding::node::Node;
use crate::transport::SendError;

mod remembered;

pub(crate) struct State<E: Entity> {
    engine: RegionEngine<Envelope<E>>,
    hosts: HashMap<ShardId, Arc<ShardHost<E>>>,
    /// A `tell` refused while the lock was held (reported to its caller).
    refused: Option<Error>,
    /// The epoch of the host in each shard's route, so that a refresh touches only the routes
    /// that change.
    routed: Vec<Option<Epoch>>,
    /// The input's own commands fed failures back into the engine (undeliverable, queue full).
    fed_back: bool,
    /// The input may change a route (see `Region::input_then`).
    may_reroute: bool,
}

/// The host a shard's messages go to without the engine, when there is one.
type LocalRoute<E> = RwLock<Option<Arc<ShardHost<E>>>>;

pub(crate) struct Region<E: Entity> {
    pub type_key: TypeKey,
    pub settings: EntitySettings,
    node: Node,
    env: Arc<HostEnv>,
    driver: Shared<Region<E>>,
    /// Per shard, the host a message is delivered to without the engine (see the module docs).
    routes: Box<[LocalRoute<E>]>,
    /// A passivation sweep runs.
    passivating: AtomicBool,
    /// The node's budget of the type's entities in memory ([`EntitySettings::max_active`]).
    budget: Option<Arc<Budget<E>>>,
}

/// What the node needs from a region of any type.
pub(crate) trait RegionDyn: Send + Sync {
    fn on_region_frame(self: Arc<Self>, from: &NodeId, msg: RegionMessage<WireEnvelope>);
    fn on_coordinator_frame(self: Arc<Self>, from: &NodeId, msg: ToRegion);
    fn on_undeliverable(self: Arc<Self>, peer: &NodeId, msg: RegionMessage<WireEnvelope>);
    fn on_link_down(self: Arc<Self>, peer: &NodeId);
    fn on_coordinator_changed(self: Arc<Self>, node: NodeId, term: Term);
    fn on_fenced(self: Arc<Self>);
    /// Stops every hosted shard without a hand-off (the node leaves and nobody can take them).
    fn stop_all(self: Arc<Self>);
    fn settings(&self) -> &EntitySettings;
    fn hosted(&self) -> Vec<(ShardId, Epoch)>;
    fn flush_all(self: Arc<Self>);
    fn is_settled(&self) -> bool;
    /// The node left: what still waits for a home is refused, not processed.
    fn on_left(self: Arc<Self>);
    fn homes(&self) -> Vec<Option<NodeId>>;
    fn entity_count(&self) -> usize;
    fn active_count(&self) -> usize;
    /// What this node hosts of the type, read under the engine's lock.
    fn hosting(&self) -> Hosting;
}

/// What a node hosts of one entity type; see [`crate::Cluster::hosting`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Hosting {
    /// The entity type.
    pub type_key: String,
    /// Shards started here (stopping ones included).
    pub shards: usize,
    /// Entities in memory here, idle or running.
    pub entities: usize,
    /// Entities with a running task.
    pub active_entities: usize,
    /// Messages this node's region holds for shards that are moving or have no home yet.
    pub buffered: usize,
}

impl<E: Entity> Region<E> {
    pub fn new(node: Node, settings: EntitySettings, proxy: bool) -> Arc<Self> {
        let mut rc = RegionConfig::new(settings.shards);
        rc.max_buffered = settings.max_buffered;
        rc.hosting = !proxy;
        rc.linger_sweep_ms = Some(shardline_core::host::LINGER_MS);
        rc.passivate_after_ms = settings.passivate_after.map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64);
        rc.journaled = settings.journal.is_some();
        rc.remember = settings
            .persistence
            .remember
            .filter(|_| rc.journaled)
            .map(|per_second| RememberPace { per_second, at_once: settings.persistence.remember_at_once });
        let me = node.id().clone();
        let shards = settings.shards;
        let settings_budget = settings.max_active.map(|max| Budget::new(max, settings.passivation_policy));
        let env = Arc::new(HostEnv {
            node: node.clone(),
            registry: Arc::new(node.clone()),
            mailbox: settings.mailbox,
            type_key: Arc::from(settings.type_key.as_str()),
            persistence: settings.persistence,
        });
        let region = Arc::new(Region {
            type_key: TypeKey::new(&settings.type_key),
            settings,
            node,
            env,
            driver: Shared::new(State {
                engine: RegionEngine::new(rc, me),
                hosts: HashMap::new(),
                refused: None,
                routed: vec![None; shards as usize],
                fed_back: false,
                may_reroute: true,
            }),
            routes: (0..shards).map(|_| RwLock::new(None)).collect(),
            passivating: AtomicBool::new(false),
            budget: settings_budget,
        });
        Shared::start(&region);
        region
    }

    fn now(&self) -> u64 {
        self.node.now_ms()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<E>> {
        self.driver.lock()
    }

    /// Runs one input through the engine, carries out what it asks for and refreshes the routes.
    fn input(self: &Arc<Self>, f: impl FnOnce(&mut RegionEngine<Envelope<E>>, u64)) -> Option<Error> {
        self.input_then(f, true)
    }

    /// Like `input`, for the inputs that never change a route (a send, a forward from another
    /// region), which are most of them and must not cost a walk over every shard.
    fn input_then(
        self: &Arc<Self>,
        f: impl FnOnce(&mut RegionEngine<Envelope<E>>, u64),
        refresh_routes: bool,
    ) -> Option<Error> {
        let input = |st: &mut State<E>, now| {
            st.refused = None;
            st.fed_back = false;
            st.may_reroute = refresh_routes;
            f(&mut st.engine, now)
        };
        self.driver.input(self, input).and_then(|((), refused)| refused)
    }

    /// Makes `routes` agree with the engine; called with the engine's lock held.
    fn refresh_routes(&self, st: &mut State<E>) {
        let State { engine, hosts, routed, .. } = st;
        for ((i, slot), routed) in self.routes.iter().enumerate().zip(routed.iter_mut()) {
            let shard = ShardId(i as u32);
            let epoch = engine.local_epoch(shard);
            if epoch == *routed {
                continue;
            }
            // A shard's host changes only with its epoch (a new one is started at a newer one).
            let host = epoch.and_then(|e| hosts.get(&shard).filter(|h| h.epoch() == e).cloned());
            *routed = host.as_ref().and(epoch);
            *slot.write().unwrap_or_else(|e| e.into_inner()) = host;
        }
    }

    fn carry_out_command(self: &Arc<Self>, st: &mut State<E>, cmd: RegionCommand<Envelope<E>>, now: u64) {
        match cmd {
            RegionCommand::Deliver { shard, epoch, msg } => match st.hosts.get(&shard) {
                Some(h) if h.epoch() == epoch => h.deliver(msg),
                // The engine delivers only at the epoch it hosts the shard at, which it
                // announced (StartShard, RaiseEpoch): anything else is a bug, refused.
                Some(h) => {
                    warn!(type_key = %self.type_key, %shard, %epoch, hosted = %h.epoch(), "delivery at another epoch than the hosted one: refused");
                    refuse(self.node.transport(), msg.body, Refusal::NotHostedAt(shard, epoch))
                }
                None => refuse(self.node.transport(), msg.body, Refusal::NotStarted(shard)),
            },
            RegionCommand::SendToRegion { to, msg } => {
                let Some(wire) = self.to_wire(msg) else { return };
                let frame = PeerMessage::Region { type_key: self.type_key.clone(), msg: wire };
                let (why, frame) = match self.node.transport().send(&to, frame) {
                    Ok(()) => return,
                    Err(SendError::Full(f)) => {
                        metrics::counter!("shardline_region_send_queue_full_total").increment(1);
                        (SendFailure::QueueFull, *f)
                    }
                    Err(e) => (SendFailure::NoConnection, e.into_frame()),
                };
                if let PeerMessage::Region { msg, .. } = frame {
                    // Told at once, before the next command: what the engine takes back
                    // may take queued commands back with it.
                    st.fed_back = true;
                    st.engine.handle_send_failed(now, &to, from_wire(msg, None), why);
                }
            }
            RegionCommand::SendToRegionWhenReady { to, msg } => {
                if let Some(wire) = self.to_wire(msg) {
                    let frame = PeerMessage::Region { type_key: self.type_key.clone(), msg: wire };
                    self.node.transport().send_when_ready(&to, frame);
                }
            }
            RegionCommand::SendToCoordinator { to, msg } => {
                let _ = self
                    .node
                    .transport()
                    .send(&to, PeerMessage::ToCoordinator { type_key: self.type_key.clone(), msg });
            }
            RegionCommand::StartShard { shard, epoch, handover } => {
                let claim = self
                    .settings
                    .journal
                    .as_ref()
                    .map(|j| ShardClaim::new(j.0.clone(), &self.settings.type_key, shard));
                let host = ShardHost::new(shard, epoch, self.env.clone(), claim, self.budget.clone());
                if let Some(budget) = &self.budget {
                    budget.hosting(&host);
                }
                let restored = handover.map(|d| host.restore(&d)).unwrap_or(0);
                host.start_reminders();
                debug!(type_key = %self.type_key, %shard, %epoch, restored, "shard started");
                self.node.ownership_log(&self.type_key, shard, epoch, true);
                st.hosts.insert(shard, host);
            }
            RegionCommand::RaiseEpoch { shard, from, to } => {
                if let Some(h) = st.hosts.get(&shard) {
                    h.raise_epoch(to);
                }
                // Not an ownership change: the ownership log keeps its one interval.
                debug!(type_key = %self.type_key, %shard, %from, %to, "shard stays here at a newer epoch");
            }
            RegionCommand::StopShard { shard, epoch, fenced } => {
                let host = st.hosts.remove(&shard);
                if let Some(budget) = &self.budget {
                    budget.stopped(shard);
                }
                if fenced {
                    if let Some(h) = host {
                        h.kill();
                    }
                    let t = self.settings.type_key.clone();
                    metrics::counter!("shardline_shards_fenced_total", "type" => t).increment(1);
                    self.node.ownership_log(&self.type_key, shard, epoch, false);
                    warn!(type_key = %self.type_key, %shard, "shard stopped at once (fenced)");
                } else {
                    let me = self.clone();
                    tokio::spawn(async move {
                        let began = Instant::now();
                        let handover = match host {
                            Some(h) => h.stop().await,
                            None => None,
                        };
                        // This node's part of a hand-off: its entities finished their
                        // messages and stopped, their state is ready to go.
                        let t = me.settings.type_key.clone();
                        metrics::counter!("shardline_shard_stops_total", "type" => t.clone()).increment(1);
                        metrics::histogram!("shardline_shard_stop_seconds", "type" => t)
                            .record(began.elapsed().as_secs_f64());
                        me.node.ownership_log(&me.type_key, shard, epoch, false);
                        debug!(type_key = %me.type_key, %shard, "shard stopped");
                        me.input(|e, now| e.handle_shard_stopped(now, shard, handover));
                    });
                }
            }
            RegionCommand::SweepLingering => {
                // Off the region's lock: each host's sweep takes its own lock and touches every
                // running entity, and sends to this region must not wait for that.
                let hosts: Vec<Arc<ShardHost<E>>> = st.hosts.values().cloned().collect();
                tokio::spawn(async move {
                    for h in hosts {
                        h.nudge_active();
                    }
                });
            }
            RegionCommand::PassivateIdle { after_ms } => {
                // One sweep at a time: the stop hooks of a long one may outlast the interval.
                if self.passivating.swap(true, Ordering::AcqRel) {
                    return;
                }
                let hosts: Vec<Arc<ShardHost<E>>> = st.hosts.values().cloned().collect();
                let me = self.clone();
                tokio::spawn(async move {
                    let mut n = 0;
                    for h in hosts {
                        n += h.passivate_idle(Duration::from_millis(after_ms)).await;
                    }
                    if n > 0 {
                        debug!(type_key = %me.type_key, passivated = n, "idle entities stopped");
                    }
                    me.passivating.store(false, Ordering::Release);
                });
            }
            RegionCommand::ClaimShard { shard, epoch } => self.claim_shard(st, shard, epoch),
            RegionCommand::ReadRemembered { shard, epoch } => self.read_remembered(st, shard, epoch),
            RegionCommand::WakeEntity { shard, epoch, id } => self.wake_entity(st, shard, epoch, id, now),
            RegionCommand::Reject { msg, reason, .. } => {
                // A `tell` has no reply to carry the refusal: its caller gets it (`send_in`).
                if matches!(msg.body, Body::Typed { reply: None, .. }) {
                    st.refused = Some(Refusal::Region(reason, &self.type_key).error());
                }
                refuse(self.node.transport(), msg.body, Refusal::Region(reason, &self.type_key));
            }
        }
    }

    /// Converts an outgoing message to its wire form; a typed ask gets a request id.
    fn to_wire(&self, msg: RegionMessage<Envelope<E>>) -> Option<RegionMessage<WireEnvelope>> {
        let conv = |env: Envelope<E>| -> Option<WireEnvelope> {
            match env.body {
                Body::Wire { payload, reply, trace, .. } => {
                    // A hop: this node routes on a message it did not send.
                    if let Some(t) = &trace {
                        debug!(target: "shardline::trace", trace_id = %t.trace_hex(), parent_id = %t.span_hex(), node = %self.node.id(), entity_type = %self.type_key, entity = %env.entity, "routed on");
                    }
                    Some(WireEnvelope { entity: env.entity, payload, reply, trace: trace.map(|t| *t) })
                }
                Body::Typed { msg, reply, trace } => match postcard::to_allocvec(&msg) {
                    Ok(payload) => {
                        let reply = reply.map(|tx| ReplyAddr {
                            node: self.node.id().clone(),
                            req_id: self.node.pending().register(tx),
                        });
                        Some(WireEnvelope { entity: env.entity, payload, reply, trace: trace.map(|t| *t) })
                    }
                    Err(e) => {
                        if let Some(tx) = reply {
                            let _ = tx.send(Err(Refusal::Unencodable(e.to_string()).error()));
                        }
                        None
                    }
                },
                // Markers for local entity tasks never leave the node.
                Body::Retire | Body::Nudge | Body::Wake { .. } | Body::Reminder(_) => None,
            }
        };
        Some(match msg {
            RegionMessage::Forward { shard, epoch, seq, stream, position, msg } => {
                RegionMessage::Forward { shard, epoch, seq, stream, position, msg: conv(msg)? }
            }
            RegionMessage::Bounce { shard, seq, reason, msg } => {
                RegionMessage::Bounce { shard, seq, reason, msg: conv(msg)? }
            }
            RegionMessage::Flush { shard, token } => RegionMessage::Flush { shard, token },
            RegionMessage::FlushAck { shard, token } => RegionMessage::FlushAck { shard, token },
        })
    }

    /// The shard of entity `id`.
    pub fn shard_of(&self, id: &str) -> ShardId {
        self.settings.shard_of(id)
    }

    /// Sends a message from this node to entity `id` of `shard` (the `shard_of` of its id,
    /// which its reference hashed once).
    pub fn send_in(
        self: &Arc<Self>,
        shard: ShardId,
        id: &shardline_core::EntityId,
        mut body: Body<E>,
    ) -> Result<(), Error> {
        if let Some(slot) = self.routes.get(shard.index()) {
            // The read guard is held while delivering, so once a refresh has withdrawn the route
            // no delivery through it is still under way.
            let route = slot.read().unwrap_or_else(|e| e.into_inner());
            if let Some(host) = route.as_ref() {
                match host.try_deliver(id, body) {
                    Ok(()) => return Ok(()),
                    // The shard began stopping before the engine's route was withdrawn: the
                    // engine buffers it for the next owner.
                    Err(back) => body = back,
                }
            }
        }
        let env = Envelope { entity: id.clone(), body };
        match self.input_then(|e, now| e.handle_send(now, shard, env), false) {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        self.node.id()
    }

    pub fn default_ask_timeout(&self) -> Duration {
        self.settings.ask_timeout
    }

    /// Where asks through this region wait for their deadline.
    pub fn deadlines(&self) -> &Deadlines {
        self.node.deadlines()
    }
}

/// The internal form of a region message. `owe` makes the reply of an ask forwarded here from
/// another node owed until it is queued (see [`Body::Wire`]); a bounced ask, which goes on to
/// wherever its shard lives now, owes nothing here.
fn from_wire<E: Entity>(msg: RegionMessage<WireEnvelope>, owe: Option<&Node>) -> RegionMessage<Envelope<E>> {
    let conv = |w: WireEnvelope, owe: Option<&Node>| {
        let owed = owe.filter(|_| w.reply.is_some()).map(|n| n.transport().owe());
        Envelope {
            entity: w.entity,
            body: Body::Wire { payload: w.payload, reply: w.reply, owed, trace: w.trace.map(Box::new) },
        }
    };
    match msg {
        RegionMessage::Forward { shard, epoch, seq, stream, position, msg } => {
            RegionMessage::Forward { shard, epoch, seq, stream, position, msg: conv(msg, owe) }
        }
        RegionMessage::Bounce { shard, seq, reason, msg } => {
            RegionMessage::Bounce { shard, seq, reason, msg: conv(msg, None) }
        }
        RegionMessage::Flush { shard, token } => RegionMessage::Flush { shard, token },
        RegionMessage::FlushAck { shard, token } => RegionMessage::FlushAck { shard, token },
    }
}

impl<E: Entity> Carrier for Region<E> {
    type Engine = RegionEngine<Envelope<E>>;
    type State = State<E>;
    /// A `tell` the engine refused.
    type Settled = Option<Error>;

    fn shared(&self) -> &Shared<Self> {
        &self.driver
    }
    fn engine(state: &mut State<E>) -> Option<&mut Self::Engine> {
        Some(&mut state.engine)
    }
    fn now_ms(&self) -> u64 {
        self.now()
    }
    fn carry_out(self: &Arc<Self>, state: &mut State<E>, command: RegionCommand<Envelope<E>>, now: u64) {
        self.carry_out_command(state, command, now);
    }
    fn settle(self: &Arc<Self>, st: &mut State<E>, _now: u64) -> Option<Error> {
        // What a send's or a forward's failed commands feed back concerns shards routed
        // elsewhere; refreshed anyway rather than argued about.
        if st.may_reroute || st.fed_back {
            self.refresh_routes(st);
        }
        st.refused.take()
    }
}

impl<E: Entity> RegionDyn for Region<E> {
    fn on_region_frame(self: Arc<Self>, from: &NodeId, msg: RegionMessage<WireEnvelope>) {
        let refresh = !matches!(msg, RegionMessage::Forward { .. });
        let msg = from_wire(msg, Some(&self.node));
        self.input_then(|e, now| e.handle_region_message(now, from, msg), refresh);
    }
    fn on_coordinator_frame(self: Arc<Self>, from: &NodeId, msg: ToRegion) {
        self.input(|e, now| e.handle_coordinator_message(now, from, msg));
    }
    fn on_undeliverable(self: Arc<Self>, peer: &NodeId, msg: RegionMessage<WireEnvelope>) {
        self.input(|e, now| e.handle_undeliverable(now, peer, from_wire(msg, None)));
    }
    fn on_link_down(self: Arc<Self>, peer: &NodeId) {
        self.input(|e, now| e.handle_link_down(now, peer));
    }
    fn on_coordinator_changed(self: Arc<Self>, node: NodeId, term: Term) {
        self.input(|e, now| e.handle_coordinator_changed(now, node, term));
    }
    fn on_fenced(self: Arc<Self>) {
        self.input(|e, now| e.handle_fenced(now));
    }
    fn stop_all(self: Arc<Self>) {
        self.input(|e, now| e.handle_stop_all(now));
    }
    fn settings(&self) -> &EntitySettings {
        &self.settings
    }
    fn hosted(&self) -> Vec<(ShardId, Epoch)> {
        self.lock().engine.hosted()
    }
    fn flush_all(self: Arc<Self>) {
        self.input(|e, now| e.flush_all(now));
    }
    fn is_settled(&self) -> bool {
        self.lock().engine.is_settled()
    }
    fn on_left(self: Arc<Self>) {
        self.input(|e, now| e.handle_left(now));
    }
    fn homes(&self) -> Vec<Option<NodeId>> {
        let st = self.lock();
        (0..self.settings.shards).map(|s| st.engine.home(ShardId(s)).map(|h| h.owner.clone())).collect()
    }
    fn entity_count(&self) -> usize {
        self.lock().hosts.values().map(|h| h.len()).sum()
    }
    fn active_count(&self) -> usize {
        self.lock().hosts.values().map(|h| h.active_len()).sum()
    }
    fn hosting(&self) -> Hosting {
        let st = self.lock();
        Hosting {
            type_key: self.settings.type_key.clone(),
            shards: st.hosts.len(),
            entities: st.hosts.values().map(|h| h.len()).sum(),
            active_entities: st.hosts.values().map(|h| h.active_len()).sum(),
            buffered: st.engine.buffered(),
        }
    }
}
