//! The engine of one hosted shard's entity lifecycle; see the [module docs](super).

use std::collections::{HashMap, HashSet};

use crate::id::EntityId;
use crate::shard_map::Epoch;

use super::handover::{encode_handover, HandedOver};

/// How a host runs its entities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// Messages a running entity's mailbox holds for its handler. The mailbox has one place
    /// more, which only the linger marker may take: the marker never takes a message's place.
    pub mailbox: usize,
    /// How many entity tasks of one shard may linger (stay a task after their mailbox empties,
    /// so that their next message needs no new task). Past it, an entity whose mailbox is empty
    /// goes back to the map at once. Lingering only pays for entities that get messages often;
    /// under a burst of fresh entities, tasks waiting for a nudge that a busy runtime serves late
    /// would pile up: a million new entities once held 3.6 GB at their peak, for about 150 MB
    /// once idle.
    pub max_lingering: usize,
    /// How long a message waits for its node's lease to be granted before it is refused
    /// (default 3 s: a probe round and a bit; gossip grants a node that just joined once a
    /// majority has answered it, within one). A lease that ran out is not waited for.
    pub hold_unleased_ms: u64,
}

/// How often a runtime nudges the running entities of a hosted shard
/// ([`HostEngine::nudge`], asked for by the region's
/// [`SweepLingering`](crate::RegionCommand::SweepLingering)): an entity task stays between one
/// and two of these after its last message before its state goes back to the map.
pub const LINGER_MS: u64 = 50;

/// How often a message held for its node's lease looks at the lease again.
const UNLEASED_RECHECK_MS: u64 = 20;

/// What a message does when its node may not host at the moment it is to be processed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unleased {
    /// Wait, and ask again after `again_ms`: the node's lease was never granted, and it has not
    /// waited long yet. The lease says nothing when it is granted, so it is looked at again.
    Wait {
        /// When to ask again: soon, and never past the end of the hold.
        again_ms: u64,
    },
    /// Refuse it, as not processed: the lease ran out (a newer owner may exist), or it waited
    /// long enough.
    Refuse,
}

impl HostConfig {
    /// A config with the given mailbox size, 32 lingering tasks and a 3 s hold.
    pub fn new(mailbox: usize) -> Self {
        HostConfig { mailbox, max_lingering: 32, hold_unleased_ms: 3_000 }
    }

    /// What a message does when its node may not host: `granted`, whether the node's lease was
    /// ever granted; `held_ms`, how long the message has waited for it.
    ///
    /// ```
    /// use shardline_core::host::{HostConfig, Unleased};
    ///
    /// let config = HostConfig::new(16);
    /// assert_eq!(config.unleased(false, 100), Unleased::Wait { again_ms: 20 }, "just joined: wait for the grant");
    /// assert_eq!(config.unleased(false, 2_990), Unleased::Wait { again_ms: 10 }, "not past the hold");
    /// assert_eq!(config.unleased(false, 3_000), Unleased::Refuse, "waited long enough");
    /// assert_eq!(config.unleased(true, 0), Unleased::Refuse, "ran out: a newer owner may exist");
    /// ```
    pub fn unleased(&self, granted: bool, held_ms: u64) -> Unleased {
        if granted || held_ms >= self.hold_unleased_ms {
            Unleased::Refuse
        } else {
            Unleased::Wait { again_ms: UNLEASED_RECHECK_MS.min(self.hold_unleased_ms - held_ms) }
        }
    }

    /// Whether an entity whose mailbox just emptied may keep its task, with `tasks` entity tasks
    /// running in the shard. Read by the task after every message, without the host's lock.
    pub fn lingers(&self, tasks: usize) -> bool {
        tasks <= self.max_lingering
    }
}

/// What the engine asks of a running entity's mailbox (the driver's channel).
pub trait Mailbox {
    /// Places free, out of [`HostConfig::mailbox`] + 1.
    fn free(&self) -> usize;
}

/// An entity of the hosted shard, as the engine holds it.
enum Resident<S, M> {
    /// State in the map, idle since a second of the host's clock (seconds keep it small: an idle
    /// entity's footprint is its state and this).
    Idle { state: S, since: u32 },
    /// A task runs the entity. `nudged`: a linger marker is in the mailbox (at most one is).
    /// `evict`: the node's limit picked it; it leaves memory instead of going idle, unless a
    /// message comes first.
    Active { mailbox: M, nudged: bool, evict: bool },
}

