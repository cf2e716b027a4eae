//! `ReminderSchedule`: which of a hosted shard's reminders to read from the journal, and which to
//! fire, sans-IO.
//!
//! The shard's owner keeps in memory the stored reminders up to a read position: everything the
//! journal holds before it is known here, nothing after it is. Reads move the position a page at
//! a time, never past the lookahead, so memory holds about a page per shard however many are
//! pending. Changes made on this node (a reminder set or cancelled by its entity, an
//! acknowledged firing) are applied at once and win over a page read before they committed.
//!
//! A firing stays known until its acknowledgement committed: a page read meanwhile, which may
//! still hold the fired reminder, does not fire it a second time.

use std::collections::{BTreeSet, HashMap};

use super::{next_due, ReminderChange, ReminderPosition, StoredReminder};

/// How a schedule reads and retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// How far ahead of now reminders are read (and kept in memory).
    pub lookahead_ms: u64,
    /// At most this many reminders per read; a read waits while this many are known already
    /// (waiting, firing or being acknowledged).
    pub page: usize,
    /// How long after a firing the entity did not handle it fires again.
    pub retry_ms: u64,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig { lookahead_ms: 30_000, page: 1024, retry_ms: 1_000 }
    }
}

/// A read of the journal the schedule wants: see `Journal::due_reminders`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    /// Start after this position (from the first when None).
    pub after: Option<ReminderPosition>,
    /// Only reminders due before this.
    pub until_ms: u64,
    /// At most this many.
    pub max: usize,
}

/// A reminder to deliver to its entity now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Firing {
    /// The entity.
    pub entity_id: String,
    /// The reminder's name.
    pub name: String,
    /// The due time that fires (its stored one: the acknowledgement names it).
    pub due_ms: u64,
    /// Its period (0: once).
    pub every_ms: u64,
    /// Its next due time once handled (None: it fires once), fixed when it fires: the
    /// acknowledgement stores this one, wherever it is written (by the schedule's driver, or in
    /// the transaction of what the entity did with the firing).
    pub next_ms: Option<u64>,
}

/// How far the journal's reminders have been read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ReadTo {
    /// Nothing yet.
    Nothing,
    /// A full page ended at this position: more may follow it.
    After(ReminderPosition),
    /// Everything due before this time.
    Until(u64),
}

