//! Entities of one hosted shard: idle ones are state in a map; active ones have a task and a
//! bounded mailbox, and go back to the map when their mailbox stays empty.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use shardline_core::{EntityId, Epoch, ShardId};
use tokio::sync::{mpsc, Notify};
use tokio::task::AbortHandle;
use tracing::debug;

use super::claim::ShardClaim;
use super::entity::{Entity, EntityContext};
use super::settings::Persistence;
use crate::error::Error;
use crate::sharding::envelope::{Body, Envelope, ReplyAddr, ReplySender};
use crate::sharding::message::send_reply;
use crate::sharding::node::Node;

/// How often a region nudges its active entities (see [`ShardHost::nudge_active`]): an entity
/// task stays between one and two of these after its last message before its state goes back
/// to the map.
pub(crate) const LINGER: Duration = Duration::from_millis(50);

/// How many entity tasks of one shard may linger (stay a task after their mailbox empties, so
/// that their next message needs no new task). Past it, an entity whose mailbox is empty goes
/// back to the map at once. Lingering only pays for entities that get messages often; under a
/// burst of fresh entities, tasks waiting for a nudge that a busy runtime serves late (a sweep's
/// thousands of wakes spill into the runtime's global queue) would pile up at about 3.6 KB each:
/// a million new entities once held 3.6 GB at their peak, for about 150 MB once idle.
pub(crate) const MAX_LINGERING: usize = 32;

enum Slot<E: Entity> {
    Idle {
        state: E,
        since: u32,
    },
    /// `nudged`: a marker from [`ShardHost::nudge_active`] is in the mailbox (at most one is).
    Active {
        /// The mailbox carries bodies: the task knows whose they are, so a send need not clone
        /// the id (a count that the caller's core and the entity's core would both touch).
        tx: mpsc::Sender<Body<E>>,
        abort: AbortHandle,
        nudged: bool,
    },
}

/// What entity tasks need from their region.
pub(crate) struct HostEnv {
    pub node: Node,
    pub mailbox: usize,
    pub started: Instant,
    pub type_key: Arc<str>,
    pub persistence: Persistence,
}

impl HostEnv {
    fn secs(&self) -> u32 {
        self.started.elapsed().as_secs() as u32
    }
}

/// The slots, and which of them are active (so sweeps touch only those).
struct Entities<E: Entity> {
    map: HashMap<EntityId, Slot<E>>,
    active: HashSet<EntityId>,
}

impl<E: Entity> std::ops::Deref for Entities<E> {
    type Target = HashMap<EntityId, Slot<E>>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<E: Entity> std::ops::DerefMut for Entities<E> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

impl<E: Entity> Entities<E> {
    /// Puts an entity's state back as idle.
    fn idle(&mut self, id: EntityId, state: E, since: u32) {
        self.active.remove(&id);
        self.map.insert(id, Slot::Idle { state, since });
    }

    /// The task of `id` took its nudge out of the mailbox: it may get the next one.
    fn nudge_taken(&mut self, id: &EntityId) {
        if let Some(Slot::Active { nudged, .. }) = self.map.get_mut(id) {
            *nudged = false;
        }
    }

    /// Forgets an entity.
    fn forget(&mut self, id: &EntityId) {
        self.active.remove(id);
        self.map.remove(id);
    }
}

pub(crate) struct ShardHost<E: Entity> {
    pub shard: ShardId,
    /// The epoch this node hosts the shard at: raised in place when a newer coordinator
    /// allocates the shard here again, read by every message's context.
    epoch: Mutex<Epoch>,
    /// How many times `epoch` was raised: entity tasks compare it with the count they last saw
    /// instead of taking the epoch's lock for every message.
    raises: AtomicU64,
    env: Arc<HostEnv>,
    entities: Mutex<Entities<E>>,
    stopping: AtomicBool,
    active: AtomicUsize,
    drained: Notify,
    /// State handed over by entities stopped for a hand-off.
    handed: Mutex<Vec<(String, Vec<u8>)>>,
    /// The shard's fence in the type's journal, if it has one.
    claim: Option<Arc<ShardClaim>>,
}

impl<E: Entity> ShardHost<E> {
    pub fn new(shard: ShardId, epoch: Epoch, env: Arc<HostEnv>, claim: Option<Arc<ShardClaim>>) -> Arc<Self> {
        Arc::new(ShardHost {
            shard,
            epoch: Mutex::new(epoch),
            raises: AtomicU64::new(0),
            env,
            entities: Mutex::new(Entities { map: HashMap::new(), active: HashSet::new() }),
            stopping: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            drained: Notify::new(),
            handed: Mutex::new(Vec::new()),
            claim,
        })
    }

