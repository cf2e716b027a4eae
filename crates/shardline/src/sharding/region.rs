//! The region driver for one entity type: the core's `RegionEngine` behind a mutex, its
//! commands carried out in order while the lock is held (none of them blocks), and one timer task.
//!
//! Messages for shards this node hosts skip the engine's lock: `routes` holds, per shard, the
//! host a send would be delivered to (`RegionEngine::local_epoch`), refreshed under the lock after
//! every input that can change it. Every caller on the node used to take that one lock per ask.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use shardline_core::{
    Epoch, NodeId, RegionCommand, RegionConfig, RegionEngine, RegionMessage, RejectReason, ShardId, Term, ToRegion,
    TypeKey,
};
use tracing::{debug, info, warn};

use super::claim::ShardClaim;
use super::deadlines::Deadlines;
use super::entity::Entity;
use super::envelope::{Body, Envelope, ReplyAddr, WireEnvelope};
use super::host::{fail, HostEnv, ShardHost, LINGER};
use super::settings::EntitySettings;
use crate::error::Error;
use crate::journal::JournalError;
use crate::sharding::message::PeerMessage;
use crate::sharding::node::Node;
use crate::sharding::wakeup::{self, Timed, Wakeup};
use crate::transport::SendError;

struct State<E: Entity> {
    engine: RegionEngine<Envelope<E>>,
    hosts: HashMap<ShardId, Arc<ShardHost<E>>>,
    /// A `tell` refused while the lock was held (reported to its caller).
    refused: Option<Error>,
    /// The epoch of the host in each shard's route, so that a refresh touches only the routes
    /// that change.
    routed: Vec<Option<Epoch>>,
    /// The input's own commands fed failures back into the engine (undeliverable, queue full).
    fed_back: bool,
}

/// The host a shard's messages go to without the engine, when there is one.
type LocalRoute<E> = RwLock<Option<Arc<ShardHost<E>>>>;

