//! The reader task: every read on a connection of its own, pipelined, outside any transaction,
//! through statements prepared once on that connection.

use shardline::journal::queue::{Job, Outcome};
use shardline::journal::JournalError;
use tokio::sync::mpsc;
use tokio_postgres::{Client, Statement};

use crate::connection::{connect, db};
use crate::reminders::{due_reminders, DUE_REMINDERS, DUE_REMINDERS_AFTER};
use crate::sql::{
    highest_term, last_seq, load_snapshot, read, recorded_replies, recorded_reply, remembered, HIGHEST_TERM, LAST_SEQ,
    LOAD_SNAPSHOT, READ, RECORDED_REPLIES, RECORDED_REPLY, REMEMBERED,
};
use crate::writer::{next_batch, unreachable_for};
use crate::PostgresConfig;

/// The reader's connection and its statements. Prepared once: as text, each read was a parse
/// and plan round trip before its execution.
struct Reads {
    client: Client,
    read: Statement,
    last_seq: Statement,
    load_snapshot: Statement,
    recorded_reply: Statement,
    recorded_replies: Statement,
    remembered: Statement,
    highest_term: Statement,
    due_reminders: Statement,
    due_reminders_after: Statement,
}

impl Reads {
    async fn open(config: &PostgresConfig) -> Result<Reads, JournalError> {
        let client = connect(config).await?;
        let prepared = futures_util::future::try_join_all(
            [
                READ,
                LAST_SEQ,
                LOAD_SNAPSHOT,
                RECORDED_REPLY,
                RECORDED_REPLIES,
                REMEMBERED,
                HIGHEST_TERM,
                DUE_REMINDERS,
                DUE_REMINDERS_AFTER,
            ]
            .map(|q| client.prepare(q)),
        )
        .await
        .map_err(db)?;
        let [read, last_seq, load_snapshot, recorded_reply, recorded_replies, remembered, highest_term, due_reminders, due_reminders_after] =
            <[Statement; 9]>::try_from(prepared)
                .map_err(|p| JournalError::Failed(format!("{} statements prepared of 9", p.len())))?;
        Ok(Reads {
            client,
            read,
            last_seq,
            load_snapshot,
            recorded_reply,
            recorded_replies,
            remembered,
            highest_term,
            due_reminders,
            due_reminders_after,
        })
    }

    /// Runs a request that only reads (see [`is_read`]).
    async fn run(&self, job: Job) -> Outcome {
        let c = &self.client;
        match job {
            Job::Read(pid, from, max, r) => Outcome::Events(r, read(c, &self.read, &pid, from, max).await),
            Job::LastSeq(pid, r) => Outcome::Seq(r, last_seq(c, &self.last_seq, &pid).await),
            Job::LoadSnapshot(pid, r) => Outcome::Snapshot(r, load_snapshot(c, &self.load_snapshot, &pid).await),
            Job::RecordedReply(pid, id, r) => {
                Outcome::Bytes(r, recorded_reply(c, &self.recorded_reply, &pid, &id).await)
            }
            Job::RecordedReplies(pid, n, r) => {
                Outcome::Replies(r, recorded_replies(c, &self.recorded_replies, &pid, n).await)
            }
            Job::Remembered(t, s, r) => Outcome::Ids(r, remembered(c, &self.remembered, &t, s).await),
            Job::HighestTerm(r) => Outcome::Seq(r, highest_term(c, &self.highest_term).await),
            Job::DueReminders(q, r) => {
                Outcome::Reminders(r, due_reminders(c, &self.due_reminders, &self.due_reminders_after, &q).await)
            }
            other => Outcome::failed(other, JournalError::Failed("a write was taken for a read".into())),
        }
    }
}

/// Whether a request only reads: the reader's, not a writer's.
pub(crate) fn is_read(job: &Job) -> bool {
    matches!(
        job,
        Job::Read(..)
            | Job::LastSeq(..)
            | Job::LoadSnapshot(..)
            | Job::RecordedReply(..)
            | Job::RecordedReplies(..)
            | Job::Remembered(..)
            | Job::HighestTerm(_)
            | Job::DueReminders(..)
    )
}

/// The reader task: takes every read waiting and pipelines them on its connection.
pub(crate) async fn reader(config: PostgresConfig, mut rx: mpsc::Receiver<Job>) {
    let mut reads: Option<Reads> = None;
    while let Some(batch) = next_batch(&mut rx).await {
        if reads.as_ref().is_none_or(|r| r.client.is_closed()) {
            reads = match Reads::open(&config).await {
                Ok(r) => Some(r),
                Err(e) => {
                    unreachable_for(batch, &e);
                    continue;
                }
            };
        }
        let Some(r) = reads.as_ref() else { continue };
        for outcome in futures_util::future::join_all(batch.into_iter().map(|j| r.run(j))).await {
            outcome.answer(&Ok(()));
        }
    }
}