    /// Restores entities from the state the previous owner handed over.
    pub fn restore(&self, data: &[u8]) -> usize {
        let list = match decode_handover(data) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(shard = %self.shard, error = %e, "handed-over state cannot be decoded: entities start fresh");
                return 0;
            }
        };
        let now = self.env.secs();
        let mut map = self.lock();
        let mut n = 0;
        for (id, bytes) in list {
            let id = EntityId::new(id);
            if let Some(state) = E::take_over(&id, &bytes) {
                map.insert(id, Slot::Idle { state, since: now });
                n += 1;
            }
        }
        n
    }

    fn hand_over(&self, id: &EntityId, state: &E) {
        if let Some(bytes) = state.hand_over() {
            self.handed.lock().unwrap_or_else(|e| e.into_inner()).push((id.as_str().to_string(), bytes));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entities<E>> {
        self.entities.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of entities (idle and active).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Number of entities with a running task.
    pub fn active_len(&self) -> usize {
        self.lock().active.len()
    }

    /// The epoch this node hosts the shard at.
    pub fn epoch(&self) -> Epoch {
        *self.epoch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shard stays here at a newer epoch (never lowered).
    pub fn raise_epoch(&self, to: Epoch) {
        let mut e = self.epoch.lock().unwrap_or_else(|e| e.into_inner());
        if to > *e {
            *e = to;
            self.raises.fetch_add(1, Ordering::Release);
        }
    }

    /// Sends every active entity the marker that lets it go idle if no message came since the
    /// last one. One sweep per region every [`LINGER`] instead of a timer per entity task: a
    /// timer polled on every wake-up cost a busy entity more than the sweep costs an idle one.
    /// Only an empty mailbox gets one, and only while none is in it: the marker never takes a
    /// place a message could have had (mailboxes have one place more than the settings say,
    /// which only a marker may take), and never piles up behind a slow handler.
    pub fn nudge_active(&self) {
        let mut guard = self.lock();
        let Entities { map, active } = &mut *guard;
        for id in active.iter() {
            if let Some(Slot::Active { tx, nudged: nudged @ false, .. }) = map.get_mut(id) {
                if tx.capacity() == tx.max_capacity() && tx.try_send(Body::Nudge).is_ok() {
                    *nudged = true;
                }
            }
        }
    }

    /// Starts a remembered entity that is not running or in memory yet; false when the shard is
    /// stopping (no more wakes).
    pub fn wake(self: &Arc<Self>, id: EntityId) -> bool {
        if self.stopping.load(Ordering::Acquire) {
            return false;
        }
        if !self.lock().contains_key(&id) {
            self.deliver(Envelope { entity: id, body: Body::Wake });
        }
        true
    }

    /// Hands a message to its entity, starting it if needed. Never blocks.
    pub fn deliver(self: &Arc<Self>, env: Envelope<E>) {
        let mut map = self.lock();
        self.deliver_locked(&mut map, &env.entity, env.body);
    }

    /// Like `deliver`, but gives the message back once the shard is stopping, whose entities
    /// may already have handed their state over. For senders that route without the region's
    /// engine, which then buffers the message for the shard's next owner.
    pub fn try_deliver(self: &Arc<Self>, id: &EntityId, body: Body<E>) -> Result<(), Body<E>> {
        let mut map = self.lock();
        // `stop` and `kill` set the flag before they take the map lock: seen here, or every
        // entity this delivery starts is one they stop.
        if self.stopping.load(Ordering::Acquire) {
            return Err(body);
        }
        self.deliver_locked(&mut map, id, body);
        Ok(())
    }

    fn deliver_locked(self: &Arc<Self>, map: &mut Entities<E>, id: &EntityId, body: Body<E>) {
        if let Some(Slot::Active { tx, nudged, .. }) = map.get(id) {
            // The last place is a marker's (see `nudge_active`) until the marker is in.
            let full = !*nudged && tx.capacity() <= 1;
            match if full { Err(mpsc::error::TrySendError::Full(body)) } else { tx.try_send(body) } {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(body)) => {
                    let err = Error::Overloaded(format!("mailbox of {id} is full"));
                    fail(&self.env.node, body, err)
                }
                Err(mpsc::error::TrySendError::Closed(body)) => {
                    let err = Error::Unavailable(format!("{id} is stopping"));
                    fail(&self.env.node, body, err)
                }
            }
            return;
        }
        let (state, fresh) = match map.remove(id) {
            Some(Slot::Idle { state, .. }) => (state, false),
            _ => (E::new(id), true),
        };
        let id = id.clone();
        let (tx, rx) = mpsc::channel(self.env.mailbox + 1);
        self.active.fetch_add(1, Ordering::AcqRel);
        let task = tokio::spawn(run(self.clone(), id.clone(), state, fresh, rx, body));
        map.active.insert(id.clone());
        map.insert(id, Slot::Active { tx, abort: task.abort_handle(), nudged: false });
    }

    /// Stops every entity after it finishes the messages it has: stop hooks run. Returns the
    /// state they hand over, encoded, if any.
    pub async fn stop(self: Arc<Self>) -> Option<Vec<u8>> {
        self.stopping.store(true, Ordering::Release);
        // Every active entity finishes its mailbox, then meets this marker and stops.
        let active: Vec<mpsc::Sender<Body<E>>> = self
            .lock()
            .values()
            .filter_map(|s| match s {
                Slot::Active { tx, .. } => Some(tx.clone()),
                Slot::Idle { .. } => None,
            })
            .collect();
        for tx in active {
            let _ = tx.send(Body::Retire).await;
        }
        let idle: Vec<(EntityId, E)> = {
            let mut map = self.lock();
            let ids: Vec<EntityId> =
                map.iter().filter(|(_, s)| matches!(s, Slot::Idle { .. })).map(|(k, _)| k.clone()).collect();
            ids.into_iter()
                .filter_map(|k| match map.remove(&k) {
                    Some(Slot::Idle { state, .. }) => Some((k, state)),
                    _ => None,
                })
                .collect()
        };
        for (id, mut state) in idle {
            let mut ctx = self.context(id.clone());
            state.stopped(&mut ctx).await;
            self.hand_over(&id, &state);
        }
        loop {
            let drained = self.drained.notified();
            if self.active.load(Ordering::Acquire) == 0 {
                break;
            }
            drained.await;
        }
        let handed = std::mem::take(&mut *self.handed.lock().unwrap_or_else(|e| e.into_inner()));
        if handed.is_empty() {
            return None;
        }
        postcard::to_allocvec(&handed).ok()
    }

    /// Stops at once: tasks are aborted, no hooks run (the node lost its right to the shard).
    pub fn kill(&self) {
        self.stopping.store(true, Ordering::Release);
        let slots: Vec<Slot<E>> = {
            let mut map = self.lock();
            map.active.clear();
            map.drain().map(|(_, slot)| slot).collect()
        };
        // Aborted tasks clean up after themselves (`TaskGuard`), which takes the map lock.
        for slot in slots {
            if let Slot::Active { abort, .. } = slot {
                abort.abort();
            }
        }
    }

    /// Stops entities idle for longer than `after`; returns how many.
    pub async fn passivate_idle(&self, after: Duration) -> usize {
        let now = self.env.secs();
        let limit = after.as_secs() as u32;
        let expired: Vec<(EntityId, E)> = {
            let mut map = self.lock();
            let ids: Vec<EntityId> = map
                .iter()
                .filter(|(_, s)| matches!(s, Slot::Idle { since, .. } if now.saturating_sub(*since) >= limit))
                .map(|(k, _)| k.clone())
                .collect();
            ids.into_iter()
                .filter_map(|k| match map.remove(&k) {
                    Some(Slot::Idle { state, .. }) => Some((k, state)),
                    _ => None,
                })
                .collect()
        };
        let n = expired.len();
        for (id, mut state) in expired {
            let mut ctx = self.context(id);
            state.stopped(&mut ctx).await;
        }
        n
    }

    fn context(&self, id: EntityId) -> EntityContext {
        EntityContext {
            id,
            shard: self.shard,
            epoch: self.epoch(),
            passivate: false,
            node: self.env.node.clone(),
            type_key: self.env.type_key.clone(),
            claim: self.claim.clone(),
            persistence: self.env.persistence,
        }
    }

    fn finish(&self) {
        if self.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.drained.notify_waiters();
        }
    }
}

/// Tells the sender its message failed.
pub(crate) fn fail<E: Entity>(node: &Node, body: Body<E>, err: Error) {
    match body {
        Body::Typed { reply: Some(tx), .. } => {
            let _ = tx.send(Err(err));
        }
        Body::Wire { reply: Some(addr), .. } => {
            send_reply(node.transport(), &addr.node, addr.req_id, Err(err));
        }
        _ => {}
    }
}

/// Where the reply to the message being handled goes. Held by the task's guard while the handler
/// runs, so that if it panics the asker hears so only after the slot is forgotten: a retry then
/// starts a fresh instance instead of landing in the dying one's mailbox.
enum InFlight<E: Entity> {
    Local(ReplySender<E>),
    Remote(ReplyAddr),
}

impl<E: Entity> InFlight<E> {
    fn fail(self, node: &Node, err: Error) {
        match self {
            InFlight::Local(tx) => {
                let _ = tx.send(Err(err));
            }
            InFlight::Remote(addr) => {
                send_reply(node.transport(), &addr.node, addr.req_id, Err(err));
            }
        }
    }
}

/// How long a message waits for its node's lease to be granted before it is refused: a probe
/// round and a bit (a node that just joined is answered within one).
const HOLD_FOR_MAJORITY: Duration = Duration::from_secs(3);

async fn process<E: Entity>(
    node: &Node,
    state: &mut E,
    ctx: &mut EntityContext,
    body: Body<E>,
    in_flight: &mut Option<InFlight<E>>,
) {
    // Held a moment while the lease is not granted yet (gossip's waits for a majority's answers
    // after joining); refused once it has waited, or at once when a lease ran out.
    if !node.may_host_within(HOLD_FOR_MAJORITY).await {
        // Not processed, so the sender may safely try again where the shard lives now.
        let err = Error::Rejected(format!(
            "{} may not host now: its lease ran out, or no majority of the cluster answered it",
            node.id()
        ));
        fail(node, body, err);
        return;
    }
    match body {
        Body::Typed { msg, reply } => {
            *in_flight = reply.map(InFlight::Local);
            let r = state.handle(ctx, msg).await;
            if let Some(InFlight::Local(tx)) = in_flight.take() {
                let _ = tx.send(Ok(r));
            }
        }
        Body::Wire { payload, reply, owed } => {
            // Owed until the reply is queued, at the end of this arm.
            let _owed = owed;
            *in_flight = reply.map(InFlight::Remote);
            let result = match postcard::from_bytes::<E::Message>(&payload) {
                Ok(msg) => {
                    let r = state.handle(ctx, msg).await;
                    postcard::to_allocvec(&r).map_err(|e| Error::ReplyLost(format!("cannot encode the reply: {e}")))
                }
                Err(e) => Err(Error::Rejected(format!("cannot decode message for {}: {e}", ctx.id))),
            };
            if let Some(InFlight::Remote(addr)) = in_flight.take() {
                send_reply(node.transport(), &addr.node, addr.req_id, result);
            }
        }
        Body::Retire | Body::Nudge | Body::Wake => {}
    }
}

/// Cleans up after an entity task that ended abnormally: its handler panicked, or the task was
/// aborted because the node was fenced. The slot is forgotten (the next message starts a fresh
/// instance) and the messages still in the mailbox fail as not processed; without this, a
/// panicking entity would refuse every later message and hold up its shard's hand-off forever.
struct TaskGuard<E: Entity> {
    host: Arc<ShardHost<E>>,
    id: EntityId,
    rx: mpsc::Receiver<Body<E>>,
    in_flight: Option<InFlight<E>>,
    done: bool,
}

impl<E: Entity> Drop for TaskGuard<E> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let panicked = std::thread::panicking();
        if panicked {
            tracing::error!(entity = %self.id, shard = %self.host.shard, "entity panicked: its state is dropped, the next message starts it afresh");
        }
        self.host.lock().forget(&self.id);
        self.rx.close();
        while let Ok(body) = self.rx.try_recv() {
            let err = Error::Unavailable(format!("{} stopped before handling the message", self.id));
            fail(&self.host.env.node, body, err);
        }
        if let Some(reply) = self.in_flight.take() {
            let how = if panicked { "panicked" } else { "was stopped" };
            let err = Error::OutcomeUnknown(format!("{} {how} while handling the message", self.id));
            reply.fail(&self.host.env.node, err);
        }
        self.host.finish();
    }
}

