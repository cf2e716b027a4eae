//! `ask_retrying`: attempts that time out while their command commits are answered by the first
//! reply, and the command is applied once; a command that never gets through fails with the last
//! attempt's timeout; a last attempt refused after one that may have been applied says the
//! outcome is unknown. An entity asks an event-sourced one the same way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline::journal::{
    AppendRequest, BoxFuture, Fence, InMemoryJournal, Journal, JournalError, RecordedReply, ReminderChange,
    ReminderPosition, Snapshot, StoredEvent, StoredReminder,
};
use shardline::{
    Cluster, Entity, EntityContext, EntityId, EntitySettings, Error, EventSourced, EventSourcedSettings, RetryPolicy,
    ShardId,
};

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

/// The first attempt times out while its command commits; the next waits in the entity's
/// one-place mailbox and times out too; the last is refused at once (the mailbox is full), an
/// error that says "not processed" of itself. The command commits all the same: the verdict
/// must say it may have been applied, not pass the last refusal on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_attempt_refused_after_one_that_timed_out_is_of_unknown_outcome() {
    let journal = Slow { inner: InMemoryJournal::new(), delay_ms: Arc::new(AtomicU64::new(1_500)) };
    let a = Cluster::builder().cluster_name("retrying-verdict").build().await.unwrap();
    let settings = EntitySettings::new("total").shards(4).mailbox(1).journal(journal.clone());
    let totals = a.register_event_sourced::<Total>(settings, EventSourcedSettings::default()).await.unwrap();
    let hasty = RetryPolicy {
        attempts: 3,
        timeout: Duration::from_millis(200),
        first_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(10),
    };
    let r = totals.ask_retrying("t", 7, hasty).await;
    assert!(matches!(&r, Err(Error::OutcomeUnknown(m)) if m.contains("full")), "{r:?}");
    assert_eq!(r.unwrap_err().processed(), shardline::Processed::Maybe);
    journal.delay_ms.store(0, Ordering::SeqCst);
    let started = std::time::Instant::now();
    while journal.inner.read("total|t", 1).await.unwrap().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(10), "the first attempt never committed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.leave().await.unwrap();
}

/// A plain entity that pays into a `Total` from its handler: it finds the event-sourced type
/// among its node's types and asks it as any caller does, with one error to handle.
struct Cashier;

impl Entity for Cashier {
    type Message = u64;
    type Reply = Result<u64, String>;

    fn new(_id: &EntityId) -> Self {
        Cashier
    }

    async fn handle(&mut self, ctx: &mut EntityContext, amount: u64) -> Result<u64, String> {
        let totals = ctx.entities().event_sourced::<Total>().ok_or("no totals on this node")?;
        totals.ask_retrying("till", amount, RetryPolicy::default()).await.map_err(|e| e.to_string())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entity_asks_an_event_sourced_one() {
    let a = Cluster::builder().cluster_name("cashiers").build().await.unwrap();
    let settings = EntitySettings::new("total").shards(4).journal(InMemoryJournal::new());
    a.register_event_sourced::<Total>(settings, EventSourcedSettings::default()).await.unwrap();
    let cashiers = a.register::<Cashier>(EntitySettings::new("cashier").shards(4)).await.unwrap();
    assert_eq!(cashiers.entity_ref("c1").ask(5).await, Ok(Ok(5)));
    assert_eq!(cashiers.entity_ref("c2").ask(3).await, Ok(Ok(8)));
    a.leave().await.unwrap();
}
