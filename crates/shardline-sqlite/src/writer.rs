//! The writer thread: it takes every request waiting and runs them in one transaction (group
//! commit), each write in a savepoint of its own, answering each once the commit's fate is known.

use std::path::PathBuf;

use rusqlite::{Connection, Transaction};
use shardline::journal::queue::{Job, Outcome};
use shardline::journal::JournalError;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::connection::db;
use crate::reminders::{change_reminders, due_reminders};
use crate::sql::{
    append, forget, highest_term, last_seq, load_snapshot, raise_fence, read, recorded_replies, recorded_reply,
    remembered, save_snapshot,
};
use crate::wal::bound_wal;
use crate::SqliteOptions;

/// Most requests one transaction takes.
const MAX_BATCH: usize = 256;

/// The writer thread: one transaction for every request waiting, one savepoint per request.
pub(crate) fn writer(mut conn: Connection, mut rx: mpsc::Receiver<Job>, path: PathBuf, options: SqliteOptions) {
    while let Some(first) = rx.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let n = batch.len();
        if let Err(e) = run_batch(&mut conn, batch) {
            warn!(path = %path.display(), error = %e, "journal transaction failed");
        }
        debug!(requests = n, "journal batch");
        bound_wal(&conn, &path, options.wal_restart_pages);
    }
}

/// Runs a batch in one transaction; answers every request. When the transaction itself cannot
/// begin or commit, every request of the batch fails and nothing was written.
fn run_batch(conn: &mut Connection, batch: Vec<Job>) -> Result<(), JournalError> {
    let mut tx = match conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            let err = db(e);
            for job in batch {
                job.fail(err.clone());
            }
            return Err(err);
        }
    };
    let outcomes: Vec<Outcome> = batch.into_iter().map(|job| run_job(&mut tx, job)).collect();
    let committed = tx.commit().map_err(db);
    for o in outcomes {
        o.answer(&committed);
    }
    committed
}

/// Runs one job; writes run in a savepoint of their own.
fn run_job(tx: &mut Transaction<'_>, job: Job) -> Outcome {
    match job {
        Job::RaiseFence(f, r) => Outcome::Epoch(r, in_savepoint(tx, |sp| raise_fence(sp, &f))),
        Job::Append(req, r) => Outcome::Seq(r, in_savepoint(tx, |sp| append(sp, &req))),
        Job::Read(pid, from, max, r) => Outcome::Events(r, read(tx, &pid, from, max)),
        Job::LastSeq(pid, r) => Outcome::Seq(r, last_seq(tx, &pid)),
        Job::SaveSnapshot(f, pid, s, r) => Outcome::Unit(r, in_savepoint(tx, |sp| save_snapshot(sp, &f, &pid, &s))),
        Job::LoadSnapshot(pid, r) => Outcome::Snapshot(r, load_snapshot(tx, &pid)),
        Job::RecordedReply(pid, id, r) => Outcome::Bytes(r, recorded_reply(tx, &pid, &id)),
        Job::RecordedReplies(pid, n, r) => Outcome::Replies(r, recorded_replies(tx, &pid, n)),
        Job::Remembered(t, s, r) => Outcome::Ids(r, remembered(tx, &t, s)),
        Job::Forget(f, id, r) => Outcome::Unit(r, in_savepoint(tx, |sp| forget(sp, &f, &id))),
        Job::HighestTerm(r) => Outcome::Seq(r, highest_term(tx)),
        Job::ChangeReminders(f, changes, r) => {
            Outcome::Unit(r, in_savepoint(tx, |sp| change_reminders(sp, &f, &changes)))
        }
        Job::DueReminders(q, r) => Outcome::Reminders(r, due_reminders(tx, &q)),
    }
}

/// Runs `f` in a savepoint: on error, what it wrote is rolled back and the rest of the batch
/// goes on.
fn in_savepoint<T>(
    tx: &mut Transaction<'_>,
    f: impl FnOnce(&rusqlite::Savepoint<'_>) -> Result<T, JournalError>,
) -> Result<T, JournalError> {
    let sp = tx.savepoint().map_err(db)?;
    match f(&sp) {
        Ok(v) => {
            sp.commit().map_err(db)?;
            Ok(v)
        }
        Err(e) => {
            // Dropping an uncommitted savepoint rolls it back.
            drop(sp);
            Err(e)
        }
    }
}
