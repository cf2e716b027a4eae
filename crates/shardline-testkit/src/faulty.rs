//! The shared in-memory journal, with the real fencing and request-id rules, behind the faults
//! of a database the world can switch on: slow commits, and commits whose answer is lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardline::journal::{
    AppendRequest, Fence, InMemoryJournal, Journal, JournalError, RecordedReply, ReminderChange, ReminderPosition,
    Snapshot, StoredEvent, StoredReminder,
};
use shardline::membership::BoxFuture;
use shardline::{Epoch, ShardId};

/// What the journal does wrong now.
#[derive(Debug, Default)]
pub struct JournalFaults {
    /// Every append takes this long before it commits.
    pub delay_ms: u64,
    /// This percentage of the appends that commit answer `CommitUnknown` instead.
    pub unknown_pct: u64,
    /// Counts appends, to pick the unlucky ones without a generator of its own.
    pub appends: u64,
}

/// The shared in-memory journal behind the faults of [`JournalFaults`].
pub struct FaultyJournal {
    inner: Arc<InMemoryJournal>,
    faults: Arc<Mutex<JournalFaults>>,
}

impl FaultyJournal {
    /// `inner`, failing as `faults` says when each call is made.
    pub fn new(inner: Arc<InMemoryJournal>, faults: Arc<Mutex<JournalFaults>>) -> Self {
        FaultyJournal { inner, faults }
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, JournalFaults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Journal for FaultyJournal {
    fn raise_fence(&self, fence: &Fence) -> BoxFuture<'_, Result<Epoch, JournalError>> {
        self.inner.raise_fence(fence)
    }

    fn append(&self, request: AppendRequest) -> BoxFuture<'_, Result<u64, JournalError>> {
        let delay = self.faults().delay_ms;
        Box::pin(async move {
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let r = self.inner.append(request).await;
            let lose_answer = {
                let mut f = self.faults();
                f.appends += 1;
                // A spread that no append rate lines up with: 7919 is prime.
                f.unknown_pct > 0 && (f.appends * 7919) % 100 < f.unknown_pct
            };
            match r {
                Ok(_) if lose_answer => {
                    Err(JournalError::CommitUnknown("the connection broke during the commit".into()))
                }
                r => r,
            }
        })
    }

    fn read_page(
        &self,
        persistence_id: &str,
        from: u64,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<StoredEvent>, JournalError>> {
        self.inner.read_page(persistence_id, from, max)
    }

    fn last_seq(&self, persistence_id: &str) -> BoxFuture<'_, Result<u64, JournalError>> {
        self.inner.last_seq(persistence_id)
    }

    fn save_snapshot(
        &self,
        fence: &Fence,
        persistence_id: &str,
        snapshot: Snapshot,
    ) -> BoxFuture<'_, Result<(), JournalError>> {
        self.inner.save_snapshot(fence, persistence_id, snapshot)
    }

    fn load_snapshot(&self, persistence_id: &str) -> BoxFuture<'_, Result<Option<Snapshot>, JournalError>> {
        self.inner.load_snapshot(persistence_id)
    }

    fn recorded_reply(
        &self,
        persistence_id: &str,
        request_id: &str,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, JournalError>> {
        self.inner.recorded_reply(persistence_id, request_id)
    }

    fn recorded_replies(
        &self,
        persistence_id: &str,
        newest: usize,
    ) -> BoxFuture<'_, Result<Vec<RecordedReply>, JournalError>> {
        self.inner.recorded_replies(persistence_id, newest)
    }

    fn remembered(&self, type_key: &str, shard: ShardId) -> BoxFuture<'_, Result<Vec<String>, JournalError>> {
        self.inner.remembered(type_key, shard)
    }

    fn forget(&self, fence: &Fence, entity_id: &str) -> BoxFuture<'_, Result<(), JournalError>> {
        self.inner.forget(fence, entity_id)
    }

    fn change_reminders(&self, fence: &Fence, changes: Vec<ReminderChange>) -> BoxFuture<'_, Result<(), JournalError>> {
        self.inner.change_reminders(fence, changes)
    }

    fn due_reminders(
        &self,
        type_key: &str,
        shard: ShardId,
        after: Option<ReminderPosition>,
        until_ms: u64,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<StoredReminder>, JournalError>> {
        self.inner.due_reminders(type_key, shard, after, until_ms, max)
    }

    fn highest_term(&self) -> BoxFuture<'_, Result<u64, JournalError>> {
        self.inner.highest_term()
    }
}
