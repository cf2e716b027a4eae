//! Durable reminders: a timer an entity sets that survives crashes and moves, stored in its
//! type's journal and fired on whichever node hosts its shard when it is due (Orleans'
//! reminders).
//!
//! An entity sets one with [`EntityContext::remind`](crate::EntityContext::remind) (an
//! event-sourced one from its events, in the transaction that stores them: see
//! [`EventSourced::reminders`](crate::entity::EventSourced::reminders)) and receives it in
//! [`Entity::reminded`](crate::Entity::reminded). The shard's owner runs one [`ShardReminders`]
//! task per hosted shard: the core's [`ReminderSchedule`] decides what to read and what is due;
//! this task reads the journal, delivers each due reminder to its entity (starting it if
//! needed), and acknowledges it once handled. A reminder is removed (or moved to its next time)
//! only by that acknowledgement, fenced by the shard's epoch, so one that fired on a node that
//! crashed before acknowledging fires again on the next owner: at least once. Each firing has
//! an id of its own ([`Reminder::firing_id`]), the same at every redelivery, which an
//! event-sourced entity records like a request id so that it applies the firing once.
//!
//! Only types whose settings ask for reminders
//! ([`EntitySettings::reminders`](crate::EntitySettings::reminders)) run the task: it reads the
//! journal once per shard when the shard starts and every half lookahead after that.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use shardline_core::reminder::{Firing, ReminderChange, ReminderSchedule, ScheduleConfig, StoredReminder, MAX_DUE_MS};
use shardline_core::EntityId;
use tokio::sync::{mpsc, oneshot, Notify};
use tracing::{debug, warn};

use super::claim::ShardClaim;
use super::entity::Entity;
use super::envelope::Body;
use super::host::ShardHost;
use crate::error::Error;
use crate::journal::JournalError;

/// When a reminder fires. Times are kept to the millisecond, rounded up, and a period is at
/// least one millisecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Once, at this time.
    At(SystemTime),
    /// Once, this long from now.
    After(Duration),
    /// Every period, the first one period from now.
    Every(Duration),
    /// Every `period`, the first `first` from now.
    EveryAfter {
        /// Until the first firing.
        first: Duration,
        /// Between firings.
        period: Duration,
    },
}

fn ms_up(d: Duration) -> u64 {
    let ms = d.as_millis();
    let up = if Duration::from_millis(ms as u64) < d { ms + 1 } else { ms };
    u64::try_from(up).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch, rounded down (0 before it): the clock's "now", so that
/// nothing fires before the moment it is due.
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A due time in milliseconds since the Unix epoch, rounded up (0 before it).
fn due_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, ms_up)
}

impl When {
    /// The due time and period in milliseconds, by `now`; refused when the time cannot be
    /// stored or a period is zero.
    pub(crate) fn resolve(self, now: SystemTime) -> Result<(u64, u64), Error> {
        let after = |d: Duration| now.checked_add(d).map_or(u64::MAX, due_ms);
        let (due, every) = match self {
            When::At(t) => (due_ms(t), 0),
            When::After(d) => (after(d), 0),
            When::Every(p) => (after(p), ms_up(p)),
            When::EveryAfter { first, period } => (after(first), ms_up(period)),
        };
        if matches!(self, When::Every(p) | When::EveryAfter { period: p, .. } if p.is_zero()) {
            return Err(Error::Rejected("a reminder's period must be longer than zero".into()));
        }
        if due > MAX_DUE_MS {
            return Err(Error::Rejected(format!("a reminder due at {due} ms cannot be stored")));
        }
        Ok((due, every))
    }
}

/// A reminder, as its entity receives it in [`Entity::reminded`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reminder {
    name: String,
    due_ms: u64,
    every_ms: u64,
}

impl Reminder {
    /// A reminder named `name` due at `due` (for tests of an entity's `reminded`).
    pub fn new(name: impl Into<String>, due: SystemTime, every: Option<Duration>) -> Self {
        Reminder { name: name.into(), due_ms: due_ms(due), every_ms: every.map_or(0, ms_up) }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When this firing was due.
    pub fn due(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.due_ms)
    }

    /// Its period, for one that repeats.
    pub fn every(&self) -> Option<Duration> {
        (self.every_ms > 0).then(|| Duration::from_millis(self.every_ms))
    }

    /// The id of this firing: the same every time it is delivered again (after a crash, a move,
    /// a failed handling), different for each due time of a repeating reminder. An event-sourced
    /// entity records it as the firing's request id, so that it applies the firing once.
    pub fn firing_id(&self) -> String {
        format!("reminder/{}/{}", self.name, self.due_ms)
    }
}

/// A reminder on its way to its entity: `done` says whether the entity handled it (dropped:
/// not handled, as when the shard stopped first).
pub(crate) struct Delivery {
    pub reminder: Reminder,
    pub done: oneshot::Sender<bool>,
}

/// The reminders of one hosted shard: the schedule, and the task that reads and fires them.
pub(crate) struct ShardReminders {
    schedule: Mutex<ReminderSchedule>,
    wake: Notify,
}

