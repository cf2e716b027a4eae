//! `QueuedJournal`: a journal whose database work runs in one writer (a thread or a task) that
//! takes requests from a bounded queue, so that it can group the requests waiting into one
//! transaction. Database backends implement only that writer; the queue, the request types and
//! the rule "answer after the commit" live here once.

use shardline_core::{Epoch, ShardId};
use tokio::sync::{mpsc, oneshot};

use super::{
    AppendRequest, BoxFuture, Fence, Journal, JournalError, RecordedReply, ReminderChange, ReminderPosition, Snapshot,
    StoredEvent, StoredReminder,
};

/// Where a request's answer goes.
pub type Reply<T> = oneshot::Sender<Result<T, JournalError>>;

/// One request to a journal's writer.
pub enum Job {
    /// [`Journal::raise_fence`].
    RaiseFence(Fence, Reply<Epoch>),
    /// [`Journal::append`].
    Append(Box<AppendRequest>, Reply<u64>),
    /// [`Journal::read_page`]: persistence id, first sequence number, most events.
    Read(String, u64, usize, Reply<Vec<StoredEvent>>),
    /// [`Journal::last_seq`]: persistence id.
    LastSeq(String, Reply<u64>),
    /// [`Journal::save_snapshot`]: fence, persistence id, snapshot.
    SaveSnapshot(Fence, String, Snapshot, Reply<()>),
    /// [`Journal::load_snapshot`]: persistence id.
    LoadSnapshot(String, Reply<Option<Snapshot>>),
    /// [`Journal::recorded_reply`]: persistence id, request id.
    RecordedReply(String, String, Reply<Option<Vec<u8>>>),
    /// [`Journal::recorded_replies`]: persistence id, how many of the newest.
    RecordedReplies(String, usize, Reply<Vec<RecordedReply>>),
    /// [`Journal::remembered`]: entity type, shard.
    Remembered(String, ShardId, Reply<Vec<String>>),
    /// [`Journal::forget`]: fence, entity id.
    Forget(Fence, String, Reply<()>),
    /// [`Journal::highest_term`].
    HighestTerm(Reply<u64>),
    /// [`Journal::change_reminders`]: fence, changes.
    ChangeReminders(Fence, Vec<ReminderChange>, Reply<()>),
    /// [`Journal::due_reminders`].
    DueReminders(Box<DueReminders>, Reply<Vec<StoredReminder>>),
}

/// The arguments of [`Journal::due_reminders`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueReminders {
    /// The entity type.
    pub type_key: String,
    /// The shard.
    pub shard: ShardId,
    /// Start after this position (from the first when None).
    pub after: Option<ReminderPosition>,
    /// Only reminders due before this, in milliseconds since the Unix epoch.
    pub until_ms: u64,
    /// At most this many.
    pub max: usize,
}

impl Job {
    /// Answers the request with an error: nothing of it happened.
    pub fn fail(self, e: JournalError) {
        Outcome::failed(self, e).answer(&Ok(()));
    }
}

/// A request's result, held until the fate of its transaction is known.
pub enum Outcome {
    /// Of `RaiseFence`.
    Epoch(Reply<Epoch>, Result<Epoch, JournalError>),
    /// Of `Append`, `LastSeq` and `HighestTerm`.
    Seq(Reply<u64>, Result<u64, JournalError>),
    /// Of `Read`.
    Events(Reply<Vec<StoredEvent>>, Result<Vec<StoredEvent>, JournalError>),
    /// Of `SaveSnapshot` and `Forget`.
    Unit(Reply<()>, Result<(), JournalError>),
    /// Of `LoadSnapshot`.
    Snapshot(Reply<Option<Snapshot>>, Result<Option<Snapshot>, JournalError>),
    /// Of `RecordedReply`.
    Bytes(Reply<Option<Vec<u8>>>, Result<Option<Vec<u8>>, JournalError>),
    /// Of `RecordedReplies`.
    Replies(Reply<Vec<RecordedReply>>, Result<Vec<RecordedReply>, JournalError>),
    /// Of `Remembered`.
    Ids(Reply<Vec<String>>, Result<Vec<String>, JournalError>),
    /// Of `DueReminders`.
    Reminders(Reply<Vec<StoredReminder>>, Result<Vec<StoredReminder>, JournalError>),
}

impl Outcome {
    /// The outcome of a request that failed as a whole.
    pub fn failed(job: Job, e: JournalError) -> Outcome {
        match job {
            Job::RaiseFence(_, r) => Outcome::Epoch(r, Err(e)),
            Job::Append(_, r) | Job::LastSeq(_, r) | Job::HighestTerm(r) => Outcome::Seq(r, Err(e)),
            Job::Read(_, _, _, r) => Outcome::Events(r, Err(e)),
            Job::SaveSnapshot(_, _, _, r) | Job::Forget(_, _, r) | Job::ChangeReminders(_, _, r) => {
                Outcome::Unit(r, Err(e))
            }
            Job::DueReminders(_, r) => Outcome::Reminders(r, Err(e)),
            Job::LoadSnapshot(_, r) => Outcome::Snapshot(r, Err(e)),
            Job::RecordedReply(_, _, r) => Outcome::Bytes(r, Err(e)),
            Job::RecordedReplies(_, _, r) => Outcome::Replies(r, Err(e)),
            Job::Remembered(_, _, r) => Outcome::Ids(r, Err(e)),
        }
    }

