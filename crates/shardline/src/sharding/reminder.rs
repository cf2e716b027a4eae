//! Durable reminders: a timer an entity sets that survives crashes and moves, stored in its
//! type's journal and fired on whichever node hosts its shard when it is due (Orleans'
//! reminders).
//!
//! An entity sets one with [`EntityContext::remind`](crate::EntityContext::remind) (an
//! event-sourced one from its events, in the transaction that stores them: see
//! [`EventSourced::reminders`](crate::entity::EventSourced::reminders)) and receives it in
//! [`Entity::reminded`](crate::Entity::reminded)(crate::Entity::reminded). The shard's owner runs one [`ShardReminders`]
//! task per hosted shard: the core's [`ReminderSchedule`] decides what to read and what is due;
//! this task reads the journal, delivers each due reminder to its entity (starting it if
//! needed), and acknowledges it once handled. A reminder is removed (or moved to its next time)
//! only by that acknowledgement, fenced by the shard's epoch, so one that fired on a node that
//! crashed before acknowledging fires again on the next owner: at least once. Each firing has
//! an id of its own ([`Reminder::firing_id`]), the same at every redelivery, which an
//! event-sourced entity records like a request id so that it applies the firing once.
//!
//! This module is the leaf the entity contract needs; the task is `host::reminders`.
//!
//! Only types whose settings ask for reminders
//! ([`EntitySettings::reminders`](crate::EntitySettings::reminders)) run the task: it reads the
//! journal once per shard when the shard starts and every half lookahead after that.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use shardline_core::reminder::{
    next_due, ReminderChange, ReminderSchedule, ScheduleConfig, StoredReminder, MAX_DUE_MS,
};
use tokio::sync::{oneshot, Notify};

use crate::error::Error;

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
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
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

/// A reminder, as its entity receives it in [`Entity::reminded`](crate::Entity::reminded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reminder {
    pub(crate) name: String,
    pub(crate) due_ms: u64,
    pub(crate) every_ms: u64,
    /// Where its acknowledgement moves it (None: it is removed), fixed when it fired.
    pub(crate) next_ms: Option<u64>,
}

impl Reminder {
    /// A reminder named `name` due at `due` (for tests of an entity's `reminded`).
    pub fn new(name: impl Into<String>, due: SystemTime, every: Option<Duration>) -> Self {
        let (due_ms, every_ms) = (due_ms(due), every.map_or(0, ms_up));
        Reminder { name: name.into(), due_ms, every_ms, next_ms: next_due(due_ms, every_ms, due_ms) }
    }

    /// Its acknowledgement, for `entity_id`: stored in the transaction of what the entity did
    /// with it, so that a crash after that commit does not fire it again.
    pub(crate) fn ack(&self, entity_id: &str) -> ReminderChange {
        ReminderChange::Fired {
            entity_id: entity_id.to_string(),
            name: self.name.clone(),
            due_ms: self.due_ms,
            next_ms: self.next_ms,
        }
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

/// The reminders of one hosted shard: the schedule, and what wakes the task that reads and
/// fires them (`host::reminders`).
pub(crate) struct ShardReminders {
    schedule: Mutex<ReminderSchedule>,
    pub(crate) wake: Notify,
}

impl ShardReminders {
    pub fn new(config: ScheduleConfig) -> Self {
        ShardReminders { schedule: Mutex::new(ReminderSchedule::new(config)), wake: Notify::new() }
    }

    pub fn schedule(&self) -> std::sync::MutexGuard<'_, ReminderSchedule> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A change this node committed for one of the shard's entities.
    pub fn changed(&self, change: &ReminderChange) {
        self.schedule().changed(change);
        self.wake.notify_one();
    }

    /// A change whose commit outcome is unknown: the schedule reads the journal again.
    pub fn unsure(&self, change: &ReminderChange) {
        self.schedule().unsure(change.entity_id(), change.name());
        self.wake.notify_one();
    }
}

/// A set reminder as the journal stores it.
pub(crate) fn stored(entity_id: &str, name: &str, when: When, now: SystemTime) -> Result<StoredReminder, Error> {
    if name.is_empty() {
        return Err(Error::Rejected("a reminder needs a name".into()));
    }
    let (due_ms, every_ms) = when.resolve(now)?;
    Ok(StoredReminder { entity_id: entity_id.to_string(), name: name.to_string(), due_ms, every_ms })
}
