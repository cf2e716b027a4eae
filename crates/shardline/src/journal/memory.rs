//! `InMemoryJournal`: the journal's semantics in a map, for tests and single-process use. It can
//! be switched "down" to test what callers do when the database is unreachable.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use shardline_core::{Epoch, ShardId};

use super::{
    AppendRequest, BoxFuture, Fence, Journal, JournalError, RecordedReply, ReminderChange, ReminderPosition, Snapshot,
    StoredEvent, StoredReminder,
};

#[derive(Default)]
struct Tables {
    fences: HashMap<(String, ShardId), Epoch>,
    events: HashMap<String, Vec<StoredEvent>>,
    snapshots: HashMap<String, Snapshot>,
    replies: HashMap<String, Replies>,
    remembered: HashMap<(String, ShardId), BTreeSet<String>>,
    /// Reminders by (type, entity, name): their shard, due time and period.
    reminders: HashMap<(String, String, String), (ShardId, u64, u64)>,
    /// The same, in the order a shard's owner reads them: (type, shard, due, entity, name).
    reminders_due: BTreeSet<(String, ShardId, u64, String, String)>,
}

/// The replies of one persistence id: by request id, and in the order they were recorded.
#[derive(Default)]
struct Replies {
    by_id: HashMap<String, Vec<u8>>,
    order: VecDeque<(SystemTime, String)>,
}

impl Replies {
    fn record(&mut self, id: String, reply: Vec<u8>, now: SystemTime) {
        if self.by_id.insert(id.clone(), reply).is_some() {
            self.order.retain(|(_, i)| *i != id);
        }
        self.order.push_back((now, id));
    }

    /// Drops what was recorded before `cutoff`.
    fn prune(&mut self, cutoff: SystemTime) {
        while self.order.front().is_some_and(|(at, _)| *at < cutoff) {
            if let Some((_, id)) = self.order.pop_front() {
                self.by_id.remove(&id);
            }
        }
    }
}

impl Tables {
    /// The fence check every write makes first.
    fn check_fence(&self, fence: &Fence) -> Result<(), JournalError> {
        fence.admitted_by(self.fences.get(&(fence.type_key.clone(), fence.shard)).copied())
    }