/// What became of a message for one entity, decided by [`HostEngine::deliver`].
#[derive(Debug)]
pub enum Delivery<'a, S, M, B, R> {
    /// The entity runs: the message went to its mailbox's `put`, which answered this. A put that
    /// fails (the task ended in between) is answered "not processed".
    Put(R),
    /// Start a task for the entity with this mailbox, which the engine now holds, and the message
    /// as its first.
    Spawn {
        /// The entity's idle state; None means a new instance, whose start hook runs first.
        state: Option<S>,
        /// The mailbox the engine made for it, for the driver to attach its task to.
        mailbox: &'a mut M,
        /// The message, for the task to handle first.
        first: B,
    },
    /// The mailbox is full: answer the sender "overloaded, not processed".
    Full(B),
    /// The shard is stopping and its entities may have handed their state over already: give
    /// the message back, for the region to route it to the shard's next owner.
    Stopping(B),
}

/// Whether a remembered entity is started, decided by [`HostEngine::wake`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeDecision {
    /// Deliver the wake marker: the entity is not in memory.
    Deliver,
    /// Nothing to do: the entity is in memory already.
    Present,
    /// The shard is stopping: wake no more.
    Stopping,
}

/// A marker an entity task took from its mailbox while its mailbox was otherwise empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    /// The linger marker of [`HostEngine::nudge`]. `busy`: a message came since the last one.
    Nudge {
        /// Whether the task handled a message since it last took a nudge.
        busy: bool,
    },
    /// The shard's stop marker, or the task's own when too many tasks linger
    /// ([`HostConfig::lingers`]), or its mailbox closed.
    Retire,
}

/// What an entity task does after a marker, decided by [`HostEngine::marker`].
#[derive(Debug, PartialEq, Eq)]
pub enum AfterMarker<S> {
    /// Keep running, and handle the waiting message first if one was found.
    Stay(S),
    /// The state is back in the map, idle: end the task.
    Idle,
    /// The node's limit picked the entity ([`HostEngine::evict`]): run its stop hook and end
    /// the task. It is forgotten.
    Evicted(S),
    /// The shard stops: run the stop hook, hand the state over
    /// ([`HostEngine::handed`]) and end the task. It is forgotten.
    Retire(S),
}

/// What became of an entity the node's limit picked to leave memory ([`HostEngine::evict`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Evicted<S> {
    /// It was idle: run its stop hook; its state goes nowhere.
    Stop(S),
    /// Its task runs: it leaves once its mailbox is empty, instead of going idle.
    Running,
    /// It is not in memory (any more).
    Gone,
}

/// The entity lifecycle of one hosted shard, as a state machine with no I/O. `S` is an entity's
/// state, `M` the driver's mailbox handle.
pub struct HostEngine<S, M> {
    config: HostConfig,
    residents: HashMap<EntityId, Resident<S, M>>,
    /// The ids of `Active` residents, so that sweeps touch only those.
    active: HashSet<EntityId>,
    stopping: bool,
    /// The epoch the shard is hosted at here: raised, never lowered.
    epoch: Epoch,
    /// What entities stopped for a hand-off handed over.
    handed: HandedOver,
}

impl<S, M: Mailbox> HostEngine<S, M> {
    /// A shard hosted at `epoch`, with no entity in memory.
    pub fn new(config: HostConfig, epoch: Epoch) -> Self {
        HostEngine {
            config,
            residents: HashMap::new(),
            active: HashSet::new(),
            stopping: false,
            epoch,
            handed: Vec::new(),
        }
    }

    /// Entities in memory, idle or running.
    pub fn len(&self) -> usize {
        self.residents.len()
    }

    /// Whether no entity is in memory.
    pub fn is_empty(&self) -> bool {
        self.residents.is_empty()
    }

    /// Entities with a running task.
    pub fn active_len(&self) -> usize {
        self.active.len()
    }

    /// Whether the shard is stopping (or was killed).
    pub fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// The epoch the shard is hosted at here.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The shard stays here at `to`, if that is newer; true when the epoch was raised.
    pub fn raise_epoch(&mut self, to: Epoch) -> bool {
        if to > self.epoch {
            self.epoch = to;
            return true;
        }
        false
    }

