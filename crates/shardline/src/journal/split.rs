//! One journal over several databases: [`SplitJournal`].
//!
//! A journal on one database goes as fast as that database's commits. Akka splits its journal
//! into *slices* of the persistence ids and gives each database a range of them; so does this.
//! A persistence id's slice is `xxh3_64(id) % 1024` (the same hash as [`shard_of`]), and part
//! `k` of `n` holds slices `[k·1024/n, (k+1)·1024/n)`: every event, snapshot, recorded reply and
//! remembered entry of one entity lives in one database, and so does each append's transaction.
//!
//! **Fences.** An append's fence check must run in the transaction that writes, so every
//! database holds every shard's fence: [`raise_fence`](Journal::raise_fence) raises it in all of
//! them (at once) and answers the newest fence stored. A claim is complete only when every
//! database took it; before that the new owner reads nothing, and from then on each database
//! refuses the older owner's writes by itself. A database that is down fails the claims of
//! every shard until it is back (writes to entities on the others go on).
//!
//! **The list is fixed.** Every node must name the same databases in the same order, and a
//! journal cannot be split further once written: adding a database moves slices to it, and
//! their histories are not copied (not done).

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use shardline_core::{shard_of, Epoch, ShardId};

use super::{
    persistence_id, AppendRequest, BoxFuture, Fence, Journal, JournalError, RecordedReply, ReminderChange,
    ReminderPosition, Snapshot, StoredEvent, StoredReminder,
};

/// Slices of the persistence ids (Akka's number): the unit a database is given a range of.
pub const SLICES: u32 = 1024;

/// A journal split over several journals (one per database) by slices of the persistence ids.
/// See the [module docs](self).
///
/// ```
/// use std::sync::Arc;
/// use shardline::journal::{InMemoryJournal, Journal, SplitJournal};
///
/// let parts: Vec<Arc<dyn Journal>> = vec![Arc::new(InMemoryJournal::new()), Arc::new(InMemoryJournal::new())];
/// let journal = SplitJournal::new(parts).unwrap();
/// assert_eq!(journal.parts(), 2);
/// assert!(journal.part_of("account|42") < 2);
/// ```
pub struct SplitJournal {
    parts: Vec<Arc<dyn Journal>>,
}

impl SplitJournal {
    /// A journal over `parts`, in this order (every node must give the same order). None when
    /// `parts` is empty or longer than [`SLICES`].
    pub fn new(parts: Vec<Arc<dyn Journal>>) -> Option<SplitJournal> {
        (!parts.is_empty() && parts.len() <= SLICES as usize).then_some(SplitJournal { parts })
    }

    /// How many journals it spans.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// The part that holds a persistence id.
    pub fn part_of(&self, persistence_id: &str) -> usize {
        part_of(persistence_id, self.parts.len())
    }

    fn of(&self, persistence_id: &str) -> &dyn Journal {
        &*self.parts[self.part_of(persistence_id)]
    }
}

/// The part of `parts` that holds a persistence id: its slice's range (see the module docs).
pub fn part_of(persistence_id: &str, parts: usize) -> usize {
    let slice = shard_of(persistence_id, SLICES).0 as usize;
    slice * parts / SLICES as usize
}