impl ReadTo {
    fn covers(&self, p: &ReminderPosition) -> bool {
        match self {
            ReadTo::Nothing => false,
            ReadTo::After(last) => p <= last,
            ReadTo::Until(ms) => p.due_ms < *ms,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// In `waiting`, to fire at `fire_at`.
    Waiting { fire_at: u64 },
    /// Delivered to its entity; not handled yet.
    Firing,
    /// Handled; its acknowledgement is being written.
    Acking,
}

#[derive(Clone, Copy, Debug)]
struct Known {
    due_ms: u64,
    every_ms: u64,
    state: State,
}

type Key = (String, String);

/// The reminders of one hosted shard. See the [module docs](crate::reminder).
///
/// ```
/// use shardline_core::reminder::{ReminderSchedule, ScheduleConfig, StoredReminder};
///
/// let mut s = ReminderSchedule::new(ScheduleConfig::default());
/// let read = s.read_due(1_000).expect("a new schedule reads first");
/// let due = StoredReminder { entity_id: "e".into(), name: "ping".into(), due_ms: 1_500, every_ms: 0 };
/// s.read_done(&read, Some(vec![due]));
/// assert_eq!(s.next_wake(1_000), Some(1_500));
/// let fired = s.take_due(1_500);
/// assert_eq!(fired.len(), 1);
/// let ack = s.fired(&fired[0], true, 1_501).expect("handled: acknowledge it");
/// s.acked(&ack);
/// assert!(s.is_empty());
/// ```
#[derive(Debug)]
pub struct ReminderSchedule {
    config: ScheduleConfig,
    /// Known reminders waiting to fire, by (fire time, entity, name).
    waiting: BTreeSet<(u64, String, String)>,
    known: HashMap<Key, Known>,
    read_to: ReadTo,
    /// A read is in flight.
    reading: bool,
    /// Local changes made while a read was in flight, newest last per key: they win over the
    /// page, which may have been read before they committed.
    touched: HashMap<Key, Option<StoredReminder>>,
    /// The page in flight may predate a change this schedule cannot place (one of unknown
    /// outcome, or an acknowledgement of a reminder not known here): it is dropped.
    stale_read: bool,
}

impl Firing {
    /// Its acknowledgement: the reminder is removed, or moved to its next time.
    pub fn ack(&self) -> ReminderChange {
        ReminderChange::Fired {
            entity_id: self.entity_id.clone(),
            name: self.name.clone(),
            due_ms: self.due_ms,
            next_ms: self.next_ms,
        }
    }
}

impl ReminderSchedule {
    /// An empty schedule: its first [`read_due`](Self::read_due) reads from the start.
    pub fn new(config: ScheduleConfig) -> Self {
        ReminderSchedule {
            config,
            waiting: BTreeSet::new(),
            known: HashMap::new(),
            read_to: ReadTo::Nothing,
            reading: false,
            touched: HashMap::new(),
            stale_read: false,
        }
    }

    /// Reminders known here (waiting, firing or being acknowledged).
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// The read to make now, if one is due: the first read, the rest of a full page once there
    /// is room, or the next stretch once half the lookahead has passed. None while a read is in
    /// flight. Answer with [`read_done`](Self::read_done).
    pub fn read_due(&mut self, now_ms: u64) -> Option<ReadRequest> {
        if self.reading {
            return None;
        }
        let until_ms = now_ms.saturating_add(self.config.lookahead_ms);
        let after = match &self.read_to {
            ReadTo::Nothing => None,
            // Known, not only waiting: firings in flight count, or a burst due at once would be
            // read whole while its first pages fire.
            ReadTo::After(last) if self.known.len() < self.config.page => Some(last.clone()),
            ReadTo::After(_) => return None,
            ReadTo::Until(ms) if *ms <= now_ms.saturating_add(self.config.lookahead_ms / 2) => {
                Some(ReminderPosition::before(*ms))
            }
            ReadTo::Until(_) => return None,
        };
        self.reading = true;
        Some(ReadRequest { after, until_ms, max: self.config.page.max(1) })
    }

    /// The answer to `request`: the page read, or None when the read failed (it is made again
    /// at the next [`read_due`](Self::read_due)).
    pub fn read_done(&mut self, request: &ReadRequest, page: Option<Vec<StoredReminder>>) {
        self.reading = false;
        let touched = std::mem::take(&mut self.touched);
        if std::mem::take(&mut self.stale_read) {
            // Read again, from the start after `unsure`: this page may predate the change.
            return;
        }
        let Some(page) = page else { return };
        let full = page.len() >= request.max;
        let new_read_to = match page.last() {
            Some(last) if full => ReadTo::After(last.position()),
            _ => ReadTo::Until(request.until_ms),
        };
        // Only forwards: a page never unreads what is known.
        let ahead = match (&self.read_to, &new_read_to) {
            (ReadTo::Nothing, _) => true,
            (old, ReadTo::After(p)) => !old.covers(p),
            (ReadTo::After(p), ReadTo::Until(ms)) => p.due_ms < *ms,
            (ReadTo::Until(a), ReadTo::Until(b)) => a <= b,
            (_, ReadTo::Nothing) => false,
        };
        if ahead {
            self.read_to = new_read_to;
        }
        for r in page {
            let key = (r.entity_id.clone(), r.name.clone());
            // Known here (this node's view is at least as new), or changed here while the page
            // was read: the page's row may be older.
            if self.known.contains_key(&key) || touched.contains_key(&key) || !self.read_to.covers(&r.position()) {
                continue;
            }
            self.insert(r);
        }
        for (_, change) in touched {
            if let Some(r) = change {
                self.settle(r);
            }
        }
    }

    /// A change this node committed: its entity set or cancelled a reminder, or stored a
    /// firing's acknowledgement in its own transaction ([`Firing::ack`]). A set reminder is
    /// known at once when it is due before the read position, and read later otherwise.
    pub fn changed(&mut self, change: &ReminderChange) {
        let key = (change.entity_id().to_string(), change.name().to_string());
        let now = match change {
            ReminderChange::Set(r) => Some(r.clone()),
            ReminderChange::Cancel { .. } => None,
            ReminderChange::Fired { entity_id, name, due_ms, next_ms } => match self.known.get(&key) {
                // The stored one was the firing's: now it is gone or at its next time.
                Some(k) if k.due_ms == *due_ms => next_ms.map(|due_ms| StoredReminder {
                    entity_id: entity_id.clone(),
                    name: name.clone(),
                    due_ms,
                    every_ms: k.every_ms,
                }),
                // It changed nothing, or what is not known here: a later read finds what is
                // stored, but a page in flight may hold what was.
                _ => {
                    self.stale_read |= self.reading;
                    return;
                }
            },
        };
        self.forget(&key);
        if self.reading {
            self.touched.insert(key, now.clone());
        }
        if let Some(r) = now {
            self.settle(r);
        }
    }

    /// A change of `entity_id`'s reminder `name` whose outcome is unknown (the journal lost the
    /// connection while committing it): it may be stored or not. What is known of that reminder
    /// is dropped and the journal is read again from the start, where the stored one is found,
    /// whichever it is. Without this, a reminder set by such a write and due before the read
    /// position would never be read.
    pub fn unsure(&mut self, entity_id: &str, name: &str) {
        self.forget(&(entity_id.to_string(), name.to_string()));
        self.read_to = ReadTo::Nothing;
        self.stale_read = self.reading;
    }

    /// The reminders due by `now_ms`, now firing: deliver each to its entity and report with
    /// [`fired`](Self::fired).
    pub fn take_due(&mut self, now_ms: u64) -> Vec<Firing> {
        let mut out = Vec::new();
        while let Some((fire_at, _, _)) = self.waiting.first() {
            if *fire_at > now_ms {
                break;
            }
            let Some((_, entity_id, name)) = self.waiting.pop_first() else { break };
            let key = (entity_id, name);
            if let Some(k) = self.known.get_mut(&key) {
                k.state = State::Firing;
                let next_ms = next_due(k.due_ms, k.every_ms, now_ms);
                out.push(Firing { entity_id: key.0, name: key.1, due_ms: k.due_ms, every_ms: k.every_ms, next_ms });
            }
        }
        out
    }

    /// The entity handled `firing` (or did not, and it fires again after the retry time). For a
    /// handled one, the acknowledgement to write; report it with [`acked`](Self::acked) once it
    /// committed. None when there is nothing to write: not handled, or the reminder was set
    /// again or cancelled while it fired (the stored one is no longer this firing's).
    pub fn fired(&mut self, firing: &Firing, handled: bool, now_ms: u64) -> Option<ReminderChange> {
        let key = (firing.entity_id.clone(), firing.name.clone());
        let k = self.known.get_mut(&key)?;
        if k.state != State::Firing || k.due_ms != firing.due_ms {
            return None;
        }
        if !handled {
            let fire_at = now_ms.saturating_add(self.config.retry_ms);
            k.state = State::Waiting { fire_at };
            self.waiting.insert((fire_at, key.0, key.1));
            return None;
        }
        k.state = State::Acking;
        Some(firing.ack())
    }

    /// An acknowledgement [`fired`](Self::fired) returned committed: the reminder is gone, or
    /// waits for its next time. When the reminder known here is no longer the one acknowledged
    /// but is due at the same time (set again at that very time, or read again after
    /// [`unsure`](Self::unsure)), which of the two writes committed last cannot be told: it is
    /// read again.
    pub fn acked(&mut self, ack: &ReminderChange) {
        let ReminderChange::Fired { entity_id, name, due_ms, .. } = ack else { return };
        let key = (entity_id.clone(), name.clone());
        match self.known.get(&key) {
            Some(k) if k.due_ms == *due_ms && k.state == State::Acking => self.changed(ack),
            Some(k) if k.due_ms == *due_ms => self.unsure(entity_id, name),
            // Set again at another time (the acknowledgement changed nothing, or came before
            // it), or not known: a later read finds what is stored, a page in flight may not.
            _ => self.stale_read |= self.reading,
        }
    }

    /// When to call again: the next firing, or the next read. None while a read is in flight
    /// and nothing waits, or while a full page waits to fire.
    pub fn next_wake(&self, now_ms: u64) -> Option<u64> {
        let fire = self.waiting.first().map(|(at, _, _)| *at);
        let read = match &self.read_to {
            _ if self.reading => None,
            ReadTo::Nothing => Some(now_ms),
            ReadTo::After(_) if self.known.len() < self.config.page => Some(now_ms),
            ReadTo::After(_) => None,
            ReadTo::Until(ms) => Some(ms.saturating_sub(self.config.lookahead_ms / 2)),
        };
        match (fire, read) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Known from here on when it is before the read position.
    fn settle(&mut self, r: StoredReminder) {
        let key = (r.entity_id.clone(), r.name.clone());
        if self.known.contains_key(&key) || !self.read_to.covers(&r.position()) {
            return;
        }
        self.insert(r);
    }

    fn insert(&mut self, r: StoredReminder) {
        let fire_at = r.due_ms;
        self.waiting.insert((fire_at, r.entity_id.clone(), r.name.clone()));
        let known = Known { due_ms: r.due_ms, every_ms: r.every_ms, state: State::Waiting { fire_at } };
        self.known.insert((r.entity_id, r.name), known);
    }

    fn forget(&mut self, key: &Key) {
        if let Some(k) = self.known.remove(key) {
            if let State::Waiting { fire_at } = k.state {
                self.waiting.remove(&(fire_at, key.0.clone(), key.1.clone()));
            }
        }
    }
}
