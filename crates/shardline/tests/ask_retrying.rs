//! `ask_retrying`: attempts that time out while their command commits are answered by the first
//! reply, and the command is applied once; a command that never gets through fails with the last
//! attempt's timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline::journal::{
    AppendRequest, BoxFuture, Fence, InMemoryJournal, Journal, JournalError, RecordedReply, ReminderChange,
    ReminderPosition, Snapshot, StoredEvent, StoredReminder,
};
use shardline::{Cluster, EntityId, EntitySettings, Error, EventSourced, EventSourcedSettings, RetryPolicy, ShardId};

#[derive(Default, Serialize, Deserialize)]
struct Total(u64);

impl EventSourced for Total {
    type Command = u64;
    type Event = u64;
    type Reply = u64;
    const EVENT_TYPE: &'static str = "total";
    fn empty(_id: &EntityId) -> Self {
        Total(0)
    }
    fn apply(&mut self, k: &u64) {
        self.0 += k;
    }
    fn decide(&self, k: u64) -> (Vec<u64>, u64) {
        (vec![k], self.0 + k)
    }
}

/// Every append waits `delay_ms` before it commits.
#[derive(Clone)]
struct Slow {
    inner: InMemoryJournal,
    delay_ms: Arc<AtomicU64>,
}

impl Journal for Slow {
    fn raise_fence(&self, fence: &Fence) -> BoxFuture<'_, Result<shardline::Epoch, JournalError>> {
        self.inner.raise_fence(fence)
    }
    fn append(&self, request: AppendRequest) -> BoxFuture<'_, Result<u64, JournalError>> {
        let delay = Duration::from_millis(self.delay_ms.load(Ordering::SeqCst));
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            self.inner.append(request).await
        })
    }
    fn read_page(&self, pid: &str, from: u64, max: usize) -> BoxFuture<'_, Result<Vec<StoredEvent>, JournalError>> {
        self.inner.read_page(pid, from, max)
    }
    fn last_seq(&self, pid: &str) -> BoxFuture<'_, Result<u64, JournalError>> {
        self.inner.last_seq(pid)
    }
    fn save_snapshot(&self, fence: &Fence, pid: &str, s: Snapshot) -> BoxFuture<'_, Result<(), JournalError>> {
        self.inner.save_snapshot(fence, pid, s)
    }
    fn load_snapshot(&self, pid: &str) -> BoxFuture<'_, Result<Option<Snapshot>, JournalError>> {
        self.inner.load_snapshot(pid)
    }
    fn recorded_reply(&self, pid: &str, id: &str) -> BoxFuture<'_, Result<Option<Vec<u8>>, JournalError>> {
        self.inner.recorded_reply(pid, id)
    }
    fn recorded_replies(&self, pid: &str, newest: usize) -> BoxFuture<'_, Result<Vec<RecordedReply>, JournalError>> {
        self.inner.recorded_replies(pid, newest)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_that_time_out_while_the_command_commits_apply_it_once() {
    let journal = Slow { inner: InMemoryJournal::new(), delay_ms: Arc::new(AtomicU64::new(600)) };
    let a = Cluster::builder().cluster_name("retrying").build().await.unwrap();
    let settings = EntitySettings::new("total").shards(4).journal(journal.clone());
    let totals = a.register_event_sourced::<Total>(settings, EventSourcedSettings::default()).await.unwrap();
    // Each attempt waits 100 ms; the first commit takes 600 ms, so several attempts time out
    // while it commits, and a later one is answered with its reply.
    let patient = RetryPolicy { attempts: 20, timeout: Duration::from_millis(100), ..RetryPolicy::default() };
    assert_eq!(totals.ask_retrying("t", 5, patient).await, Ok(5));
    journal.delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(totals.ask_retrying("t", 1, patient).await, Ok(6), "the first command was applied once");
    assert_eq!(journal.inner.read("total|t", 1).await.unwrap().len(), 2);

    // A commit slower than every attempt: the last attempt's timeout, and it is still applied
    // once when it commits.
    journal.delay_ms.store(2_000, Ordering::SeqCst);
    let hasty = RetryPolicy { attempts: 3, timeout: Duration::from_millis(100), ..RetryPolicy::default() };
    assert_eq!(totals.ask_retrying("t", 10, hasty).await, Err(Error::Timeout(Duration::from_millis(100))));
    journal.delay_ms.store(0, Ordering::SeqCst);
    let started = std::time::Instant::now();
    while journal.inner.read("total|t", 1).await.unwrap().len() < 3 {
        assert!(started.elapsed() < Duration::from_secs(10), "the timed-out command never committed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(totals.ask_retrying("t", 0, patient).await, Ok(16));
    a.leave().await.unwrap();
}
