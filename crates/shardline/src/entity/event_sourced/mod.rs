//! Event-sourced entities: state that is the fold of its events in a [`Journal`](crate::journal::Journal).
//!
//! An [`EventSourced`] type decides, for each command, which events to persist and what to
//! answer; [`apply`](EventSourced::apply) folds an event into the state. Shardline runs it as an
//! ordinary entity ([`Persistent`]) that
//!
//! - recovers on the first command that needs its state, from the latest snapshot and the events
//!   after it (a command that needs none, see [`EventSourced::decide_without_state`], is
//!   appended without reading the history);
//! - appends the command's events, fenced by its shard's epoch and with the sequence number it
//!   last saw, and answers only once they are durable;
//! - records the reply with the events when the ask carries a [`RequestId`], so that a retry
//!   (after a timeout, a failover, a move) gets the recorded reply and changes nothing: answered
//!   from the replies it keeps in memory, and refused by the journal in the append's own
//!   transaction otherwise (see [`JournalError::Duplicate`](crate::journal::JournalError)).
//!   Replies are kept for [`EventSourcedSettings::reply_retention`](super::EventSourcedSettings)
//!   whatever the number of requests in between; a retry issued longer ago than that is refused
//!   ([`Error::RequestExpired`]), never applied again, and so is one issued further ahead of
//!   the node's clock than [`CLOCK_SKEW_MARGIN`], whose age would read
//!   too young. A command with a request id that writes
//!   no event records its reply too, so its retry gets the same answer;
//! - writes a snapshot every [`EventSourcedSettings::snapshot_every`](super::EventSourcedSettings::snapshot_every) events.
//!
//! Its state survives moves and crashes alike: a new owner reads it back from the journal.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use shardline::entity::EventSourced;
//! use shardline::EntityId;
//!
//! #[derive(Default, Serialize, Deserialize)]
//! struct Counter { n: u64 }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Added(u64);
//!
//! impl EventSourced for Counter {
//!     type Command = u64;
//!     type Event = Added;
//!     type Reply = u64;
//!     const EVENT_TYPE: &'static str = "counter.added";
//!     fn empty(_id: &EntityId) -> Self { Counter::default() }
//!     fn apply(&mut self, Added(k): &Added) { self.n += k; }
//!     fn decide(&self, k: u64) -> (Vec<Added>, u64) { (vec![Added(k)], self.n + k) }
//! }
//! ```

mod fold;
mod handle;
mod reminders;

pub use fold::EventSourced;

pub(super) use handle::fresh_request_id;
pub use handle::EventSourcedHandle;
pub use reminders::Remind;

use std::collections::VecDeque;
use std::time::SystemTime;

use super::schema::decode_old;
use crate::journal::RequestId;
use crate::sharding::settings::CLOCK_SKEW_MARGIN;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use shardline_core::EntityId;
use tracing::{error, warn};

use super::{Entity, EntityContext};
use crate::error::Error;
use crate::journal::{AppendRequest, EventRecord, JournalError, RecordedReply, ReminderChange, Snapshot, READ_PAGE};
use crate::sabotage::{self, Sabotage};

/// A command on its way to a [`Persistent`] entity, with the request id that makes retries safe.
#[derive(Debug, Serialize, Deserialize)]
pub struct Persist<C> {
    /// Identifies the logical request across retries (None: not recorded).
    pub request_id: Option<RequestId>,
    /// The command.
    pub command: C,
}

/// Why a command of an event-sourced entity failed; each says whether it was applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum PersistError {
    /// The journal could not be reached, refused the write as fenced (this node no longer owns
    /// the shard), or another writer appended first. Nothing was applied: resending is safe.
    #[error("not applied: {0}")]
    NotApplied(String),
    /// The journal lost its connection while committing: the events may be stored. Resending
    /// with the same request id is safe (it returns the recorded reply if they were).
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// The entity's history cannot be read (corrupt, or from a newer schema); nothing was
    /// applied, and resending will not help until it is repaired.
    #[error("history unreadable: {0}")]
    Unreadable(String),
    /// A retry of a request issued longer ago than replies are kept: an earlier attempt may have
    /// been applied, and nothing was applied now.
    /// Also a request issued further ahead of this node's clock than
    /// [`CLOCK_SKEW_MARGIN`]: its age reads short, so it could
    /// pass for a retry still recognisable after its reply was dropped.
    #[error("request expired: {0}")]
    Expired(String),
}

