//! The writer tasks: each takes every request waiting and runs them in one transaction (group
//! commit), answering each once the commit's fate is known.

use std::collections::HashSet;

use shardline::journal::queue::{Job, Outcome};
use shardline::journal::{AppendRequest, BoxFuture, JournalError};
use tokio::sync::mpsc;
use tokio_postgres::{Client, Statement, Transaction};
use tracing::warn;

use crate::batch::{batched_appends, pipelined_appends, APPEND, APPEND_MANY};
use crate::connection::{connect, db};
use crate::reader::is_read;
use crate::reminders::{change_in_one, change_reminders, fit_one_statement, one_statement, CHANGE_REMINDERS};
use crate::sql::{append, forget, raise_fence, save_snapshot};
use crate::PostgresConfig;

/// Most requests one transaction takes.
const MAX_BATCH: usize = 256;

/// The writer's connection, with its append and reminder statements prepared once.
struct Conn {
    client: Client,
    append: Statement,
    append_many: Statement,
    change_reminders: Statement,
}

async fn open_conn(config: &PostgresConfig, client: Option<Client>) -> Result<Conn, JournalError> {
    let client = match client {
        Some(c) => c,
        None => connect(config).await?,
    };
    let append = client.prepare(APPEND).await.map_err(db)?;
    let append_many = client.prepare(APPEND_MANY).await.map_err(db)?;
    let change_reminders = client.prepare(CHANGE_REMINDERS).await.map_err(db)?;
    Ok(Conn { client, append, append_many, change_reminders })
}

/// Hands each request to a task: reads to the reader, writes to a writer (those of one
/// persistence id always to the same one, so their order is kept, and so are the reminder
/// changes of one shard; the rest to the first).
///
/// Reads have a connection of their own so that they do not wait for the writers' batches: a
/// recovery reads twice in a row (its snapshot and replies, then its events), and behind a
/// writer each read waited for the batch being committed and then rode in the next. Nothing read needs a
/// write still queued: a caller reads what it was told is written, and a write is answered
/// only once committed.
pub(crate) async fn route(mut rx: mpsc::Receiver<Job>, reader: mpsc::Sender<Job>, writers: Vec<mpsc::Sender<Job>>) {
    while let Some(job) = rx.recv().await {
        let to = if is_read(&job) {
            &reader
        } else {
            let key = match &job {
                Job::Append(req, _) => Some(hash(req.persistence_id.as_str())),
                Job::SaveSnapshot(_, pid, ..) => Some(hash(pid.as_str())),
                Job::ChangeReminders(f, ..) => Some(hash((f.type_key.as_str(), f.shard))),
                _ => None,
            };
            &writers[key.map_or(0, |k| (k % writers.len() as u64) as usize)]
        };
        if let Err(mpsc::error::SendError(job)) = to.send(job).await {
            job.fail(JournalError::Unavailable("the journal's writer stopped".into()));
        }
    }
}

fn hash(key: impl std::hash::Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    std::hash::Hasher::finish(&h)
}

/// The next request and every other one already waiting behind it, up to [`MAX_BATCH`].
pub(crate) async fn next_batch(rx: &mut mpsc::Receiver<Job>) -> Option<Vec<Job>> {
    let mut batch = vec![rx.recv().await?];
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(j) => batch.push(j),
            Err(_) => break,
        }
    }
    Some(batch)
}

/// Fails every request of a batch that found the database unreachable.
pub(crate) fn unreachable_for(batch: Vec<Job>, e: &JournalError) {
    warn!(error = %e, "journal database unreachable");
    for job in batch {
        job.fail(e.clone());
    }
}

pub(crate) async fn writer(config: PostgresConfig, first_client: Option<Client>, mut rx: mpsc::Receiver<Job>) {
    let mut first_client = first_client;
    let mut conn: Option<Conn> = None;
    while let Some(batch) = next_batch(&mut rx).await {
        if conn.as_ref().is_none_or(|c| c.client.is_closed()) {
            conn = match open_conn(&config, first_client.take()).await {
                Ok(c) => Some(c),
                Err(e) => {
                    unreachable_for(batch, &e);
                    continue;
                }
            };
        }
        let Some(c) = conn.as_mut() else { continue };
        // No client-side timeout: dropping a batch half-way would leave its outcome unknown.
        // The session's statement timeout bounds a hung server; a lost connection fails at once.
        if let Err(e) = run_batch(c, batch).await {
            warn!(error = %e, "journal transaction failed");
            if matches!(e, JournalError::Unavailable(_) | JournalError::CommitUnknown(_)) {
                conn = None;
            }
        }
    }
}

/// Runs a batch (the appends in one transaction, anything else in another) and answers every
/// request once its commit's fate is known: nothing is acknowledged before it is durable.
async fn run_batch(conn: &mut Conn, batch: Vec<Job>) -> Result<(), JournalError> {
    let Conn { client, append, append_many, change_reminders } = conn;
    if batch.is_empty() {
        return Ok(());
    }
    // The appends take one statement whatever else waits (a shard's claim, a
    // snapshot): before, a claim in a batch sent every append of it down the savepoint path,
    // eight round trips or so each, and so did an append that waited alone.
    let (appends, rest): (Vec<Job>, Vec<Job>) = batch.into_iter().partition(|j| matches!(j, Job::Append(..)));
    let appended = if appends.is_empty() {
        Ok(())
    } else {
        appends_at_once(client, [append, append_many, change_reminders], appends).await
    };
    let rest = if rest.is_empty() { Ok(()) } else { one_by_one(client, change_reminders, rest).await };
    appended.and(rest)
}