    /// Answers with the request's result once its transaction committed, or with the commit's
    /// error: nothing is acknowledged before it is durable.
    pub fn answer(self, commit: &Result<(), JournalError>) {
        fn send<T>(r: Reply<T>, v: Result<T, JournalError>, c: &Result<(), JournalError>) {
            let _ = r.send(c.clone().and(v));
        }
        match self {
            Outcome::Epoch(r, v) => send(r, v, commit),
            Outcome::Seq(r, v) => send(r, v, commit),
            Outcome::Events(r, v) => send(r, v, commit),
            Outcome::Unit(r, v) => send(r, v, commit),
            Outcome::Snapshot(r, v) => send(r, v, commit),
            Outcome::Bytes(r, v) => send(r, v, commit),
            Outcome::Replies(r, v) => send(r, v, commit),
            Outcome::Ids(r, v) => send(r, v, commit),
            Outcome::Reminders(r, v) => send(r, v, commit),
        }
    }
}

/// A journal served by a writer that takes [`Job`]s from a queue. Cheap to clone.
#[derive(Clone)]
pub struct QueuedJournal {
    tx: mpsc::Sender<Job>,
}

impl QueuedJournal {
    /// A journal and the receiving end of its queue (at most `capacity` requests wait; more are
    /// refused as `Unavailable`), for the backend's writer.
    pub fn new(capacity: usize) -> (QueuedJournal, mpsc::Receiver<Job>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (QueuedJournal { tx }, rx)
    }

    fn call<T: Send + 'static>(&self, job: impl FnOnce(Reply<T>) -> Job) -> BoxFuture<'_, Result<T, JournalError>> {
        let (reply, rx) = oneshot::channel();
        let sent = self.tx.try_send(job(reply));
        Box::pin(async move {
            match sent {
                Ok(()) => {
                    rx.await.unwrap_or_else(|_| Err(JournalError::Unavailable("the journal's writer stopped".into())))
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    Err(JournalError::Unavailable("the journal's queue is full".into()))
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    Err(JournalError::Unavailable("the journal's writer stopped".into()))
                }
            }
        })
    }
}

impl Journal for QueuedJournal {
    fn raise_fence(&self, fence: &Fence) -> BoxFuture<'_, Result<Epoch, JournalError>> {
        let f = fence.clone();
        self.call(|r| Job::RaiseFence(f, r))
    }

    fn append(&self, request: AppendRequest) -> BoxFuture<'_, Result<u64, JournalError>> {
        self.call(|r| Job::Append(Box::new(request), r))
    }

    fn read_page(
        &self,
        persistence_id: &str,
        from: u64,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<StoredEvent>, JournalError>> {
        let pid = persistence_id.to_string();
        self.call(|r| Job::Read(pid, from, max, r))
    }

    fn last_seq(&self, persistence_id: &str) -> BoxFuture<'_, Result<u64, JournalError>> {
        let pid = persistence_id.to_string();
        self.call(|r| Job::LastSeq(pid, r))
    }

    fn save_snapshot(
        &self,
        fence: &Fence,
        persistence_id: &str,
        snapshot: Snapshot,
    ) -> BoxFuture<'_, Result<(), JournalError>> {
        let (f, pid) = (fence.clone(), persistence_id.to_string());
        self.call(|r| Job::SaveSnapshot(f, pid, snapshot, r))
    }

    fn load_snapshot(&self, persistence_id: &str) -> BoxFuture<'_, Result<Option<Snapshot>, JournalError>> {
        let pid = persistence_id.to_string();
        self.call(|r| Job::LoadSnapshot(pid, r))
    }

    fn recorded_reply(
        &self,
        persistence_id: &str,
        request_id: &str,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, JournalError>> {
        let (pid, id) = (persistence_id.to_string(), request_id.to_string());
        self.call(|r| Job::RecordedReply(pid, id, r))
    }

    fn recorded_replies(
        &self,
        persistence_id: &str,
        newest: usize,
    ) -> BoxFuture<'_, Result<Vec<RecordedReply>, JournalError>> {
        let pid = persistence_id.to_string();
        self.call(|r| Job::RecordedReplies(pid, newest, r))
    }

    fn remembered(&self, type_key: &str, shard: ShardId) -> BoxFuture<'_, Result<Vec<String>, JournalError>> {
        let t = type_key.to_string();
        self.call(|r| Job::Remembered(t, shard, r))
    }

    fn forget(&self, fence: &Fence, entity_id: &str) -> BoxFuture<'_, Result<(), JournalError>> {
        let (f, id) = (fence.clone(), entity_id.to_string());
        self.call(|r| Job::Forget(f, id, r))
    }

    fn change_reminders(&self, fence: &Fence, changes: Vec<ReminderChange>) -> BoxFuture<'_, Result<(), JournalError>> {
        let f = fence.clone();
        self.call(|r| Job::ChangeReminders(f, changes, r))
    }

    fn due_reminders(
        &self,
        type_key: &str,
        shard: ShardId,
        after: Option<ReminderPosition>,
        until_ms: u64,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<StoredReminder>, JournalError>> {
        let args = DueReminders { type_key: type_key.to_string(), shard, after, until_ms, max };
        self.call(|r| Job::DueReminders(Box::new(args), r))
    }

    fn highest_term(&self) -> BoxFuture<'_, Result<u64, JournalError>> {
        self.call(Job::HighestTerm)
    }
}