impl From<PersistError> for Error {
    fn from(e: PersistError) -> Error {
        match e {
            PersistError::NotApplied(m) => Error::Unavailable(m),
            PersistError::Unknown(m) => Error::OutcomeUnknown(m),
            PersistError::Unreadable(m) => Error::Rejected(m),
            PersistError::Expired(m) => Error::RequestExpired(m),
        }
    }
}

fn journal_error(e: JournalError) -> PersistError {
    match e {
        JournalError::CommitUnknown(m) => PersistError::Unknown(m),
        e @ JournalError::Corrupt { .. } => PersistError::Unreadable(e.to_string()),
        e => PersistError::NotApplied(e.to_string()),
    }
}

/// A failed append's answer: the recorded reply when the journal found its request applied
/// already (nothing was written again), the error otherwise.
fn already_applied<R: DeserializeOwned>(pid: &str, e: JournalError) -> Result<R, PersistError> {
    match e {
        JournalError::Duplicate { request_id, reply, .. } => decode_reply(pid, &request_id, &reply),
        e => Err(journal_error(e)),
    }
}

fn decode_reply<R: DeserializeOwned>(pid: &str, rid: &str, bytes: &[u8]) -> Result<R, PersistError> {
    postcard::from_bytes(bytes).map_err(|e| PersistError::Unreadable(format!("{pid}: recorded reply of {rid}: {e}")))
}

/// The entity that runs an [`EventSourced`] type.
pub struct Persistent<T: EventSourced> {
    id: EntityId,
    /// The state and the sequence number of the last event folded in; None until recovered.
    state: Option<(T, u64)>,
    /// Sequence number of the latest snapshot.
    snapshot_at: u64,
    /// The newest replies recorded for this entity, oldest first (loaded at recovery and kept up
    /// to date since): a retry found here is answered with no extra read.
    replies: VecDeque<RecordedReply>,
    /// Whether `replies` holds every reply the journal keeps for this entity. Then the journal
    /// refusing a request as applied already means the state was not the journal's (two
    /// instances, or a recovery that raced an append): logged as the bug it is.
    replies_complete: bool,
    /// The acknowledgement of the reminder whose command is running: written in that command's
    /// append, so that a crash after it commits does not fire the reminder again.
    firing: Option<ReminderChange>,
}

pub use crate::journal::persistence_id;

impl<T: EventSourced> Persistent<T> {
    async fn recover(&mut self, ctx: &EntityContext, pid: &str) -> Result<(), PersistError> {
        let journal = ctx.journal().ok_or_else(|| PersistError::Unreadable("no journal".into()))?;
        let in_memory = ctx.persistence.event_sourced.replies_in_memory.max(1);
        // One more than fits tells whether they all do.
        let (snapshot, replies) =
            tokio::join!(journal.load_snapshot(pid), journal.recorded_replies(pid, in_memory.saturating_add(1)));
        let mut replies: VecDeque<RecordedReply> = replies.map_err(journal_error)?.into();
        self.replies_complete = replies.len() <= in_memory;
        while replies.len() > in_memory {
            replies.pop_front();
        }
        self.replies = replies;
        let (mut state, mut last) = match snapshot.map_err(journal_error)? {
            Some(s) if s.schema_version > T::SCHEMA_VERSION => {
                return Err(PersistError::Unreadable(format!(
                    "{pid}: snapshot at {} has schema version {}, newer than {}",
                    s.seq,
                    s.schema_version,
                    T::SCHEMA_VERSION
                )));
            }
            // The state's encoding may have changed with the version: the events, which the
            // journal keeps and `upcast` reads, rebuild it.
            Some(s) if s.schema_version < T::SCHEMA_VERSION => {
                tracing::info!(%pid, at = s.seq, version = s.schema_version, "older snapshot skipped: replaying the events");
                (T::empty(&self.id), 0)
            }
            Some(s) => {
                let state = postcard::from_bytes(&s.payload).map_err(|e| {
                    PersistError::Unreadable(format!("{pid}: snapshot at {} cannot be decoded: {e}", s.seq))
                })?;
                self.snapshot_at = s.seq;
                (state, s.seq)
            }
            None => (T::empty(&self.id), 0),
        };
        // A page at a time: one page in memory however long the history (a history of 20M
        // events read whole ran Akka's recovery out of memory).
        loop {
            let page = journal.read_page(pid, last + 1, READ_PAGE).await.map_err(journal_error)?;
            let full = page.len() >= READ_PAGE;
            for stored in page {
                let e = &stored.event;
                if e.type_name != T::EVENT_TYPE || e.schema_version > T::SCHEMA_VERSION {
                    return Err(PersistError::Unreadable(format!(
                        "{pid} event {}: unknown type {:?} version {}",
                        stored.seq, e.type_name, e.schema_version
                    )));
                }
                if stored.seq != last + 1 {
                    return Err(PersistError::Unreadable(format!("{pid}: event {} follows {last}", stored.seq)));
                }
                let event: T::Event = if e.schema_version < T::SCHEMA_VERSION {
                    T::upcast(e.schema_version, &e.payload).map_err(|err| {
                        let v = e.schema_version;
                        PersistError::Unreadable(format!(
                            "{pid} event {} of version {v}: cannot be upcast: {err}",
                            stored.seq
                        ))
                    })?
                } else {
                    postcard::from_bytes(&e.payload).map_err(|err| {
                        PersistError::Unreadable(format!("{pid} event {}: cannot be decoded: {err}", stored.seq))
                    })?
                };
                state.apply(&event);
                last = stored.seq;
            }
            if !full {
                break;
            }
        }
        self.state = Some((state, last));
        Ok(())
    }