enum After<E: Entity> {
    Busy(E),
    Next(Body<E>, E),
    Stop(E),
    Idle,
}

async fn run<E: Entity>(
    host: Arc<ShardHost<E>>,
    id: EntityId,
    mut state: E,
    fresh: bool,
    rx: mpsc::Receiver<Body<E>>,
    first: Body<E>,
) {
    let mut guard = TaskGuard { host: host.clone(), id: id.clone(), rx, in_flight: None, done: false };
    let node = host.env.node.clone();
    // Read before the context takes the epoch, so that no raise in between goes unseen.
    let mut raises = host.raises.load(Ordering::Acquire);
    let mut ctx = host.context(id.clone());
    if fresh {
        state.started(&mut ctx).await;
    }
    // Whether a message came since the last nudge (`ShardHost::nudge_active`).
    let mut busy = false;
    let mut next = Some(first);
    loop {
        let body = match next.take() {
            Some(b) => b,
            // The senders live in the map slot, which outlives this task.
            None => guard.rx.recv().await.unwrap_or(Body::Retire),
        };
        if matches!(body, Body::Retire | Body::Nudge) {
            let nudge = matches!(body, Body::Nudge);
            // Decide under the map lock, where nothing new can arrive: go on, stop, or become
            // idle state in the map again.
            let after = {
                let mut map = host.lock();
                let stopping = host.stopping.load(Ordering::Acquire);
                if nudge {
                    map.nudge_taken(&id);
                }
                if nudge && busy && !stopping {
                    After::Busy(state)
                } else {
                    match guard.rx.try_recv() {
                        Ok(e) => After::Next(e, state),
                        Err(_) if stopping => {
                            map.forget(&id);
                            After::Stop(state)
                        }
                        Err(_) => {
                            map.idle(id.clone(), state, host.env.secs());
                            After::Idle
                        }
                    }
                }
            };
            match after {
                After::Busy(s) => {
                    // A message came since the last nudge: wait for the next one.
                    state = s;
                    busy = false;
                    continue;
                }
                After::Next(e, s) => {
                    state = s;
                    next = Some(e);
                    continue;
                }
                After::Stop(mut s) => {
                    s.stopped(&mut ctx).await;
                    host.hand_over(&id, &s);
                    guard.done = true;
                    host.finish();
                    return;
                }
                After::Idle => {
                    guard.done = true;
                    host.finish();
                    return;
                }
            }
        }
        busy = true;
        // The epoch as of now: it may have been raised since the task started.
        let now = host.raises.load(Ordering::Acquire);
        if now != raises {
            raises = now;
            ctx.epoch = host.epoch();
        }
        process(&node, &mut state, &mut ctx, body, &mut guard.in_flight).await;
        if host.active.load(Ordering::Relaxed) > MAX_LINGERING && guard.rx.is_empty() && !ctx.passivate {
            // Too many tasks linger in this shard: back to the map now if nothing waits (what
            // the shard's stop marker does, decided under the map lock).
            next = Some(Body::Retire);
        }
        if ctx.passivate {
            ctx.passivate = false;
            // The slot stays active while the stop hook runs, so new messages wait in the
            // mailbox instead of starting a second instance.
            state.stopped(&mut ctx).await;
            let pending = {
                let mut map = host.lock();
                loop {
                    match guard.rx.try_recv() {
                        Ok(Body::Nudge) => map.nudge_taken(&id),
                        // The shard's stop marker, which comes after every message its shard
                        // let in: this instance has stopped, and the stop waits for nothing else.
                        Ok(Body::Retire) => {
                            map.forget(&id);
                            break None;
                        }
                        Ok(e) => break Some(e),
                        Err(_) => {
                            map.forget(&id);
                            break None;
                        }
                    }
                }
            };
            match pending {
                None => {
                    debug!(entity = %id, "passivated");
                    guard.done = true;
                    host.finish();
                    return;
                }
                Some(e) => {
                    // Messages arrived meanwhile: start again with a fresh instance.
                    state = E::new(&id);
                    state.started(&mut ctx).await;
                    next = Some(e);
                }
            }
        }
    }
}

/// The entities' state one owner hands the next: (entity id, its encoded state) each.
pub(crate) fn decode_handover(data: &[u8]) -> Result<Vec<(String, Vec<u8>)>, postcard::Error> {
    postcard::from_bytes(data)
}
