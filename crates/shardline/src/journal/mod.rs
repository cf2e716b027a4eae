//! Layer 4's storage: the event journal of durable entities.
//!
//! A [`Journal`] keeps, per persistence id (one entity of one type), a gap-free sequence of
//! events, the latest snapshot, the replies to the requests those events answered, and per shard
//! the set of *remembered* entities (those started again when their shard starts). One trait,
//! three implementations: [`InMemoryJournal`] here, SQLite (embedded, one file several node
//! processes can share) and PostgreSQL in their own crates. One conformance suite
//! (`journal::conformance`) runs against all three, and so do the end-to-end failure drills
//! (`journal::drills`); both are behind the `test-support` feature, for backends' tests.
//!
//! **Fencing.** The shard's epoch is the journal's fencing token, checked by the database itself.
//! A node that starts hosting shard S at epoch e first calls [`Journal::raise_fence`] (the stored
//! fence only grows). Every write carries its [`Fence`] and is refused with
//! [`JournalError::Fenced`], inside the transaction that would have written, when the stored fence
//! is newer. So a node that was paused, partitioned or slow to learn that it lost S can never add
//! to S's history, whatever the membership believed.
//!
//! **Several databases.** [`SplitJournal`] spreads the persistence ids over several journals by
//! slice, each entity's whole history in one of them; fences are raised in all.
//!
//! **Sequence numbers.** An append names the sequence number of the last event its writer saw; a
//! stale one is [`JournalError::Conflict`], never a duplicate or a gap.

#[cfg(feature = "test-support")]
pub mod conformance;
mod memory;
pub mod queue;
mod reminders;
mod request_id;
pub mod split;

use std::future::Future;
use std::pin::Pin;

use shardline_core::{Epoch, ShardId};

pub use memory::InMemoryJournal;
pub use queue::QueuedJournal;
pub use reminders::{ReminderChange, ReminderPosition, StoredReminder, MAX_DUE_MS};
pub use request_id::RequestId;
pub use split::{part_of, SplitJournal, SLICES};

/// The persistence id of an entity: its type and id.
pub fn persistence_id(type_key: &str, id: &str) -> String {
    format!("{type_key}|{id}")
}

/// A boxed future, for object-safe journals.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Who writes: a shard of an entity type, hosted at an epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The entity type.
    pub type_key: String,
    /// The shard.
    pub shard: ShardId,
    /// The epoch the writer hosts the shard at.
    pub epoch: Epoch,
}

impl Fence {
    /// The rule every journal applies before a write: the writer's epoch must be at least the
    /// stored fence, and a fence must have been raised at all (a writer claims its shard first).
    ///
    /// ```
    /// use shardline::journal::Fence;
    /// use shardline::{Epoch, ShardId};
    ///
    /// let f = Fence { type_key: "t".into(), shard: ShardId(0), epoch: Epoch { term: 2, seq: 1 } };
    /// assert!(f.admitted_by(Some(Epoch { term: 1, seq: 9 })).is_ok());
    /// assert!(f.admitted_by(Some(Epoch { term: 3, seq: 0 })).is_err());
    /// assert!(f.admitted_by(None).is_err());
    /// ```
    pub fn admitted_by(&self, stored: Option<Epoch>) -> Result<(), JournalError> {
        match stored {
            Some(s) if s <= self.epoch => Ok(()),
            _ => Err(JournalError::Fenced {
                type_key: self.type_key.clone(),
                shard: self.shard,
                stored,
                mine: self.epoch,
            }),
        }
    }
}

/// One event to append: its type name and schema version travel with it, so a reader can refuse
/// what it does not know instead of misreading it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRecord {
    /// The event's type name.
    pub type_name: String,
    /// Version of the event's schema.
    pub schema_version: u32,
    /// The encoded event.
    pub payload: Vec<u8>,
}

/// An event as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEvent {
    /// Its sequence number (1 for the first event of a persistence id).
    pub seq: u64,
    /// The event.
    pub event: EventRecord,
}

/// The reply an append answered, kept with its events so that a retried request gets it back
/// instead of being applied again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedReply {
    /// The request's id.
    pub request_id: String,
    /// The encoded reply.
    pub reply: Vec<u8>,
}