    async fn run(&mut self, ctx: &mut EntityContext, mut msg: Persist<T::Command>) -> Result<T::Reply, PersistError> {
        if sabotage::is(Sabotage::SkipRequestIdLookup) {
            msg.request_id = None;
        }
        ctx.claim_shard().await.map_err(journal_error)?;
        let journal = ctx.journal().ok_or_else(|| PersistError::Unreadable("no journal".into()))?.clone();
        let pid = persistence_id(ctx.type_key(), self.id.as_str());
        if self.state.is_none() {
            if let Some((events, reply)) = T::decide_without_state(&msg.command) {
                return self.write_without_state(ctx, &pid, msg.request_id, events, reply).await;
            }
            self.recover(ctx, &pid).await?;
        }
        if let Some(rid) = &msg.request_id {
            let known = self.replies.iter().find(|r| r.request_id == rid.key());
            if let Some(r) = known.filter(|_| !sabotage::is(Sabotage::ForgetReplies)) {
                // Handled before: its reply, and nothing applied again.
                return decode_reply(&pid, rid.key(), &r.reply);
            }
            expired(ctx, &pid, rid)?;
        }
        let Some((state, last)) = self.state.as_ref() else {
            return Err(PersistError::Unreadable(format!("{pid}: not recovered")));
        };
        let last = *last;
        // The decision sees the request's id, to derive the ids of the asks it makes.
        ctx.request = msg.request_id.clone();
        let (events, reply) = state.decide_with(ctx, msg.command).await;
        ctx.request = None;
        if events.is_empty() && !msg.request_id.as_ref().is_some_and(RequestId::records_reads) {
            // A read changes nothing and no caller will ask for this answer again: nothing to
            // record.
            return Ok(reply);
        }
        // A command that writes no event but carries a caller's request id still records its
        // reply: its retry must get this answer, not one decided again on a newer state.
        let (request, recorded) = self.append_request(ctx, &pid, last, &events, msg.request_id, &reply)?;
        let reminders = request.reminders.clone();
        let appended = timed_append(journal.as_ref(), request).await;
        ctx.reminders_appended(&reminders, &appended);
        match appended {
            Ok(new_last) => {
                if let Some((state, last)) = self.state.as_mut() {
                    for e in &events {
                        state.apply(e);
                    }
                    *last = new_last;
                }
                if let Some(r) = recorded {
                    self.replies.push_back(r);
                    while self.replies.len() > ctx.persistence.event_sourced.replies_in_memory.max(1) {
                        self.replies.pop_front();
                        self.replies_complete = false;
                    }
                }
                self.maybe_snapshot(ctx, &pid, ctx.persistence.event_sourced.snapshot_every).await;
                Ok(reply)
            }
            Err(JournalError::Duplicate { request_id, reply, .. }) if !self.replies_complete => {
                // An older request than those in memory: the journal still had its reply, and
                // wrote nothing. The state is unchanged.
                decode_reply(&pid, &request_id, &reply)
            }
            Err(JournalError::Fenced { .. } | JournalError::Unavailable(_) | JournalError::CommitUnknown(_))
                if sabotage::is(Sabotage::AckBeforeCommit) =>
            {
                Ok(reply)
            }
            Err(e) => {
                if let JournalError::Duplicate { request_id, .. } = &e {
                    // Every reply the journal keeps was in memory, and this instance is its
                    // history's only writer: a request applied that it does not know of means its
                    // state was not the journal's (a second instance, a recovery that raced an
                    // append). The journal refused it, so nothing was applied twice.
                    error!(%pid, %request_id, epoch = %ctx.epoch(), last, "a request this entity had no reply for was applied already: refused by the journal");
                    metrics::counter!("shardline_entity_unknown_duplicates_total").increment(1);
                }
                // Whatever we hold may be stale now (another writer, an unknown commit, or a
                // request applied without our knowing): read it back before the next command.
                self.state = None;
                already_applied(&pid, e)
            }
        }
    }