/// Runs one future per part at once; their results in the parts' order.
async fn on_all<'a, T>(futures: Vec<BoxFuture<'a, Result<T, JournalError>>>) -> Vec<Result<T, JournalError>> {
    let mut pending: Vec<Option<BoxFuture<'a, Result<T, JournalError>>>> = futures.into_iter().map(Some).collect();
    let mut done: Vec<Option<Result<T, JournalError>>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (slot, out) in pending.iter_mut().zip(done.iter_mut()) {
            if let Some(f) = slot {
                if let Poll::Ready(r) = Pin::as_mut(f).poll(cx) {
                    *out = Some(r);
                    *slot = None;
                }
            }
        }
        if pending.iter().all(Option::is_none) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

/// The first error of the parts' results (an unreachable database fails the whole request), or
/// every value.
fn all_ok<T>(results: Vec<Result<T, JournalError>>) -> Result<Vec<T>, JournalError> {
    results.into_iter().collect()
}

impl Journal for SplitJournal {
    fn raise_fence(&self, fence: &Fence) -> BoxFuture<'_, Result<Epoch, JournalError>> {
        let fence = fence.clone();
        Box::pin(async move {
            let raised = all_ok(on_all(self.parts.iter().map(|p| p.raise_fence(&fence)).collect()).await)?;
            // Some part may hold a newer owner's fence: the newest one is the answer.
            raised.into_iter().max().ok_or_else(|| JournalError::Failed("a split journal without parts".into()))
        })
    }

    fn append(&self, request: AppendRequest) -> BoxFuture<'_, Result<u64, JournalError>> {
        self.of(&request.persistence_id).append(request)
    }

    fn read_page(
        &self,
        persistence_id: &str,
        from: u64,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<StoredEvent>, JournalError>> {
        self.of(persistence_id).read_page(persistence_id, from, max)
    }

    fn last_seq(&self, persistence_id: &str) -> BoxFuture<'_, Result<u64, JournalError>> {
        self.of(persistence_id).last_seq(persistence_id)
    }

    fn save_snapshot(
        &self,
        fence: &Fence,
        persistence_id: &str,
        snapshot: Snapshot,
    ) -> BoxFuture<'_, Result<(), JournalError>> {
        self.of(persistence_id).save_snapshot(fence, persistence_id, snapshot)
    }

    fn load_snapshot(&self, persistence_id: &str) -> BoxFuture<'_, Result<Option<Snapshot>, JournalError>> {
        self.of(persistence_id).load_snapshot(persistence_id)
    }

    fn recorded_reply(
        &self,
        persistence_id: &str,
        request_id: &str,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, JournalError>> {
        self.of(persistence_id).recorded_reply(persistence_id, request_id)
    }

    fn recorded_replies(
        &self,
        persistence_id: &str,
        newest: usize,
    ) -> BoxFuture<'_, Result<Vec<RecordedReply>, JournalError>> {
        self.of(persistence_id).recorded_replies(persistence_id, newest)
    }

    fn remembered(&self, type_key: &str, shard: ShardId) -> BoxFuture<'_, Result<Vec<String>, JournalError>> {
        let type_key = type_key.to_string();
        Box::pin(async move {
            let parts = all_ok(on_all(self.parts.iter().map(|p| p.remembered(&type_key, shard)).collect()).await)?;
            let mut ids: Vec<String> = parts.into_iter().flatten().collect();
            ids.sort();
            ids.dedup();
            Ok(ids)
        })
    }

    fn forget(&self, fence: &Fence, entity_id: &str) -> BoxFuture<'_, Result<(), JournalError>> {
        // Remembered in the part of its persistence id, which this journal cannot name from an
        // entity id (the entity type makes it): forgotten in every part, which is rare enough.
        let (fence, entity_id) = (fence.clone(), entity_id.to_string());
        Box::pin(async move {
            all_ok(on_all(self.parts.iter().map(|p| p.forget(&fence, &entity_id)).collect()).await)?;
            Ok(())
        })
    }

    fn change_reminders(&self, fence: &Fence, changes: Vec<ReminderChange>) -> BoxFuture<'_, Result<(), JournalError>> {
        // Each entity's reminders live in the part of its persistence id, with its events.
        let mut by_part: Vec<Vec<ReminderChange>> = vec![Vec::new(); self.parts.len()];
        for c in changes {
            let pid = persistence_id(&fence.type_key, c.entity_id());
            by_part[part_of(&pid, self.parts.len())].push(c);
        }
        let fence = fence.clone();
        Box::pin(async move {
            let calls = self
                .parts
                .iter()
                .zip(by_part)
                .filter(|(_, c)| !c.is_empty())
                .map(|(p, c)| p.change_reminders(&fence, c))
                .collect();
            all_ok(on_all(calls).await)?;
            Ok(())
        })
    }

    fn due_reminders(
        &self,
        type_key: &str,
        shard: ShardId,
        after: Option<ReminderPosition>,
        until_ms: u64,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<StoredReminder>, JournalError>> {
        let type_key = type_key.to_string();
        Box::pin(async move {
            let calls =
                self.parts.iter().map(|p| p.due_reminders(&type_key, shard, after.clone(), until_ms, max)).collect();
            // The first `max` of the parts' first `max` each, in order: nothing past the page's
            // last is skipped, since every part's earlier ones are in its own page.
            let mut all: Vec<StoredReminder> = all_ok(on_all(calls).await)?.into_iter().flatten().collect();
            all.sort_by_key(|r| r.position());
            all.truncate(max);
            Ok(all)
        })
    }

    fn highest_term(&self) -> BoxFuture<'_, Result<u64, JournalError>> {
        Box::pin(async move {
            let terms = all_ok(on_all(self.parts.iter().map(|p| p.highest_term()).collect()).await)?;
            Ok(terms.into_iter().max().unwrap_or(0))
        })
    }
}