/// An append: events for one persistence id, written in one transaction with everything else
/// named here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRequest {
    /// The writer.
    pub fence: Fence,
    /// The persistence id (one entity of one type).
    pub persistence_id: String,
    /// The entity's id, for the remembered set.
    pub entity_id: String,
    /// Sequence number of the last event the writer knows (0: none).
    pub expected_seq: u64,
    /// The events, in order (may be empty, e.g. to record a reply or remember an entity).
    pub events: Vec<EventRecord>,
    /// Add the entity to its shard's remembered set in the same transaction.
    pub remember: bool,
    /// Record this reply in the same transaction.
    pub reply: Option<RecordedReply>,
    /// How long replies are kept: those of the persistence id recorded longer ago than this, by
    /// the journal's clock, are dropped in the same transaction. A retry is recognised exactly
    /// as long as its reply is kept, however many other requests came between.
    pub keep_replies: std::time::Duration,
    /// Reminders of this entity set, cancelled or acknowledged in the same transaction (fenced
    /// by the same shard).
    pub reminders: Vec<ReminderChange>,
}

/// A snapshot of an entity's state after event `seq`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The last event folded into it.
    pub seq: u64,
    /// Schema version of the encoded state.
    pub schema_version: u32,
    /// The encoded state.
    pub payload: Vec<u8>,
}

/// What went wrong, and for writes whether anything was written: every error of an append means
/// nothing of it was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// A newer owner raised the shard's fence: this writer no longer owns the shard.
    #[error("shard {shard} of {type_key} is fenced at {stored:?}; the writer holds {mine}")]
    Fenced {
        /// The entity type.
        type_key: String,
        /// The shard.
        shard: ShardId,
        /// The stored fence (None: no owner ever raised it).
        stored: Option<Epoch>,
        /// The writer's epoch.
        mine: Epoch,
    },
    /// The expected sequence number is not the last one: another writer appended first.
    #[error("{persistence_id}: expected last event {expected}, found {actual}")]
    Conflict {
        /// The persistence id.
        persistence_id: String,
        /// What the writer expected.
        expected: u64,
        /// What is stored.
        actual: u64,
    },
    /// A stored record cannot be read.
    #[error("{persistence_id} event {seq}: {reason}")]
    Corrupt {
        /// The persistence id.
        persistence_id: String,
        /// The sequence number (0: the snapshot or another record).
        seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// The database cannot be reached or did not answer in time. Nothing was written.
    #[error("journal unavailable: {0}")]
    Unavailable(String),
    /// The database refused the operation for another reason. Nothing was written.
    #[error("journal error: {0}")]
    Failed(String),
    /// The append carries a request id whose reply is still recorded: that request was applied
    /// already, and this append wrote nothing. Checked in the append's own transaction, so a
    /// retry is never applied twice, whatever the writer believed it had (a recovery that raced
    /// another writer, a state older than the journal); `reply` is the recorded one.
    #[error("{persistence_id}: request {request_id} was applied already")]
    Duplicate {
        /// The persistence id.
        persistence_id: String,
        /// The request id.
        request_id: String,
        /// The reply recorded when it was applied.
        reply: Vec<u8>,
    },
    /// The connection was lost while the write was being committed: it may or may not be stored.
    /// Trying the same append again tells which (it is a `Conflict` if the first went through).
    #[error("journal commit outcome unknown: {0}")]
    CommitUnknown(String),
}

impl JournalError {
    /// Whether trying again later may succeed (the database was down or busy).
    pub fn is_transient(&self) -> bool {
        matches!(self, JournalError::Unavailable(_))
    }
}

/// How many events a recovery reads at a time (see [`Journal::read_page`]): about 100 bytes
/// each in memory, so a page is a few hundred kilobytes.
pub const READ_PAGE: usize = 4096;

