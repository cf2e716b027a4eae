//! The driver of one hosted shard: the core's [`HostEngine`] behind a mutex, a task and a
//! bounded mailbox per running entity ([`task`]), and the entity's hooks. Every decision (start,
//! stay, go idle, stop, hand over, how long to wait for the lease) is the engine's; this module
//! carries the mailboxes and runs [`Entity::handle`].

mod budget;
mod reminders;
mod task;

pub(crate) use budget::Budget;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardline_core::host::{decode_handover, Delivery, HostConfig, HostEngine, Mailbox as EngineMailbox, WakeDecision};
use shardline_core::{EntityId, Epoch, ShardId};
use tokio::sync::{mpsc, Notify};
use tokio::task::AbortHandle;

use super::claim::ShardClaim;
use super::entity::{Entity, EntityContext, Registry};
use super::refusal::{refuse, Refusal};
use super::reminder::ShardReminders;
use super::settings::Persistence;
use crate::sharding::envelope::{Body, Envelope, Woken};
use crate::sharding::node::Node;

/// A running entity's mailbox, as the engine holds it. The mailbox carries bodies: the task
/// knows whose they are, so a send need not clone the id (a count that the caller's core and the
/// entity's core would both touch).
pub(crate) struct Mailbox<E: Entity> {
    tx: mpsc::Sender<Body<E>>,
    /// Set right after the task is spawned, under the same lock.
    abort: Option<AbortHandle>,
}

impl<E: Entity> EngineMailbox for Mailbox<E> {
    fn free(&self) -> usize {
        self.tx.capacity()
    }
}

/// What entity tasks need from their region.
pub(crate) struct HostEnv {
    pub node: Node,
    /// The node's registered types, as its entities reach them.
    pub registry: Arc<dyn Registry>,
    pub mailbox: usize,
    pub type_key: Arc<str>,
    pub persistence: Persistence,
}

pub(crate) struct ShardHost<E: Entity> {
    pub shard: ShardId,
    /// How many times the epoch was raised: entity tasks compare it with the count they last saw
    /// instead of taking the engine's lock for every message.
    raises: AtomicU64,
    env: Arc<HostEnv>,
    /// The engine's config, read by each task without the lock.
    config: HostConfig,
    engine: Mutex<HostEngine<E, Mailbox<E>>>,
    /// Entity tasks running, read by each task after every message (`HostConfig::lingers`)
    /// without the lock.
    tasks: AtomicUsize,
    drained: Notify,
    /// The shard's fence in the type's journal, if it has one.
    claim: Option<Arc<ShardClaim>>,
    /// The node's budget of entities in memory for the type, if it has one.
    budget: Option<Arc<Budget<E>>>,
    /// The shard's reminders and their task, for a type that keeps them.
    reminders: Mutex<Option<(Arc<ShardReminders>, AbortHandle)>>,
}

impl<E: Entity> ShardHost<E> {
    pub fn new(
        shard: ShardId,
        epoch: Epoch,
        env: Arc<HostEnv>,
        claim: Option<Arc<ShardClaim>>,
        budget: Option<Arc<Budget<E>>>,
    ) -> Arc<Self> {
        let config = HostConfig::new(env.mailbox);
        Arc::new(ShardHost {
            shard,
            raises: AtomicU64::new(0),
            env,
            config,
            engine: Mutex::new(HostEngine::new(config, epoch)),
            tasks: AtomicUsize::new(0),
            drained: Notify::new(),
            claim,
            budget,
            reminders: Mutex::new(None),
        })
    }

    /// Starts reading and firing the shard's reminders, for a type that keeps them.
    pub fn start_reminders(self: &Arc<Self>) {
        let (Some(config), Some(claim)) = (self.env.persistence.reminders, &self.claim) else { return };
        let started = reminders::start(self, claim.clone(), config);
        *self.reminders.lock().unwrap_or_else(|e| e.into_inner()) = Some(started);
    }