/// Runs appends (nothing else) in one transaction, in one statement when their entities (and
/// the reminders they change) are distinct, else one statement each, pipelined; one savepoint at
/// a time when a statement failed, or when an append's reminder changes need it (one is refused,
/// or changes a reminder twice). `statements`: [`APPEND`], [`APPEND_MANY`], [`CHANGE_REMINDERS`].
async fn appends_at_once(
    client: &mut Client,
    statements: [&Statement; 3],
    batch: Vec<Job>,
) -> Result<(), JournalError> {
    let [append, append_many, change] = statements;
    let requests: Vec<&AppendRequest> =
        batch.iter().filter_map(|j| if let Job::Append(r, _) = j { Some(&**r) } else { None }).collect();
    if !fit_one_statement(&requests, false) {
        // Refused in its savepoint after the checks that come first (fence, sequence number), as
        // every journal does; or applied in order, a statement per change of the same reminder.
        return one_by_one(client, change, batch).await;
    }
    let distinct = requests.iter().map(|r| r.persistence_id.as_str()).collect::<HashSet<_>>().len();
    let result = if requests.len() > 1 && distinct == requests.len() && fit_one_statement(&requests, true) {
        batched_appends(client, append_many, &requests).await
    } else {
        pipelined_appends(client, append, &requests).await
    };
    match result {
        Ok((results, committed)) => {
            for (job, result) in batch.into_iter().zip(results) {
                if let Job::Append(_, r) = job {
                    Outcome::Seq(r, result).answer(&committed);
                }
            }
            committed
        }
        Err(e @ JournalError::CommitUnknown(_)) => {
            for job in batch {
                job.fail(e.clone());
            }
            Err(e)
        }
        // A statement failed (another process raced on the same sequence numbers, say) and
        // took the transaction down: nothing of it was written. Go one savepoint at a time.
        Err(e) => {
            warn!(error = %e, "pipelined appends failed; running them one by one");
            one_by_one(client, change, batch).await
        }
    }
}

/// Runs requests in one transaction, each in a savepoint of its own, in order (`change`:
/// [`CHANGE_REMINDERS`], prepared).
async fn one_by_one(client: &mut Client, change: &Statement, batch: Vec<Job>) -> Result<(), JournalError> {
    let mut tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => {
            let err = db(e);
            for job in batch {
                job.fail(err.clone());
            }
            return Err(err);
        }
    };
    let mut outcomes = Vec::with_capacity(batch.len());
    for job in batch {
        outcomes.push(run_job(&mut tx, change, job).await);
    }
    let committed = tx.commit().await.map_err(|e| match db(e) {
        JournalError::Unavailable(m) => JournalError::CommitUnknown(m),
        other => other,
    });
    for o in outcomes {
        o.answer(&committed);
    }
    committed
}

async fn run_job(tx: &mut Transaction<'_>, change: &Statement, job: Job) -> Outcome {
    // The statement goes into each savepoint's future (a clone is a reference count).
    let change = change.clone();
    match job {
        Job::RaiseFence(f, r) => Outcome::Epoch(r, in_savepoint(tx, |sp| Box::pin(raise_fence(sp, f))).await),
        Job::Append(req, r) => {
            Outcome::Seq(r, in_savepoint(tx, |sp| Box::pin(async move { append(sp, &change, *req).await })).await)
        }
        Job::SaveSnapshot(f, pid, s, r) => {
            Outcome::Unit(r, in_savepoint(tx, |sp| Box::pin(save_snapshot(sp, f, pid, s))).await)
        }
        Job::Forget(f, id, r) => Outcome::Unit(r, in_savepoint(tx, |sp| Box::pin(forget(sp, f, id))).await),
        Job::ChangeReminders(f, changes, r) if one_statement(&changes) => {
            Outcome::Unit(r, change_in_one(tx, &change, f, changes).await)
        }
        Job::ChangeReminders(f, changes, r) => Outcome::Unit(
            r,
            in_savepoint(tx, |sp| Box::pin(async move { change_reminders(sp, &change, f, changes).await })).await,
        ),
        // Reads go to the reader (see `route`).
        other => Outcome::failed(other, JournalError::Failed("a read was taken for a write".into())),
    }
}

/// Runs `f` in a savepoint: on error what it wrote is rolled back, and the batch goes on.
async fn in_savepoint<'t, T>(
    tx: &'t mut Transaction<'_>,
    f: impl for<'s> FnOnce(&'s Transaction<'s>) -> BoxFuture<'s, Result<T, JournalError>>,
) -> Result<T, JournalError> {
    let sp = tx.transaction().await.map_err(db)?;
    let r = f(&sp).await;
    match r {
        Ok(v) => {
            sp.commit().await.map_err(db)?;
            Ok(v)
        }
        Err(e) => {
            sp.rollback().await.map_err(db)?;
            Err(e)
        }
    }
}