pub(crate) struct Region<E: Entity> {
    pub type_key: TypeKey,
    pub settings: EntitySettings,
    node: Node,
    env: Arc<HostEnv>,
    state: Mutex<State<E>>,
    /// Per shard, the host a message is delivered to without the engine (see the module docs).
    routes: Box<[LocalRoute<E>]>,
    wakeup: Wakeup,
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
    fn fail_buffered(&self, why: &str);
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
        rc.retry_initial_ms = 10;
        rc.retry_max_ms = 1_000;
        rc.register_retry_ms = 500;
        let me = node.id().clone();
        let shards = settings.shards;
        let env = Arc::new(HostEnv {
            node: node.clone(),
            mailbox: settings.mailbox,
            started: Instant::now(),
            type_key: Arc::from(settings.type_key.as_str()),
            persistence: settings.persistence,
        });
        let region = Arc::new(Region {
            type_key: TypeKey::new(&settings.type_key),
            settings,
            node,
            env,
            state: Mutex::new(State {
                engine: RegionEngine::new(rc, me),
                hosts: HashMap::new(),
                refused: None,
                routed: vec![None; shards as usize],
                fed_back: false,
            }),
            routes: (0..shards).map(|_| RwLock::new(None)).collect(),
            wakeup: Wakeup::default(),
        });
        tokio::spawn(wakeup::run(Arc::downgrade(&region)));
        tokio::spawn(linger(Arc::downgrade(&region)));
        if let Some(after) = region.settings.passivate_after {
            tokio::spawn(passivation(Arc::downgrade(&region), after));
        }
        region
    }

    fn now(&self) -> u64 {
        self.node.now_ms()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<E>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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
        let now = self.now();
        let mut st = self.lock();
        st.refused = None;
        st.fed_back = false;
        f(&mut st.engine, now);
        self.run_commands(&mut st, now);
        // What a send's or a forward's failed commands feed back concerns shards routed
        // elsewhere; refreshed anyway rather than argued about.
        if refresh_routes || st.fed_back {
            self.refresh_routes(&mut st);
        }
        self.wakeup.request(st.engine.poll_timeout());
        st.refused.take()
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

    fn run_commands(self: &Arc<Self>, st: &mut State<E>, now: u64) {
        loop {
            let mut returned = Vec::new();
            let mut jammed = Vec::new();
            let mut any = false;
            while let Some(cmd) = st.engine.poll_command() {
                any = true;
                match cmd {
                    RegionCommand::Deliver { shard, epoch, msg } => match st.hosts.get(&shard) {
                        Some(h) if h.epoch() == epoch => h.deliver(msg),
                        // The engine delivers only at the epoch it hosts the shard at, which it
                        // announced (StartShard, RaiseEpoch): anything else is a bug, refused.
                        Some(h) => {
                            warn!(type_key = %self.type_key, %shard, %epoch, hosted = %h.epoch(), "delivery at another epoch than the hosted one: refused");
                            fail(&self.node, msg.body, Error::Unavailable(format!("{shard} is not hosted at {epoch}")))
                        }
                        None => fail(&self.node, msg.body, Error::Unavailable(format!("{shard} is not started"))),
                    },
                    RegionCommand::SendToRegion { to, msg } => {
                        if let Some(wire) = self.to_wire(msg) {
                            // Behind a forward that found the queue full: wait with it.
                            if matches!(wire, RegionMessage::Forward { .. }) && jammed.iter().any(|(t, _)| *t == to) {
                                jammed.push((to, wire));
                                continue;
                            }
                            let frame = PeerMessage::Region { type_key: self.type_key.clone(), msg: wire };
                            match self.node.transport().send(&to, frame) {
                                Ok(()) => {}
                                Err(SendError::Full(f)) => match *f {
                                    // Back into the buffer at its place until the peer caught
                                    // up (see `handle_send_queue_full`): nothing lost, order
                                    // kept. The region's bounded buffer turns a lasting jam
                                    // into `Overloaded` for new senders.
                                    PeerMessage::Region { msg: msg @ RegionMessage::Forward { .. }, .. } => {
                                        metrics::counter!("shardline_region_send_queue_full_total").increment(1);
                                        jammed.push((to, msg));
                                    }
                                    // Drain markers, their answers and bounces must not be lost:
                                    // they wait for room.
                                    frame => self.node.transport().send_when_ready(&to, frame),
                                },
                                Err(e) => {
                                    if let PeerMessage::Region { msg, .. } = e.into_frame() {
                                        returned.push((to, msg));
                                    }
                                }
                            }
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
                        let host = ShardHost::new(shard, epoch, self.env.clone(), claim.clone());
                        if let Some(claim) = claim {
                            // Claimed at once (one raise), awaited by the first entity that uses
                            // the journal; remembered entities restart once it is claimed.
                            let remember = self.settings.persistence.remember;
                            let (me, host) = (self.clone(), host.clone());
                            tokio::spawn(async move {
                                if claim_and_restart(&me.node, host, claim, epoch, remember).await.is_err() {
                                    // The membership needs a moment to lead above the refused
                                    // term; one that cannot (leases on a store whose counter is
                                    // behind the journal) would otherwise have the shard stopped
                                    // and allocated again as fast as the round trips go.
                                    tokio::time::sleep(CLAIM_REFUSED_PAUSE).await;
                                    me.input(|e, now| e.handle_claim_refused(now, shard, epoch));
                                }
                            });
                        }
                        let restored = handover.map(|d| host.restore(&d)).unwrap_or(0);
                        info!(type_key = %self.type_key, %shard, %epoch, restored, "shard started");
                        self.node.ownership_log(&self.type_key, shard, epoch, true);
                        st.hosts.insert(shard, host);
                    }
                    RegionCommand::RaiseEpoch { shard, from, to } => {
                        if let Some(h) = st.hosts.get(&shard) {
                            h.raise_epoch(to);
                        }
                        // Not an ownership change: the ownership log keeps its one interval.
                        info!(type_key = %self.type_key, %shard, %from, %to, "shard stays here at a newer epoch");
                    }
                    RegionCommand::StopShard { shard, epoch, fenced } => {
                        let host = st.hosts.remove(&shard);
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
                    RegionCommand::Reject { msg, reason, .. } => {
                        let err = match reason {
                            RejectReason::Overloaded => {
                                Error::Overloaded(format!("{} region buffers are full", self.type_key))
                            }
                            RejectReason::Unavailable => {
                                Error::Unavailable("this node cannot route the message".into())
                            }
                        };
                        if matches!(msg.body, Body::Typed { reply: None, .. }) {
                            st.refused = Some(err.clone());
                        }
                        fail(&self.node, msg.body, err);
                    }
                }
            }
            if !any {
                break;
            }
            st.fed_back |= !returned.is_empty() || !jammed.is_empty();
            for (to, msg) in returned {
                st.engine.handle_undeliverable(now, &to, from_wire(msg, None));
            }
            for (to, msg) in jammed {
                st.engine.handle_send_queue_full(now, &to, from_wire(msg, None));
            }
        }
    }

    /// Converts an outgoing message to its wire form; a typed ask gets a request id.
    fn to_wire(&self, msg: RegionMessage<Envelope<E>>) -> Option<RegionMessage<WireEnvelope>> {
        let conv = |env: Envelope<E>| -> Option<WireEnvelope> {
            match env.body {
                Body::Wire { payload, reply, .. } => Some(WireEnvelope { entity: env.entity, payload, reply }),
                Body::Typed { msg, reply } => match postcard::to_allocvec(&msg) {
                    Ok(payload) => {
                        let reply = reply.map(|tx| ReplyAddr {
                            node: self.node.id().clone(),
                            req_id: self.node.pending().register(tx),
                        });
                        Some(WireEnvelope { entity: env.entity, payload, reply })
                    }
                    Err(e) => {
                        if let Some(tx) = reply {
                            let _ = tx.send(Err(Error::Rejected(format!("cannot encode message: {e}"))));
                        }
                        None
                    }
                },
                // Markers for local entity tasks never leave the node.
                Body::Retire | Body::Nudge | Body::Wake => None,
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

    pub fn ask_timeout(&self) -> Duration {
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
        Envelope { entity: w.entity, body: Body::Wire { payload: w.payload, reply: w.reply, owed } }
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

/// How long a shard whose claim the journal refused waits before it stops and is allocated
/// again (see `RegionEngine::handle_claim_refused`).
const CLAIM_REFUSED_PAUSE: Duration = Duration::from_secs(1);

/// Claims a started shard in the journal, then starts its remembered entities (when the type
/// remembers them), at most `per_second` per second; stops early when the shard stops. `Err`
/// when the journal refused the claim: a newer fence stands.
async fn claim_and_restart<E: Entity>(
    node: &Node,
    host: Arc<ShardHost<E>>,
    claim: Arc<ShardClaim>,
    epoch: Epoch,
    remember: Option<u32>,
) -> Result<(), Epoch> {
    if let Err(e) = claim.ensure(epoch).await {
        warn!(shard = %host.shard, %epoch, error = %e, "cannot claim the shard in the journal");
        if let JournalError::Fenced { stored: Some(stored), .. } = e {
            // The membership decides whether this term is one its cluster never reached.
            node.fenced_above(stored.term);
            return Err(stored);
        }
        return Ok(());
    }
    let Some(per_second) = remember else { return Ok(()) };
    let ids = match claim.journal().remembered(claim.type_key(), host.shard).await {
        Ok(ids) => ids,
        Err(e) => {
            warn!(shard = %host.shard, error = %e, "remembered entities cannot be read");
            return Ok(());
        }
    };
    let pause = Duration::from_secs(1) / per_second.max(1);
    let n = ids.len();
    for id in ids {
        if !host.wake(shardline_core::EntityId::new(id)) {
            return Ok(());
        }
        tokio::time::sleep(pause).await;
    }
    debug!(shard = %host.shard, restarted = n, "remembered entities restarted");
    Ok(())
}

impl<E: Entity> Timed for Region<E> {
    fn wakeup(&self) -> &Wakeup {
        &self.wakeup
    }
    fn now_ms(&self) -> u64 {
        self.now()
    }
    fn stopped(&self) -> bool {
        false
    }
    fn fire(self: &Arc<Self>) {
        self.input(|e, now| e.handle_timeout(now));
    }
}

/// Nudges the active entities of every hosted shard once per [`LINGER`], so that those that got
/// no message for a while go back to being state in their shard's map.
async fn linger<E: Entity>(region: std::sync::Weak<Region<E>>) {
    let mut tick = tokio::time::interval(LINGER);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(r) = region.upgrade() else { return };
        let hosts: Vec<Arc<ShardHost<E>>> = r.lock().hosts.values().cloned().collect();
        drop(r);
        for h in hosts {
            h.nudge_active();
        }
    }
}

async fn passivation<E: Entity>(region: std::sync::Weak<Region<E>>, after: Duration) {
    let every = (after / 2).max(Duration::from_millis(500));
    loop {
        tokio::time::sleep(every).await;
        let Some(r) = region.upgrade() else { return };
        let hosts: Vec<Arc<ShardHost<E>>> = r.lock().hosts.values().cloned().collect();
        let mut n = 0;
        for h in hosts {
            n += h.passivate_idle(after).await;
        }
        if n > 0 {
            debug!(type_key = %r.type_key, passivated = n, "idle entities stopped");
        }
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
    fn fail_buffered(&self, why: &str) {
        let taken = self.lock().engine.take_buffered();
        for (_, env) in taken {
            fail(&self.node, env.body, Error::Unavailable(why.to_string()));
        }
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