    /// A command that needs no state, for an entity not recovered: appended after the last
    /// stored event without reading the history (Endless's event writer without a state reader).
    /// A retry is looked up in the journal, since the reply window is not loaded either.
    async fn write_without_state(
        &mut self,
        ctx: &EntityContext,
        pid: &str,
        request_id: Option<RequestId>,
        events: Vec<T::Event>,
        reply: T::Reply,
    ) -> Result<T::Reply, PersistError> {
        let journal = ctx.journal().ok_or_else(|| PersistError::Unreadable("no journal".into()))?;
        if let Some(rid) = &request_id {
            if let Some(bytes) = journal.recorded_reply(pid, rid.key()).await.map_err(journal_error)? {
                return decode_reply(pid, rid.key(), &bytes);
            }
            expired(ctx, pid, rid)?;
        }
        if events.is_empty() && !request_id.as_ref().is_some_and(RequestId::records_reads) {
            return Ok(reply);
        }
        let last = journal.last_seq(pid).await.map_err(journal_error)?;
        let (request, _) = self.append_request(ctx, pid, last, &events, request_id, &reply)?;
        let reminders = request.reminders.clone();
        let appended = timed_append(journal.as_ref(), request).await;
        ctx.reminders_appended(&reminders, &appended);
        match appended {
            Ok(_) => Ok(reply),
            Err(e) => already_applied(pid, e),
        }
    }

    /// The append of a command's events after `expected`, with its reply recorded under its
    /// request id.
    fn append_request(
        &self,
        ctx: &EntityContext,
        pid: &str,
        expected: u64,
        events: &[T::Event],
        request_id: Option<RequestId>,
        reply: &T::Reply,
    ) -> Result<(AppendRequest, Option<RecordedReply>), PersistError> {
        let mut records = Vec::with_capacity(events.len());
        for e in events {
            let payload = postcard::to_allocvec(e)
                .map_err(|err| PersistError::NotApplied(format!("{pid}: an event cannot be encoded: {err}")))?;
            records.push(EventRecord { type_name: T::EVENT_TYPE.into(), schema_version: T::SCHEMA_VERSION, payload });
        }
        let recorded = match request_id {
            Some(rid) => Some(RecordedReply {
                request_id: rid.key().to_string(),
                reply: postcard::to_allocvec(reply)
                    .map_err(|e| PersistError::NotApplied(format!("{pid}: the reply cannot be encoded: {e}")))?,
            }),
            None => None,
        };
        let request = AppendRequest {
            fence: ctx.fence(),
            persistence_id: pid.to_string(),
            entity_id: self.id.as_str().to_string(),
            expected_seq: expected,
            events: records,
            remember: ctx.persistence.remember.is_some(),
            reply: recorded.clone(),
            keep_replies: ctx.persistence.event_sourced.reply_retention.saturating_add(CLOCK_SKEW_MARGIN),
            // The firing first: a reminder its events set again is then not removed by it.
            reminders: self.firing.iter().cloned().chain(reminders::changes::<T>(ctx, events)?).collect(),
        };
        Ok((request, recorded))
    }