    /// Reminder changes, all or none: every due time is checked before the first is applied.
    fn change_reminders(&mut self, fence: &Fence, changes: Vec<ReminderChange>) -> Result<(), JournalError> {
        if let Some(problem) = changes.iter().find_map(ReminderChange::problem) {
            return Err(JournalError::Failed(problem));
        }
        let type_key = &fence.type_key;
        for c in changes {
            match c {
                ReminderChange::Set(r) => {
                    self.remove_reminder(type_key, &r.entity_id, &r.name, None);
                    let key = (type_key.clone(), r.entity_id.clone(), r.name.clone());
                    self.reminders.insert(key, (fence.shard, r.due_ms, r.every_ms));
                    self.reminders_due.insert((type_key.clone(), fence.shard, r.due_ms, r.entity_id, r.name));
                }
                ReminderChange::Cancel { entity_id, name } => {
                    self.remove_reminder(type_key, &entity_id, &name, None);
                }
                ReminderChange::Fired { entity_id, name, due_ms, next_ms } => {
                    if let Some((shard, _, every)) = self.remove_reminder(type_key, &entity_id, &name, Some(due_ms)) {
                        if let Some(next) = next_ms {
                            let key = (type_key.clone(), entity_id.clone(), name.clone());
                            self.reminders.insert(key, (shard, next, every));
                            self.reminders_due.insert((type_key.clone(), shard, next, entity_id, name));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes a reminder (only if it is due at `due`, when given); returns what it was.
    fn remove_reminder(
        &mut self,
        type_key: &str,
        entity_id: &str,
        name: &str,
        due: Option<u64>,
    ) -> Option<(ShardId, u64, u64)> {
        let key = (type_key.to_string(), entity_id.to_string(), name.to_string());
        let (shard, stored_due, every) = *self.reminders.get(&key)?;
        if due.is_some_and(|d| d != stored_due) {
            return None;
        }
        self.reminders.remove(&key);
        let (t, e, n) = key;
        self.reminders_due.remove(&(t, shard, stored_due, e, n));
        Some((shard, stored_due, every))
    }
}

/// A journal in memory. Cheap to clone; clones share their contents.
#[derive(Clone, Default)]
pub struct InMemoryJournal {
    tables: Arc<Mutex<Tables>>,
    down: Arc<AtomicBool>,
}

impl InMemoryJournal {
    /// An empty journal.
    pub fn new() -> Self {
        Self::default()
    }

    /// While down, every call fails with [`JournalError::Unavailable`] and changes nothing.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Release);
    }

    fn with<T>(&self, f: impl FnOnce(&mut Tables) -> Result<T, JournalError>) -> Result<T, JournalError> {
        if self.down.load(Ordering::Acquire) {
            return Err(JournalError::Unavailable("in-memory journal is down".into()));
        }
        let mut t = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut t)
    }
}

impl Journal for InMemoryJournal {
    fn raise_fence(&self, fence: &Fence) -> BoxFuture<'_, Result<Epoch, JournalError>> {
        let r = self.with(|t| {
            let stored = t.fences.entry((fence.type_key.clone(), fence.shard)).or_insert(fence.epoch);
            *stored = (*stored).max(fence.epoch);
            Ok(*stored)
        });
        Box::pin(async move { r })
    }

    fn append(&self, request: AppendRequest) -> BoxFuture<'_, Result<u64, JournalError>> {
        let r = self.with(|t| {
            t.check_fence(&request.fence)?;
            let pid = request.persistence_id.clone();
            if let Some(r) = &request.reply {
                if let Some(reply) = t.replies.get(&pid).and_then(|m| m.by_id.get(&r.request_id)) {
                    return Err(JournalError::Duplicate {
                        persistence_id: pid,
                        request_id: r.request_id.clone(),
                        reply: reply.clone(),
                    });
                }
            }
            let last = t.events.get(&pid).and_then(|e| e.last()).map_or(0, |e| e.seq);
            if last != request.expected_seq {
                return Err(JournalError::Conflict {
                    persistence_id: pid,
                    expected: request.expected_seq,
                    actual: last,
                });
            }
            // Validated before anything is written: all or nothing, as one transaction.
            if let Some(problem) = request.reminders.iter().find_map(ReminderChange::problem) {
                return Err(JournalError::Failed(problem));
            }
            let events = t.events.entry(pid.clone()).or_default();
            for (i, event) in request.events.into_iter().enumerate() {
                events.push(StoredEvent { seq: last + 1 + i as u64, event });
            }
            let new_last = events.last().map_or(0, |e| e.seq);
            if request.remember {
                let key = (request.fence.type_key.clone(), request.fence.shard);
                t.remembered.entry(key).or_default().insert(request.entity_id.clone());
            }
            t.change_reminders(&request.fence, request.reminders)?;
            if let Some(r) = request.reply {
                let now = SystemTime::now();
                let replies = t.replies.entry(pid).or_default();
                replies.prune(now.checked_sub(request.keep_replies).unwrap_or(SystemTime::UNIX_EPOCH));
                replies.record(r.request_id, r.reply, now);
            }
            Ok(new_last)
        });
        Box::pin(async move { r })
    }

    fn read_page(
        &self,
        persistence_id: &str,
        from: u64,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<StoredEvent>, JournalError>> {
        let r = self.with(|t| {
            Ok(t.events
                .get(persistence_id)
                .map(|e| e.iter().filter(|e| e.seq >= from).take(max).cloned().collect())
                .unwrap_or_default())
        });
        Box::pin(async move { r })
    }

    fn last_seq(&self, persistence_id: &str) -> BoxFuture<'_, Result<u64, JournalError>> {
        let r = self.with(|t| Ok(t.events.get(persistence_id).and_then(|e| e.last()).map_or(0, |e| e.seq)));
        Box::pin(async move { r })
    }

    fn save_snapshot(
        &self,
        fence: &Fence,
        persistence_id: &str,
        snapshot: Snapshot,
    ) -> BoxFuture<'_, Result<(), JournalError>> {
        let r = self.with(|t| {
            t.check_fence(fence)?;
            let newer = t.snapshots.get(persistence_id).is_none_or(|s| s.seq < snapshot.seq);
            if newer {
                t.snapshots.insert(persistence_id.to_string(), snapshot);
            }
            Ok(())
        });
        Box::pin(async move { r })
    }

    fn load_snapshot(&self, persistence_id: &str) -> BoxFuture<'_, Result<Option<Snapshot>, JournalError>> {
        let r = self.with(|t| Ok(t.snapshots.get(persistence_id).cloned()));
        Box::pin(async move { r })
    }