    fn stop_reminders(&self) {
        if let Some((_, task)) = self.reminders.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }

    fn shard_reminders(&self) -> Option<Arc<ShardReminders>> {
        self.reminders.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(r, _)| r.clone())
    }

    /// Restores entities from the state the previous owner handed over.
    pub fn restore(self: &Arc<Self>, data: &[u8]) -> usize {
        let list = match decode_handover(data) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(shard = %self.shard, error = %e, "handed-over state cannot be decoded: entities start fresh");
                return 0;
            }
        };
        let now = self.env.node.now_ms();
        let mut restored = Vec::new();
        {
            let mut engine = self.lock();
            for (id, bytes) in list {
                let id = EntityId::new(id);
                if let Some(state) = E::take_over(&id, &bytes) {
                    engine.restore(id.clone(), state, now);
                    restored.push(id);
                }
            }
        }
        if let Some(budget) = &self.budget {
            for id in &restored {
                budget.touch(self, id);
            }
        }
        restored.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HostEngine<E, Mailbox<E>>> {
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of entities (idle and active).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Number of entities with a running task.
    pub fn active_len(&self) -> usize {
        self.lock().active_len()
    }

    /// The epoch this node hosts the shard at.
    pub fn epoch(&self) -> Epoch {
        self.lock().epoch()
    }

    /// The shard stays here at a newer epoch (never lowered).
    pub fn raise_epoch(&self, to: Epoch) {
        if self.lock().raise_epoch(to) {
            self.raises.fetch_add(1, Ordering::Release);
        }
    }

    /// Sends the linger marker to the running entities the engine picks (once per [`LINGER_MS`](shardline_core::host::LINGER_MS)).
    pub fn nudge_active(&self) {
        self.lock().nudge(|m| m.tx.try_send(Body::Nudge).is_ok());
    }

    /// Starts a remembered entity that is not running or in memory yet: `woken` goes with it and
    /// is dropped once it has started. Gives `woken` back when there is nothing to start (the
    /// entity is in memory already, or the shard is stopping).
    pub fn wake(self: &Arc<Self>, id: EntityId, woken: Woken) -> Result<(), Woken> {
        if self.lock().wake(&id) != WakeDecision::Deliver {
            return Err(woken);
        }
        match self.try_deliver(&id, Body::Wake { woken }) {
            Err(Body::Wake { woken }) => Err(woken),
            // Delivered, or refused with its place (a full mailbox): dropped there.
            _ => Ok(()),
        }
    }

    /// The shard's fence in the journal, for a type that has one.
    pub fn claim(&self) -> Option<&Arc<ShardClaim>> {
        self.claim.as_ref()
    }

    /// Hands a message to its entity, starting it if needed. Never blocks. A shard that is
    /// stopping refuses it as not processed.
    pub fn deliver(self: &Arc<Self>, env: Envelope<E>) {
        if let Err(body) = self.try_deliver(&env.entity, env.body) {
            refuse(self.env.node.transport(), body, Refusal::ShardStopping(self.shard));
        }
    }

    /// Like `deliver`, but gives the message back once the shard is stopping, whose entities
    /// may already have handed their state over: the region's engine buffers it for the shard's
    /// next owner.
    pub fn try_deliver(self: &Arc<Self>, id: &EntityId, body: Body<E>) -> Result<(), Body<E>> {
        let mut engine = self.lock();
        let mut rx = None;
        let size = self.env.mailbox;
        let delivery = engine.deliver(
            id,
            body,
            |m, body| m.tx.try_send(body),
            || {
                // One place more than the settings say, which only a linger marker may take.
                let (tx, r) = mpsc::channel(size + 1);
                rx = Some(r);
                Mailbox { tx, abort: None }
            },
        );
        // The entity is in memory and in use: the budget counts it as the most recently used.
        let mut in_use = false;
        match delivery {
            Delivery::Put(Ok(())) => in_use = true,
            Delivery::Put(Err(mpsc::error::TrySendError::Full(body))) | Delivery::Full(body) => {
                refuse(self.env.node.transport(), body, Refusal::MailboxFull(id))
            }
            Delivery::Put(Err(mpsc::error::TrySendError::Closed(body))) => {
                refuse(self.env.node.transport(), body, Refusal::EntityStopping(id))
            }
            Delivery::Stopping(body) => return Err(body),
            Delivery::Spawn { state, mailbox, first } => {
                let Some(rx) = rx else {
                    // The engine made the mailbox with the closure above, which set `rx`.
                    refuse(self.env.node.transport(), first, Refusal::EntityStopping(id));
                    return Ok(());
                };
                let (state, fresh) = match state {
                    Some(s) => (s, false),
                    None => (E::new(id), true),
                };
                self.tasks.fetch_add(1, Ordering::AcqRel);
                let task = tokio::spawn(task::run(self.clone(), id.clone(), state, fresh, rx, first));
                mailbox.abort = Some(task.abort_handle());
                in_use = true;
            }
        }
        drop(engine);
        if let (true, Some(budget)) = (in_use, &self.budget) {
            budget.touch(self, id);
        }
        Ok(())
    }

    /// Stops every entity after it finishes the messages it has: stop hooks run. Returns the
    /// state they hand over, encoded, if any.
    pub async fn stop(self: Arc<Self>) -> Option<Vec<u8>> {
        // Reminders due from now on fire on the next owner, which reads them from the journal.
        self.stop_reminders();
        // Every running entity finishes its mailbox, then meets this marker and stops.
        let (markers, idle) = self.lock().stop(|m| m.tx.clone());
        for tx in markers {
            let _ = tx.send(Body::Retire).await;
        }
        for (id, mut state) in idle {
            let mut ctx = self.context(id.clone());
            state.stopped(&mut ctx).await;
            self.lock().handed(&id, state.hand_over());
        }
        loop {
            let drained = self.drained.notified();
            if self.tasks.load(Ordering::Acquire) == 0 {
                break;
            }
            drained.await;
        }
        self.lock().take_handover()
    }

    /// Stops at once: tasks are aborted, no hooks run (the node lost its right to the shard).
    pub fn kill(&self) {
        self.stop_reminders();
        let mailboxes = self.lock().kill();
        // Aborted tasks clean up after themselves (`TaskGuard`), which takes the lock.
        for m in mailboxes {
            if let Some(abort) = m.abort {
                abort.abort();
            }
        }
    }

    /// Stops entities idle for longer than `after`; returns how many.
    pub async fn passivate_idle(&self, after: Duration) -> usize {
        let expired = self.lock().passivate_idle(self.env.node.now_ms(), after.as_millis() as u64);
        let n = expired.len();
        for (id, mut state) in expired {
            self.forget_counted(&id);
            let mut ctx = self.context(id);
            state.stopped(&mut ctx).await;
        }
        n
    }

    /// The budget picked the idle entity `id`, already out of the map: its stop hook runs off
    /// the caller's path.
    fn stop_evicted(self: &Arc<Self>, id: EntityId, mut state: E) {
        let mut ctx = self.context(id);
        tokio::spawn(async move { state.stopped(&mut ctx).await });
    }

    /// `id` left memory other than through the budget: it no longer counts.
    fn forget_counted(&self, id: &EntityId) {
        if let Some(budget) = &self.budget {
            budget.forget(self.shard, id);
        }
    }

    fn context(&self, id: EntityId) -> EntityContext {
        EntityContext {
            id,
            shard: self.shard,
            epoch: self.epoch(),
            passivate: false,
            registry: self.env.registry.clone(),
            type_key: self.env.type_key.clone(),
            claim: self.claim.clone(),
            persistence: self.env.persistence,
            reminders: self.shard_reminders(),
            request: None,
        }
    }

    fn finish(&self) {
        if self.tasks.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.drained.notify_waiters();
        }
    }
}