    async fn maybe_snapshot(&mut self, ctx: &EntityContext, pid: &str, every: u64) {
        let Some((state, last)) = self.state.as_ref() else { return };
        if every == 0 || *last < self.snapshot_at + every {
            return;
        }
        let Some(journal) = ctx.journal() else { return };
        let payload = match postcard::to_allocvec(state) {
            Ok(p) => p,
            Err(e) => {
                warn!(%pid, error = %e, "state cannot be encoded: no snapshot");
                return;
            }
        };
        let snapshot = Snapshot { seq: *last, schema_version: T::SCHEMA_VERSION, payload };
        let seq = snapshot.seq;
        // A snapshot is an optimisation: failing to write one loses nothing.
        match journal.save_snapshot(&ctx.fence(), pid, snapshot).await {
            Ok(()) => self.snapshot_at = seq,
            Err(e) => warn!(%pid, error = %e, "snapshot not written"),
        }
    }
}

impl<T: EventSourced> Entity for Persistent<T> {
    type Message = Persist<T::Command>;
    type Reply = Result<T::Reply, PersistError>;

    fn new(id: &EntityId) -> Self {
        Persistent {
            id: id.clone(),
            state: None,
            snapshot_at: 0,
            replies: VecDeque::new(),
            replies_complete: false,
            firing: None,
        }
    }

    async fn handle(&mut self, ctx: &mut EntityContext, msg: Persist<T::Command>) -> Result<T::Reply, PersistError> {
        self.run(ctx, msg).await
    }

    async fn reminded(&mut self, ctx: &mut EntityContext, reminder: crate::entity::Reminder) -> Result<(), Error> {
        self.run_reminder(ctx, reminder).await
    }

    /// A remembered entity woken by its shard's start recovers at once.
    async fn started(&mut self, ctx: &mut EntityContext) {
        if self.state.is_some() || ctx.persistence.remember.is_none() {
            return;
        }
        let pid = persistence_id(ctx.type_key(), self.id.as_str());
        if let Err(e) = ctx.claim_shard().await {
            warn!(%pid, error = %e, "not recovered: the shard is not claimed");
            return;
        }
        if let Err(e) = self.recover(ctx, &pid).await {
            warn!(%pid, error = %e, "not recovered");
        }
    }
}

/// Refuses a request issued longer ago than replies are kept: its reply may be gone, so this
/// entity can no longer tell whether it was applied. Refuses one issued further ahead of this
/// node's clock than the margin replies are kept beyond the retention: its age reads short by
/// that much, so a late retry of it could pass here after its reply was dropped.
fn expired(ctx: &EntityContext, pid: &str, rid: &RequestId) -> Result<(), PersistError> {
    let retention = ctx.persistence.event_sourced.reply_retention;
    let now = SystemTime::now();
    let ahead = rid.ahead(now);
    if ahead > CLOCK_SKEW_MARGIN {
        warn!(%pid, request_id = rid.key(), ?ahead, "request id issued ahead of this node's clock: refused");
        // As an expired request: an earlier attempt may have been applied (on a node whose clock
        // was ahead too), and older nodes read this variant.
        return Err(PersistError::Expired(format!(
            "{pid}: request {} was issued {ahead:?} ahead of this node's clock, more than the margin of \
             {CLOCK_SKEW_MARGIN:?}: not applied now",
            rid.key()
        )));
    }
    let age = rid.age(now);
    if age > retention {
        return Err(PersistError::Expired(format!(
            "{pid}: request {} was issued {age:?} ago, longer than replies are kept ({retention:?})",
            rid.key()
        )));
    }
    Ok(())
}

/// An append, its time recorded (`shardline_journal_append_seconds`): one database round trip or
/// more per command, so the histogram's own cost does not show.
async fn timed_append(
    journal: &dyn crate::journal::Journal,
    request: crate::journal::AppendRequest,
) -> Result<u64, crate::journal::JournalError> {
    let started = std::time::Instant::now();
    let r = journal.append(request).await;
    metrics::histogram!("shardline_journal_append_seconds").record(started.elapsed().as_secs_f64());
    r
}