    /// A message for `id`. `put` puts it in the mailbox of the running entity and says how that
    /// went; `mailbox` makes the mailbox of a task to start.
    pub fn deliver<B, R>(
        &mut self,
        id: &EntityId,
        msg: B,
        put: impl FnOnce(&M, B) -> R,
        mailbox: impl FnOnce() -> M,
    ) -> Delivery<'_, S, M, B, R> {
        // Checked before anything starts: every entity a stopping shard started would be one it
        // must stop, after its state was handed over.
        if self.stopping {
            return Delivery::Stopping(msg);
        }
        if let Some(Resident::Active { mailbox, nudged, evict }) = self.residents.get_mut(id) {
            // The last place is the linger marker's until the marker is in.
            if !*nudged && mailbox.free() <= 1 {
                return Delivery::Full(msg);
            }
            // In use again: it counts in the limit as the most recently used.
            *evict = false;
            return Delivery::Put(put(mailbox, msg));
        }
        let state = match self.residents.remove(id) {
            Some(Resident::Idle { state, .. }) => Some(state),
            _ => None,
        };
        self.active.insert(id.clone());
        match self
            .residents
            .entry(id.clone())
            .insert_entry(Resident::Active { mailbox: mailbox(), nudged: false, evict: false })
            .into_mut()
        {
            Resident::Active { mailbox, .. } => Delivery::Spawn { state, mailbox, first: msg },
            // Just inserted as active.
            Resident::Idle { .. } => Delivery::Stopping(msg),
        }
    }

    /// A remembered entity to start when its shard starts here.
    pub fn wake(&self, id: &EntityId) -> WakeDecision {
        if self.stopping {
            WakeDecision::Stopping
        } else if self.residents.contains_key(id) {
            WakeDecision::Present
        } else {
            WakeDecision::Deliver
        }
    }

    /// The linger sweep, once per linger period: every running entity whose mailbox is empty
    /// gets a marker, unless one is in it already. `put` puts the marker in and says whether it
    /// went in. One sweep per shard instead of a timer per entity task: a timer polled on every
    /// wake-up cost a busy entity more than the sweep costs an idle one. Only an empty mailbox
    /// gets one, so a marker never piles up behind a slow handler.
    pub fn nudge(&mut self, mut put: impl FnMut(&M) -> bool) {
        let empty = self.config.mailbox + 1;
        for id in &self.active {
            if let Some(Resident::Active { mailbox, nudged: nudged @ false, .. }) = self.residents.get_mut(id) {
                if mailbox.free() == empty && put(mailbox) {
                    *nudged = true;
                }
            }
        }
    }

    /// The task of `id` took a marker. `waiting`: it found a message in its mailbox after it.
    /// Decided where nothing new can arrive: go on, go idle, or stop.
    pub fn marker(&mut self, id: &EntityId, marker: Marker, waiting: bool, state: S, now_ms: u64) -> AfterMarker<S> {
        if let Marker::Nudge { busy } = marker {
            self.nudge_taken(id);
            // A message came since the last nudge: wait for the next one.
            if busy && !self.stopping {
                return AfterMarker::Stay(state);
            }
        }
        if waiting {
            return AfterMarker::Stay(state);
        }
        if self.stopping {
            self.forget(id);
            return AfterMarker::Retire(state);
        }
        if let Some(Resident::Active { evict: true, .. }) = self.residents.get(id) {
            self.forget(id);
            return AfterMarker::Evicted(state);
        }
        self.active.remove(id);
        self.residents.insert(id.clone(), Resident::Idle { state, since: secs(now_ms) });
        AfterMarker::Idle
    }

    /// The task of `id` took a linger marker while it was not deciding on one (draining its
    /// mailbox after a passivation): it may get the next one.
    pub fn nudge_taken(&mut self, id: &EntityId) {
        if let Some(Resident::Active { nudged, .. }) = self.residents.get_mut(id) {
            *nudged = false;
        }
    }

    /// The entity `id` asked to passivate and its stop hook ran; it stayed active
    /// meanwhile, so that new messages waited in its mailbox instead of starting a second
    /// instance. `waiting`: a message (not a marker) was found in the mailbox after the hook.
    /// True: start a fresh instance for it. False: the entity is gone (the shard's stop marker,
    /// if it was found, needs nothing more from this instance).
    pub fn passivated(&mut self, id: &EntityId, waiting: bool) -> bool {
        if waiting {
            return true;
        }
        self.forget(id);
        false
    }

    /// The task of `id` ended without deciding (its handler panicked, or it was aborted): the
    /// entity is forgotten, and the next message starts a fresh instance.
    pub fn task_failed(&mut self, id: &EntityId) {
        self.forget(id);
    }

    /// Idle entities stopped by passivation: those idle for `after_ms` or longer. Their stop hooks
    /// run; their state goes nowhere.
    pub fn passivate_idle(&mut self, now_ms: u64, after_ms: u64) -> Vec<(EntityId, S)> {
        let (now, limit) = (secs(now_ms), secs(after_ms));
        self.take_idle(|since| now.saturating_sub(since) >= limit)
    }

    /// The node's [`ActiveLimit`](super::ActiveLimit) picked `id` to leave memory. An idle
    /// entity is taken out of the map, for its stop hook to run; a running one finishes its
    /// mailbox and then leaves instead of going idle ([`AfterMarker::Evicted`]), unless a
    /// message comes for it first; one no longer here needs nothing.
    pub fn evict(&mut self, id: &EntityId) -> Evicted<S> {
        match self.residents.get_mut(id) {
            None => Evicted::Gone,
            Some(Resident::Active { evict, .. }) => {
                *evict = true;
                Evicted::Running
            }
            Some(Resident::Idle { .. }) => match self.residents.remove(id) {
                Some(Resident::Idle { state, .. }) => Evicted::Stop(state),
                // Matched as idle just above.
                _ => Evicted::Gone,
            },
        }
    }

    /// The shard stops for a hand-off or a leave. Every running entity finishes its mailbox,
    /// then meets the stop marker that `retire` makes for it (to send outside the lock), and
    /// stops; the idle ones are returned, to stop now. Nothing starts after this.
    pub fn stop<R>(&mut self, mut retire: impl FnMut(&M) -> R) -> (Vec<R>, Vec<(EntityId, S)>) {
        self.stopping = true;
        let markers = self
            .residents
            .values()
            .filter_map(|s| match s {
                Resident::Active { mailbox, .. } => Some(retire(mailbox)),
                Resident::Idle { .. } => None,
            })
            .collect();
        (markers, self.take_idle(|_| true))
    }

    /// What the stopped entity `id` hands the next owner (its `hand_over`), if anything.
    pub fn handed(&mut self, id: &EntityId, state: Option<Vec<u8>>) {
        if let Some(bytes) = state {
            self.handed.push((id.as_str().to_string(), bytes));
        }
    }

    /// What the stopped shard hands over, encoded: once every task has ended.
    pub fn take_handover(&mut self) -> Option<Vec<u8>> {
        encode_handover(&std::mem::take(&mut self.handed))
    }

    /// Stops at once, without hooks (the node lost its right to the shard): every entity is
    /// dropped, and the mailboxes of running entities are returned, for their tasks to be
    /// aborted.
    pub fn kill(&mut self) -> Vec<M> {
        self.stopping = true;
        self.active.clear();
        self.residents
            .drain()
            .filter_map(|(_, resident)| match resident {
                Resident::Active { mailbox, .. } => Some(mailbox),
                Resident::Idle { .. } => None,
            })
            .collect()
    }

    /// Puts an entity rebuilt from handed-over state in the map, idle.
    pub fn restore(&mut self, id: EntityId, state: S, now_ms: u64) {
        self.residents.insert(id, Resident::Idle { state, since: secs(now_ms) });
    }

    fn forget(&mut self, id: &EntityId) {
        self.active.remove(id);
        self.residents.remove(id);
    }

    /// Takes the idle entities whose idle-since second `pick` accepts out of the map.
    fn take_idle(&mut self, pick: impl Fn(u32) -> bool) -> Vec<(EntityId, S)> {
        let ids: Vec<EntityId> = self
            .residents
            .iter()
            .filter(|(_, s)| matches!(s, Resident::Idle { since, .. } if pick(*since)))
            .map(|(k, _)| k.clone())
            .collect();
        ids.into_iter()
            .filter_map(|k| match self.residents.remove(&k) {
                Some(Resident::Idle { state, .. }) => Some((k, state)),
                // Picked as idle above, under the same borrow.
                _ => None,
            })
            .collect()
    }
}

fn secs(ms: u64) -> u32 {
    (ms / 1_000).min(u64::from(u32::MAX)) as u32
}