    fn recorded_reply(
        &self,
        persistence_id: &str,
        request_id: &str,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, JournalError>> {
        let r = self.with(|t| Ok(t.replies.get(persistence_id).and_then(|m| m.by_id.get(request_id)).cloned()));
        Box::pin(async move { r })
    }

    fn recorded_replies(
        &self,
        persistence_id: &str,
        newest: usize,
    ) -> BoxFuture<'_, Result<Vec<RecordedReply>, JournalError>> {
        let r = self.with(|t| {
            let Some(m) = t.replies.get(persistence_id) else { return Ok(Vec::new()) };
            let skip = m.order.len().saturating_sub(newest);
            Ok(m.order
                .iter()
                .skip(skip)
                .filter_map(|(_, id)| {
                    m.by_id.get(id).map(|r| RecordedReply { request_id: id.clone(), reply: r.clone() })
                })
                .collect())
        });
        Box::pin(async move { r })
    }

    fn remembered(&self, type_key: &str, shard: ShardId) -> BoxFuture<'_, Result<Vec<String>, JournalError>> {
        let r = self.with(|t| {
            Ok(t.remembered
                .get(&(type_key.to_string(), shard))
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default())
        });
        Box::pin(async move { r })
    }

    fn forget(&self, fence: &Fence, entity_id: &str) -> BoxFuture<'_, Result<(), JournalError>> {
        let r = self.with(|t| {
            t.check_fence(fence)?;
            if let Some(s) = t.remembered.get_mut(&(fence.type_key.clone(), fence.shard)) {
                s.remove(entity_id);
            }
            Ok(())
        });
        Box::pin(async move { r })
    }

    fn change_reminders(&self, fence: &Fence, changes: Vec<ReminderChange>) -> BoxFuture<'_, Result<(), JournalError>> {
        let r = self.with(|t| {
            t.check_fence(fence)?;
            t.change_reminders(fence, changes)
        });
        Box::pin(async move { r })
    }

    fn due_reminders(
        &self,
        type_key: &str,
        shard: ShardId,
        after: Option<ReminderPosition>,
        until_ms: u64,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<StoredReminder>, JournalError>> {
        let r = self.with(|t| {
            if after.as_ref().is_some_and(|p| p.due_ms >= until_ms) {
                return Ok(Vec::new());
            }
            let t_key = type_key.to_string();
            let start = match after {
                Some(p) => Bound::Excluded((t_key.clone(), shard, p.due_ms, p.entity_id, p.name)),
                None => Bound::Included((t_key.clone(), shard, 0, String::new(), String::new())),
            };
            let end = Bound::Excluded((t_key, shard, until_ms, String::new(), String::new()));
            Ok(t.reminders_due
                .range((start, end))
                .take(max)
                .filter_map(|(t_key, _, due, e, n)| {
                    let (_, _, every) = t.reminders.get(&(t_key.clone(), e.clone(), n.clone()))?;
                    Some(StoredReminder { entity_id: e.clone(), name: n.clone(), due_ms: *due, every_ms: *every })
                })
                .collect())
        });
        Box::pin(async move { r })
    }

    fn highest_term(&self) -> BoxFuture<'_, Result<u64, JournalError>> {
        let r = self.with(|t| Ok(t.fences.values().map(|e| e.term).max().unwrap_or(0)));
        Box::pin(async move { r })
    }
}
