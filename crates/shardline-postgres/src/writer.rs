//! The writer tasks: each takes every request waiting and runs them in one transaction (group
//! commit), answering each once the commit's fate is known.

use std::collections::HashSet;

use shardline::journal::queue::{Job, Outcome};
use shardline::journal::{AppendRequest, BoxFuture, JournalError};
use tokio::sync::mpsc;
use tokio_postgres::{Client, Transaction};
use tracing::warn;

use crate::batch::{batched_appends, pipelined_appends, APPEND, APPEND_MANY};
use crate::connection::{connect, db};
use crate::reader::is_read;
use crate::sql::{append, forget, raise_fence, save_snapshot};
use crate::PostgresConfig;

/// Most requests one transaction takes.
const MAX_BATCH: usize = 256;

/// The writer's connection, with its append statement prepared once.
struct Conn {
    client: Client,
    append: tokio_postgres::Statement,
    append_many: tokio_postgres::Statement,
}

async fn open_conn(config: &PostgresConfig, client: Option<Client>) -> Result<Conn, JournalError> {
    let client = match client {
        Some(c) => c,
        None => connect(config).await?,
    };
    let append = client.prepare(APPEND).await.map_err(db)?;
    let append_many = client.prepare(APPEND_MANY).await.map_err(db)?;
    Ok(Conn { client, append, append_many })
}

/// Hands each request to a task: reads to the reader, writes to a writer (those of one
/// persistence id always to the same one, so their order is kept; the rest to the first).
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
            let pid = match &job {
                Job::Append(req, _) => Some(req.persistence_id.as_str()),
                Job::SaveSnapshot(_, pid, ..) => Some(pid.as_str()),
                _ => None,
            };
            let i = pid.map_or(0, |p| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                std::hash::Hash::hash(p, &mut h);
                (std::hash::Hasher::finish(&h) % writers.len() as u64) as usize
            });
            &writers[i]
        };
        if let Err(mpsc::error::SendError(job)) = to.send(job).await {
            job.fail(JournalError::Unavailable("the journal's writer stopped".into()));
        }
    }
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
    let Conn { client, append, append_many } = conn;
    if batch.is_empty() {
        return Ok(());
    }
    // The appends take one statement whatever else waits (a shard's claim, a
    // snapshot): before, a claim in a batch sent every append of it down the savepoint path,
    // eight round trips or so each, and so did an append that waited alone.
    let (appends, rest): (Vec<Job>, Vec<Job>) = batch.into_iter().partition(|j| matches!(j, Job::Append(..)));
    let appended =
        if appends.is_empty() { Ok(()) } else { appends_at_once(client, append, append_many, appends).await };
    let rest = if rest.is_empty() { Ok(()) } else { one_by_one(client, rest).await };
    appended.and(rest)
}

/// Runs appends (nothing else) in one transaction, in one statement when their entities are
/// distinct, else one statement each, pipelined; one savepoint at a time when a statement failed.
async fn appends_at_once(
    client: &mut Client,
    append: &tokio_postgres::Statement,
    append_many: &tokio_postgres::Statement,
    batch: Vec<Job>,
) -> Result<(), JournalError> {
    let requests: Vec<&AppendRequest> =
        batch.iter().filter_map(|j| if let Job::Append(r, _) = j { Some(&**r) } else { None }).collect();
    let distinct = requests.iter().map(|r| r.persistence_id.as_str()).collect::<HashSet<_>>().len();
    let result = if requests.len() > 1 && distinct == requests.len() {
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
            one_by_one(client, batch).await
        }
    }
}

/// Runs requests in one transaction, each in a savepoint of its own, in order.
async fn one_by_one(client: &mut Client, batch: Vec<Job>) -> Result<(), JournalError> {
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
        outcomes.push(run_job(&mut tx, job).await);
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

async fn run_job(tx: &mut Transaction<'_>, job: Job) -> Outcome {
    match job {
        Job::RaiseFence(f, r) => Outcome::Epoch(r, in_savepoint(tx, |sp| Box::pin(raise_fence(sp, f))).await),
        Job::Append(req, r) => Outcome::Seq(r, in_savepoint(tx, |sp| Box::pin(append(sp, *req))).await),
        Job::SaveSnapshot(f, pid, s, r) => {
            Outcome::Unit(r, in_savepoint(tx, |sp| Box::pin(save_snapshot(sp, f, pid, s))).await)
        }
        Job::Forget(f, id, r) => Outcome::Unit(r, in_savepoint(tx, |sp| Box::pin(forget(sp, f, id))).await),
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
