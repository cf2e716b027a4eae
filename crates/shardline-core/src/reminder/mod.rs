//! Durable reminders: what a journal stores, and when a shard's owner reads and fires them.
//!
//! A reminder is written by the entity's owner (fenced like an append, in the transaction of the
//! command that set it when there is one), read a page at a time by the shard's owner in due
//! order ([`ReminderSchedule`]), and acknowledged once the entity has handled it
//! ([`ReminderChange::Fired`]): removed, or moved to its next time when it repeats. Until then it
//! stays stored, so a crash between firing and acknowledging fires it again on the next owner:
//! at least once, never lost.
//!
//! The owner keeps in memory only the reminders due within a lookahead (at most a page of
//! them), so a million pending reminders cost a database row each, and a read per shard every
//! half lookahead, from an index.

mod schedule;

pub use schedule::{Firing, ReadRequest, ReminderSchedule, ScheduleConfig};

use serde::{Deserialize, Serialize};

/// A stored reminder.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StoredReminder {
    /// The entity it wakes.
    pub entity_id: String,
    /// Its name, unique per entity and never empty: setting a name again replaces it.
    pub name: String,
    /// When it is due next, in milliseconds since the Unix epoch.
    pub due_ms: u64,
    /// Its period in milliseconds (0: it fires once).
    pub every_ms: u64,
}

impl StoredReminder {
    /// Where it sorts among its shard's reminders.
    pub fn position(&self) -> ReminderPosition {
        ReminderPosition { due_ms: self.due_ms, entity_id: self.entity_id.clone(), name: self.name.clone() }
    }
}

/// A place in a shard's reminders, in the order a journal reads them (due time, entity, name): a
/// page starts after the last reminder of the previous one. Names are never empty, so the
/// position `(t, "", "")` comes before every reminder due at `t`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReminderPosition {
    /// The due time, in milliseconds since the Unix epoch.
    pub due_ms: u64,
    /// The entity.
    pub entity_id: String,
    /// The reminder's name.
    pub name: String,
}

impl ReminderPosition {
    /// The position before every reminder due at `due_ms` or later.
    pub fn before(due_ms: u64) -> Self {
        ReminderPosition { due_ms, entity_id: String::new(), name: String::new() }
    }
}

/// A change to the reminders of one shard's entities, made by the shard's owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReminderChange {
    /// Stores the reminder, replacing any of the same entity and name.
    Set(StoredReminder),
    /// Removes a reminder (nothing when there is none).
    Cancel {
        /// The entity.
        entity_id: String,
        /// The reminder's name.
        name: String,
    },
    /// The entity handled the reminder due at `due_ms`: it is removed, or moved to `next_ms`
    /// when it repeats. Nothing changes when the stored one is no longer due at `due_ms` (the
    /// entity set it again, or cancelled it, while it fired).
    Fired {
        /// The entity.
        entity_id: String,
        /// The reminder's name.
        name: String,
        /// The due time that fired.
        due_ms: u64,
        /// The next due time of a repeating reminder.
        next_ms: Option<u64>,
    },
}

impl ReminderChange {
    /// The entity it changes.
    pub fn entity_id(&self) -> &str {
        match self {
            ReminderChange::Set(r) => &r.entity_id,
            ReminderChange::Cancel { entity_id, .. } | ReminderChange::Fired { entity_id, .. } => entity_id,
        }
    }

    /// The reminder's name.
    pub fn name(&self) -> &str {
        match self {
            ReminderChange::Set(r) => &r.name,
            ReminderChange::Cancel { name, .. } | ReminderChange::Fired { name, .. } => name,
        }
    }

    /// The due time it stores, if any (a journal refuses one above [`MAX_DUE_MS`]).
    pub fn stores_due(&self) -> Option<u64> {
        match self {
            ReminderChange::Set(r) => Some(r.due_ms),
            ReminderChange::Fired { next_ms, .. } => *next_ms,
            ReminderChange::Cancel { .. } => None,
        }
    }

    /// Why a journal must refuse it, if it must: a due time it cannot store, or an empty name.
    pub fn problem(&self) -> Option<String> {
        if self.name().is_empty() {
            return Some(format!("a reminder of {} has an empty name", self.entity_id()));
        }
        match self.stores_due() {
            Some(due) if due > MAX_DUE_MS => Some(format!("reminder {} due at {due} ms is out of range", self.name())),
            _ => None,
        }
    }
}

/// The largest due time a journal stores: databases keep signed 64-bit integers.
pub const MAX_DUE_MS: u64 = i64::MAX as u64;

/// The next due time of a reminder due at `due_ms` repeating every `every_ms`, after `now_ms`:
/// occurrences missed while nobody hosted it are skipped, not fired in a burst (Orleans does the
/// same). None for a reminder that fires once.
///
/// ```
/// use shardline_core::reminder::next_due;
///
/// assert_eq!(next_due(1_000, 0, 5_000), None);
/// assert_eq!(next_due(1_000, 500, 1_000), Some(1_500));
/// assert_eq!(next_due(1_000, 500, 2_600), Some(3_000));
/// ```
pub fn next_due(due_ms: u64, every_ms: u64, now_ms: u64) -> Option<u64> {
    if every_ms == 0 {
        return None;
    }
    let periods = now_ms.saturating_sub(due_ms) / every_ms + 1;
    Some(due_ms.saturating_add(periods.saturating_mul(every_ms)).min(MAX_DUE_MS))
}