/// Where durable entities keep their events. See the [module docs](self).
pub trait Journal: Send + Sync + 'static {
    /// Raises the stored fence of a shard to `fence.epoch` (never lowers it) and returns the
    /// fence stored afterwards: when it is newer than `fence.epoch`, a newer owner exists.
    fn raise_fence(&self, fence: &Fence) -> BoxFuture<'_, Result<Epoch, JournalError>>;

    /// Appends events (and records, remembers) in one transaction. Returns the sequence number
    /// of the last event stored for the persistence id. Fails with `Fenced` when the shard's
    /// stored fence is newer than (or was never raised to) the writer's epoch, with `Conflict`
    /// when `expected_seq` is not the last stored sequence number.
    fn append(&self, request: AppendRequest) -> BoxFuture<'_, Result<u64, JournalError>>;

    /// At most `max` events of a persistence id from sequence number `from` (inclusive), in
    /// order: fewer than `max` means there are no more. Recovery reads a history a page at a
    /// time, so that it holds one page in memory however long the history is.
    fn read_page(
        &self,
        persistence_id: &str,
        from: u64,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<StoredEvent>, JournalError>>;

    /// Every event of a persistence id from sequence number `from` (inclusive), in order, read a
    /// page ([`READ_PAGE`] events) at a time. It holds the whole history in memory: for tools and
    /// tests, not for recovery.
    fn read(&self, persistence_id: &str, from: u64) -> BoxFuture<'_, Result<Vec<StoredEvent>, JournalError>> {
        let pid = persistence_id.to_string();
        Box::pin(async move {
            let (mut events, mut next) = (Vec::new(), from);
            loop {
                let page = self.read_page(&pid, next, READ_PAGE).await?;
                let full = page.len() >= READ_PAGE;
                next = page.last().map_or(next, |e| e.seq.saturating_add(1));
                events.extend(page);
                if !full {
                    return Ok(events);
                }
            }
        })
    }

    /// The sequence number of the last event of a persistence id (0: none): what a write that
    /// needs no state appends after, without reading the history.
    fn last_seq(&self, persistence_id: &str) -> BoxFuture<'_, Result<u64, JournalError>>;

    /// Keeps `snapshot` as the latest of the persistence id (fenced like an append; an older
    /// snapshot than the stored one is ignored).
    fn save_snapshot(
        &self,
        fence: &Fence,
        persistence_id: &str,
        snapshot: Snapshot,
    ) -> BoxFuture<'_, Result<(), JournalError>>;

    /// The latest snapshot of the persistence id.
    fn load_snapshot(&self, persistence_id: &str) -> BoxFuture<'_, Result<Option<Snapshot>, JournalError>>;

    /// The reply recorded for a request, if it is still kept.
    fn recorded_reply(
        &self,
        persistence_id: &str,
        request_id: &str,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, JournalError>>;

    /// The `newest` replies recorded last for a persistence id (fewer when it has fewer), oldest
    /// first: an entity loads them when it recovers and answers most retries from memory after
    /// that; a retry it does not find there is still refused by [`append`](Self::append).
    fn recorded_replies(
        &self,
        persistence_id: &str,
        newest: usize,
    ) -> BoxFuture<'_, Result<Vec<RecordedReply>, JournalError>>;

    /// The entities remembered in a shard.
    fn remembered(&self, type_key: &str, shard: ShardId) -> BoxFuture<'_, Result<Vec<String>, JournalError>>;

    /// Removes an entity from its shard's remembered set (fenced).
    fn forget(&self, fence: &Fence, entity_id: &str) -> BoxFuture<'_, Result<(), JournalError>>;

    /// Applies reminder changes of the fence's shard's entities in one transaction (fenced: a
    /// writer that no longer owns the shard changes nothing). A due time above [`MAX_DUE_MS`]
    /// is refused as `Failed`.
    fn change_reminders(&self, fence: &Fence, changes: Vec<ReminderChange>) -> BoxFuture<'_, Result<(), JournalError>>;

    /// At most `max` reminders of a shard's entities due before `until_ms`, in the order of
    /// [`ReminderPosition`], starting after `after` (from the first when None): an owner reads
    /// the reminders due soon a page at a time from an index, never all that are pending.
    fn due_reminders(
        &self,
        type_key: &str,
        shard: ShardId,
        after: Option<ReminderPosition>,
        until_ms: u64,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<StoredReminder>, JournalError>>;

    /// The highest term of any stored fence (0: none raised yet). A membership whose terms do
    /// not outlive the cluster (seeds) starts above it, so that a cluster restarted from scratch
    /// is not fenced out by its earlier incarnation.
    fn highest_term(&self) -> BoxFuture<'_, Result<u64, JournalError>>;
}