impl ShardReminders {
    /// Starts the shard's reminder task; it ends when the host is dropped or `abort`ed.
    pub fn start<E: Entity>(
        host: &Arc<ShardHost<E>>,
        claim: Arc<ShardClaim>,
        config: ScheduleConfig,
    ) -> (Arc<ShardReminders>, tokio::task::AbortHandle) {
        let me = Arc::new(ShardReminders { schedule: Mutex::new(ReminderSchedule::new(config)), wake: Notify::new() });
        let task = tokio::spawn(run(Arc::downgrade(host), claim, me.clone()));
        (me, task.abort_handle())
    }

    fn schedule(&self) -> std::sync::MutexGuard<'_, ReminderSchedule> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A change this node committed for one of the shard's entities.
    pub fn changed(&self, change: &ReminderChange) {
        self.schedule().changed(change);
        self.wake.notify_one();
    }
}

/// How long the task waits after the journal failed a read or an acknowledgement.
const BACKOFF: Duration = Duration::from_secs(1);

async fn run<E: Entity>(host: Weak<ShardHost<E>>, claim: Arc<ShardClaim>, me: Arc<ShardReminders>) {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(Firing, bool)>();
    // Acknowledgements to write, kept until they commit.
    let mut acks: Vec<ReminderChange> = Vec::new();
    let shard = claim.shard();
    loop {
        let now = unix_ms(SystemTime::now());
        let read = me.schedule().read_due(now);
        let mut failed = false;
        if let Some(read) = read {
            let page = claim
                .journal()
                .due_reminders(claim.type_key(), shard, read.after.clone(), read.until_ms, read.max)
                .await;
            let page = page.map_err(|e| warn!(type_key = claim.type_key(), %shard, error = %e, "reminders cannot be read: trying again")).ok();
            failed |= page.is_none();
            me.schedule().read_done(&read, page);
        }
        let due = me.schedule().take_due(unix_ms(SystemTime::now()));
        if !due.is_empty() {
            let Some(h) = host.upgrade() else { return };
            for firing in due {
                fire(&h, firing, done_tx.clone());
            }
        }
        // Firings handled since: their acknowledgements, written together.
        while let Ok((firing, handled)) = done_rx.try_recv() {
            if let Some(ack) = me.schedule().fired(&firing, handled, unix_ms(SystemTime::now())) {
                acks.push(ack);
            }
        }
        if !acks.is_empty() {
            let Some(epoch) = host.upgrade().map(|h| h.epoch()) else { return };
            let written = match claim.ensure(epoch).await {
                Ok(()) => claim.journal().change_reminders(&claim.fence(epoch), acks.clone()).await,
                Err(e) => Err(e),
            };
            match written {
                Ok(()) => {
                    let mut s = me.schedule();
                    for ack in acks.drain(..) {
                        s.acked(&ack);
                    }
                }
                Err(e @ JournalError::Fenced { .. }) => {
                    // A newer owner has the shard and fires its reminders.
                    debug!(type_key = claim.type_key(), %shard, error = %e, "reminders stop: the shard is fenced");
                    return;
                }
                Err(e) => {
                    warn!(type_key = claim.type_key(), %shard, error = %e, pending = acks.len(), "reminder acknowledgements cannot be written: trying again");
                    failed = true;
                }
            }
        }
        let now = unix_ms(SystemTime::now());
        let mut wait = me.schedule().next_wake(now).map(|at| Duration::from_millis(at.saturating_sub(now)));
        if failed {
            wait = Some(wait.map_or(BACKOFF, |w| w.max(BACKOFF)));
        }
        let sleep = async {
            match wait {
                Some(w) => tokio::time::sleep(w).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            got = done_rx.recv() => {
                if let Some((firing, handled)) = got {
                    if let Some(ack) = me.schedule().fired(&firing, handled, unix_ms(SystemTime::now())) {
                        acks.push(ack);
                    }
                }
            }
            _ = me.wake.notified() => {}
            _ = sleep => {}
        }
    }
}

/// Delivers a due reminder to its entity, starting it if needed; reports whether it was handled.
fn fire<E: Entity>(host: &Arc<ShardHost<E>>, firing: Firing, done: mpsc::UnboundedSender<(Firing, bool)>) {
    let (tx, rx) = oneshot::channel();
    let reminder = Reminder { name: firing.name.clone(), due_ms: firing.due_ms, every_ms: firing.every_ms };
    let id = EntityId::new(firing.entity_id.clone());
    // Given back when the shard is stopping: not handled here, the next owner fires it.
    let _ = host.try_deliver(&id, Body::Reminder(Delivery { reminder, done: tx }));
    tokio::spawn(async move {
        let handled = rx.await.unwrap_or(false);
        let _ = done.send((firing, handled));
    });
}

/// A set reminder as the journal stores it.
pub(crate) fn stored(entity_id: &str, name: &str, when: When, now: SystemTime) -> Result<StoredReminder, Error> {
    if name.is_empty() {
        return Err(Error::Rejected("a reminder needs a name".into()));
    }
    let (due_ms, every_ms) = when.resolve(now)?;
    Ok(StoredReminder { entity_id: entity_id.to_string(), name: name.to_string(), due_ms, every_ms })
}
