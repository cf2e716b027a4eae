//! Shardline's journal on PostgreSQL, and a [`PostgresStore`] for lease membership in the same
//! database (see its module).
//!
//! - **Writer tasks** (two by default), each with a connection of its own; an entity's requests
//!   always go to the same one, so they keep their order. A writer takes every request waiting
//!   and runs them in one transaction (group commit): reads of entities the batch does not append
//!   to are pipelined first, a batch of appends to distinct entities is one statement over
//!   unnested arrays, anything else runs one savepoint per request, so a refused append
//!   (fenced, conflict) rolls back alone.
//! - **Fencing in the database**: an append locks its shard's fence row (`FOR SHARE`) before it
//!   writes, and raising a fence updates that row, so a raise either waits for the append's
//!   commit or the append sees the raised fence. An append from another process racing on the
//!   same sequence numbers hits the primary key and is a `Conflict`.
//! - **A database that is down** gives `Unavailable` to every request meanwhile; the task connects
//!   again on the next request, so the node serves again without a restart.
//! - **Schema**: the tables live in a schema of their own (default `shardline`), migrated in
//!   versions under an advisory lock, so node processes starting together migrate once.

use std::collections::HashSet;
use std::time::Duration;

use shardline::journal::queue::{Job, Outcome};
use shardline::journal::{
    AppendRequest, BoxFuture, EventRecord, Fence, JournalError, QueuedJournal, RecordedReply, Snapshot, StoredEvent,
};
use shardline_core::{Epoch, ShardId};
use tokio::sync::mpsc;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient, NoTls, Transaction};
use tracing::{info, warn};

mod batch;
use batch::{batched_appends, pipelined_appends, APPEND, APPEND_MANY};
mod coordination;
pub use coordination::PostgresStore;
mod tls;

/// The schema, one migration per version, applied in order.
const MIGRATIONS: &[&str] = &[
    // 1: events, snapshots, fences, recorded replies, remembered entities.
    "CREATE TABLE shardline_fences (
        type_key TEXT NOT NULL, shard BIGINT NOT NULL, term BIGINT NOT NULL, seq BIGINT NOT NULL,
        PRIMARY KEY (type_key, shard));
     CREATE TABLE shardline_events (
        persistence_id TEXT NOT NULL, seq BIGINT NOT NULL, type_name TEXT NOT NULL,
        schema_version BIGINT NOT NULL, payload BYTEA NOT NULL, PRIMARY KEY (persistence_id, seq));
     CREATE TABLE shardline_snapshots (
        persistence_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, schema_version BIGINT NOT NULL,
        payload BYTEA NOT NULL);
     CREATE TABLE shardline_replies (
        persistence_id TEXT NOT NULL, request_id TEXT NOT NULL, seq BIGINT NOT NULL, reply BYTEA NOT NULL,
        recorded BIGSERIAL, PRIMARY KEY (persistence_id, request_id));
     CREATE TABLE shardline_remembered (
        type_key TEXT NOT NULL, shard BIGINT NOT NULL, entity_id TEXT NOT NULL,
        PRIMARY KEY (type_key, shard, entity_id));",
    // 2: the reply window pruned through an index, newest first (it read every reply of the
    // entity on each append).
    "CREATE INDEX shardline_replies_by_seq ON shardline_replies (persistence_id, seq, recorded)
        INCLUDE (request_id);",
    // 3: replies kept for a time rather than a count (milliseconds since the Unix epoch by the
    // server's clock); those recorded before the upgrade count from the upgrade.
    "ALTER TABLE shardline_replies
        ADD COLUMN recorded_at BIGINT NOT NULL DEFAULT (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT;
     CREATE INDEX shardline_replies_by_time ON shardline_replies (persistence_id, recorded_at);",
];

/// Most requests one transaction takes.
const MAX_BATCH: usize = 256;

/// Settings of a PostgreSQL journal.
#[derive(Clone, Debug)]
pub struct PostgresConfig {
    /// `postgres://user:password@host:port/database` (or a key=value connection string), with
    /// libpq's `sslmode` (`disable`, `prefer` by default, `require`, `verify-ca`, `verify-full`)
    /// and `sslrootcert` (the CA's PEM file, which the verifying modes need).
    pub url: String,
    /// The schema the tables live in (created if absent).
    pub schema: String,
    /// Longest wait to connect, and for one statement (the server cancels it after that).
    pub timeout: Duration,
    /// Connections, each with a writer of its own; an entity's requests always go to the same
    /// one, so they keep their order. With one, a batch waits for the previous one's commit;
    /// with two, one batch forms while the other commits.
    pub connections: usize,
}

impl PostgresConfig {
    /// Defaults: schema `shardline`, 5 s timeout, 2 connections.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresConfig { url: url.into(), schema: "shardline".into(), timeout: Duration::from_secs(5), connections: 2 }
    }

    /// The tables' schema.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
}

/// Connects PostgreSQL journals.
pub struct PostgresJournal;

impl PostgresJournal {
    /// Connects, creates the schema, migrates it and starts the journal's writer task. An
    /// unreachable database is `Unavailable`.
    pub async fn connect(config: PostgresConfig) -> Result<QueuedJournal, JournalError> {
        if config.schema.is_empty() || !config.schema.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(JournalError::Failed(format!(
                "schema name {:?}: letters, digits and underscores only",
                config.schema
            )));
        }
        let client = connect(&config).await?;
        migrate(&client, &config.schema).await?;
        let (journal, rx) = QueuedJournal::new(4096);
        let mut writers = Vec::new();
        let mut first = Some(client);
        for _ in 0..config.connections.max(1) {
            let (tx, rx) = mpsc::channel(4096);
            tokio::spawn(writer(config.clone(), first.take(), rx));
            writers.push(tx);
        }
        tokio::spawn(route(rx, writers));
        Ok(journal)
    }
}

/// Drives a connection until it closes.
async fn drive(connection: impl std::future::Future<Output = Result<(), tokio_postgres::Error>>) {
    if let Err(e) = connection.await {
        warn!(error = %e, "database connection closed");
    }
}

/// Connects and points the session at the schema.
async fn connect(config: &PostgresConfig) -> Result<Client, JournalError> {
    let (pg, tls) = tls::settings(&config.url)?;
    // Each kind of connection is a type of its own: driven by a task either way.
    let connecting = async {
        match tls {
            None => pg.connect(NoTls).await.map(|(client, connection)| {
                tokio::spawn(drive(connection));
                client
            }),
            Some(tls) => {
                pg.connect(tokio_postgres_rustls::MakeRustlsConnect::new(tls)).await.map(|(client, connection)| {
                    tokio::spawn(drive(connection));
                    client
                })
            }
        }
    };
    let client = tokio::time::timeout(config.timeout, connecting)
        .await
        .map_err(|_| {
            JournalError::Unavailable(format!("connecting to the database timed out after {:?}", config.timeout))
        })?
        .map_err(db)?;
    let schema = &config.schema;
    let statement_ms = config.timeout.as_millis();
    // `CREATE SCHEMA IF NOT EXISTS` is not safe against itself: node processes that start
    // together on a fresh database raced, and all but one failed on the catalog's unique index.
    // One at a time, under a lock held until the commit.
    client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtext('shardline-schema-{schema}'));
             CREATE SCHEMA IF NOT EXISTS {schema}; COMMIT; SET search_path TO {schema};
             SET statement_timeout = {statement_ms}; SET idle_in_transaction_session_timeout = {statement_ms}"
        ))
        .await
        .map_err(db)?;
    Ok(client)
}

/// Maps a database error: a lost connection or an unreachable server is `Unavailable`; a
/// duplicate key (another process appended the same sequence numbers) is left to the caller.
fn db(e: tokio_postgres::Error) -> JournalError {
    // The server's own message, not just "db error"; otherwise the causes too (a TLS handshake
    // says why it failed: a certificate of another name, of another CA).
    let text = e.as_db_error().map_or_else(
        || {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text = format!("{text}: {c}");
                cause = c.source();
            }
            text
        },
        |d| d.to_string(),
    );
    match e.code() {
        None => JournalError::Unavailable(text),
        Some(c) if *c == SqlState::ADMIN_SHUTDOWN || *c == SqlState::CANNOT_CONNECT_NOW => {
            JournalError::Unavailable(text)
        }
        Some(_) => JournalError::Failed(text),
    }
}

async fn migrate(client: &Client, schema: &str) -> Result<(), JournalError> {
    client.batch_execute("BEGIN").await.map_err(db)?;
    let result = async {
        // One migrator at a time, whichever node process starts first.
        client.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&format!("shardline-migrate-{schema}")]).await?;
        client.batch_execute("CREATE TABLE IF NOT EXISTS shardline_schema (version BIGINT NOT NULL)").await?;
        let row = client.query_one("SELECT COALESCE(MAX(version), 0) FROM shardline_schema", &[]).await?;
        row.try_get::<_, i64>(0)
    }
    .await;
    let version = match result {
        Ok(v) => v,
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(db(e));
        }
    };
    let known = MIGRATIONS.len() as i64;
    if version > known {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(JournalError::Failed(format!(
            "schema {schema} is at version {version}, newer than this build knows ({known})"
        )));
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let applied = async {
            client.batch_execute(m).await?;
            client.execute("INSERT INTO shardline_schema (version) VALUES ($1)", &[&(i as i64 + 1)]).await
        }
        .await;
        if let Err(e) = applied {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(db(e));
        }
        info!(schema, version = i + 1, "journal schema migrated");
    }
    client.batch_execute("COMMIT").await.map_err(db)
}

/// The writer task: one transaction for every request waiting, one savepoint per request.
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

/// Hands each request to a writer: those of one persistence id always to the same one (their
/// order is kept), the rest to the first.
async fn route(mut rx: mpsc::Receiver<Job>, writers: Vec<mpsc::Sender<Job>>) {
    while let Some(job) = rx.recv().await {
        let pid = match &job {
            Job::Append(req, _) => Some(req.persistence_id.as_str()),
            Job::Read(pid, ..)
            | Job::LastSeq(pid, _)
            | Job::SaveSnapshot(_, pid, ..)
            | Job::LoadSnapshot(pid, _)
            | Job::RecordedReply(pid, ..)
            | Job::RecordedReplies(pid, ..) => Some(pid.as_str()),
            Job::RaiseFence(..) | Job::Remembered(..) | Job::Forget(..) | Job::HighestTerm(_) => None,
        };
        let i = pid.map_or(0, |p| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::hash::Hash::hash(p, &mut h);
            (std::hash::Hasher::finish(&h) % writers.len() as u64) as usize
        });
        if let Err(mpsc::error::SendError(job)) = writers[i].send(job).await {
            job.fail(JournalError::Unavailable("the journal's writer stopped".into()));
        }
    }
}

async fn writer(config: PostgresConfig, first_client: Option<Client>, mut rx: mpsc::Receiver<Job>) {
    let mut first_client = first_client;
    let mut conn: Option<Conn> = None;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        if conn.as_ref().is_none_or(|c| c.client.is_closed()) {
            conn = match open_conn(&config, first_client.take()).await {
                Ok(c) => Some(c),
                Err(e) => {
                    warn!(error = %e, "journal database unreachable");
                    for job in batch {
                        job.fail(e.clone());
                    }
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

/// Runs a batch in one transaction and answers every request once the commit's fate is known:
/// nothing is acknowledged before it is durable.
async fn run_batch(conn: &mut Conn, batch: Vec<Job>) -> Result<(), JournalError> {
    let Conn { client, append, append_many } = conn;
    // Reads of entities no append of the batch touches commute with everything in it: pipeline
    // them on the connection first (they need no commit), so that a batch mixing recoveries and
    // appends still gets the appends' fast paths below.
    let (reads, batch): (Vec<Job>, Vec<Job>) = {
        let appended: HashSet<String> = batch
            .iter()
            .filter_map(|j| if let Job::Append(r, _) = j { Some(r.persistence_id.clone()) } else { None })
            .collect();
        batch.into_iter().partition(|j| read_only(j).is_some_and(|pid| pid.is_none_or(|p| !appended.contains(p))))
    };
    if !reads.is_empty() {
        let client = &*client;
        for outcome in futures_util::future::join_all(reads.into_iter().map(|j| read_job(client, j))).await {
            outcome.answer(&Ok(()));
        }
    }
    if batch.is_empty() {
        return Ok(());
    }
    if batch.len() > 1 && batch.iter().all(|j| matches!(j, Job::Append(..))) {
        let requests: Vec<&AppendRequest> =
            batch.iter().filter_map(|j| if let Job::Append(r, _) = j { Some(&**r) } else { None }).collect();
        let distinct = requests.iter().map(|r| r.persistence_id.as_str()).collect::<HashSet<_>>().len();
        let result = if distinct == requests.len() {
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
                return committed;
            }
            Err(e @ JournalError::CommitUnknown(_)) => {
                for job in batch {
                    job.fail(e.clone());
                }
                return Err(e);
            }
            // A statement failed (another process raced on the same sequence numbers, say) and
            // took the transaction down: nothing of it was written. Go one savepoint at a time.
            Err(e) => warn!(error = %e, "pipelined appends failed; running them one by one"),
        }
    }
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

/// Whether a request only reads, and which persistence id (None: no single entity's).
fn read_only(job: &Job) -> Option<Option<&str>> {
    match job {
        Job::Read(pid, ..)
        | Job::LastSeq(pid, _)
        | Job::LoadSnapshot(pid, _)
        | Job::RecordedReply(pid, ..)
        | Job::RecordedReplies(pid, ..) => Some(Some(pid.as_str())),
        Job::Remembered(..) | Job::HighestTerm(_) => Some(None),
        Job::RaiseFence(..) | Job::Append(..) | Job::SaveSnapshot(..) | Job::Forget(..) => None,
    }
}

/// Runs a request that only reads (see [`read_only`]) outside any transaction.
async fn read_job(client: &Client, job: Job) -> Outcome {
    match job {
        Job::Read(pid, from, r) => Outcome::Events(r, read(client, &pid, from).await),
        Job::LastSeq(pid, r) => Outcome::Seq(r, last_seq(client, &pid).await),
        Job::LoadSnapshot(pid, r) => Outcome::Snapshot(r, load_snapshot(client, &pid).await),
        Job::RecordedReply(pid, id, r) => Outcome::Bytes(r, recorded_reply(client, &pid, &id).await),
        Job::RecordedReplies(pid, n, r) => Outcome::Replies(r, recorded_replies(client, &pid, n).await),
        Job::Remembered(t, s, r) => Outcome::Ids(r, remembered(client, &t, s).await),
        Job::HighestTerm(r) => Outcome::Seq(r, highest_term(client).await),
        other => Outcome::failed(other, JournalError::Failed("a write was taken for a read".into())),
    }
}

async fn run_job(tx: &mut Transaction<'_>, job: Job) -> Outcome {
    match job {
        Job::RaiseFence(f, r) => Outcome::Epoch(r, in_savepoint(tx, |sp| Box::pin(raise_fence(sp, f))).await),
        Job::Append(req, r) => Outcome::Seq(r, in_savepoint(tx, |sp| Box::pin(append(sp, *req))).await),
        Job::Read(pid, from, r) => Outcome::Events(r, read(tx, &pid, from).await),
        Job::LastSeq(pid, r) => Outcome::Seq(r, last_seq(tx, &pid).await),
        Job::SaveSnapshot(f, pid, s, r) => {
            Outcome::Unit(r, in_savepoint(tx, |sp| Box::pin(save_snapshot(sp, f, pid, s))).await)
        }
        Job::LoadSnapshot(pid, r) => Outcome::Snapshot(r, load_snapshot(tx, &pid).await),
        Job::RecordedReply(pid, id, r) => Outcome::Bytes(r, recorded_reply(tx, &pid, &id).await),
        Job::RecordedReplies(pid, n, r) => Outcome::Replies(r, recorded_replies(tx, &pid, n).await),
        Job::Remembered(t, s, r) => Outcome::Ids(r, remembered(tx, &t, s).await),
        Job::Forget(f, id, r) => Outcome::Unit(r, in_savepoint(tx, |sp| Box::pin(forget(sp, f, id))).await),
        Job::HighestTerm(r) => Outcome::Seq(r, highest_term(tx).await),
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

fn to_i64(v: u64, what: &str) -> Result<i64, JournalError> {
    i64::try_from(v).map_err(|_| JournalError::Failed(format!("{what} {v} does not fit the database")))
}

/// A column of a row this crate's own query returned; a type that does not match the schema is
/// an error, not a panic.
fn col<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a tokio_postgres::Row, i: usize) -> Result<T, JournalError> {
    row.try_get(i).map_err(|e| JournalError::Failed(format!("column {i} does not match the schema: {e}")))
}

fn to_u64(v: i64, pid: &str, seq: u64, what: &str) -> Result<u64, JournalError> {
    u64::try_from(v).map_err(|_| JournalError::Corrupt {
        persistence_id: pid.to_string(),
        seq,
        reason: format!("{what} is negative ({v})"),
    })
}

fn to_u32(v: i64, pid: &str, seq: u64, what: &str) -> Result<u32, JournalError> {
    u32::try_from(v).map_err(|_| JournalError::Corrupt {
        persistence_id: pid.to_string(),
        seq,
        reason: format!("{what} {v} is out of range"),
    })
}

/// Reads the stored fence; `lock` takes a share lock on its row until the transaction ends.
async fn stored_fence(
    tx: &Transaction<'_>,
    type_key: &str,
    shard: ShardId,
    lock: bool,
) -> Result<Option<Epoch>, JournalError> {
    let sql = if lock {
        "SELECT term, seq FROM shardline_fences WHERE type_key = $1 AND shard = $2 FOR SHARE"
    } else {
        "SELECT term, seq FROM shardline_fences WHERE type_key = $1 AND shard = $2"
    };
    let row = tx.query_opt(sql, &[&type_key, &i64::from(shard.0)]).await.map_err(db)?;
    row.map(|r| {
        let what = format!("fence of {type_key} shard {}", shard.0);
        Ok(Epoch { term: to_u64(col(&r, 0)?, &what, 0, "term")?, seq: to_u64(col(&r, 1)?, &what, 0, "seq")? })
    })
    .transpose()
}

async fn check_fence(tx: &Transaction<'_>, f: &Fence) -> Result<(), JournalError> {
    f.admitted_by(stored_fence(tx, &f.type_key, f.shard, true).await?)
}

async fn raise_fence(tx: &Transaction<'_>, f: Fence) -> Result<Epoch, JournalError> {
    let (term, seq) = (to_i64(f.epoch.term, "term")?, to_i64(f.epoch.seq, "epoch")?);
    tx.execute(
        "INSERT INTO shardline_fences (type_key, shard, term, seq) VALUES ($1, $2, $3, $4)
         ON CONFLICT (type_key, shard) DO UPDATE SET term = EXCLUDED.term, seq = EXCLUDED.seq
         WHERE (EXCLUDED.term, EXCLUDED.seq) > (shardline_fences.term, shardline_fences.seq)",
        &[&f.type_key, &i64::from(f.shard.0), &term, &seq],
    )
    .await
    .map_err(db)?;
    stored_fence(tx, &f.type_key, f.shard, false)
        .await?
        .ok_or_else(|| JournalError::Failed(format!("the fence of {} shard {} was not stored", f.type_key, f.shard.0)))
}

async fn last_seq(tx: &impl GenericClient, pid: &str) -> Result<u64, JournalError> {
    let row = tx
        .query_one("SELECT COALESCE(MAX(seq), 0) FROM shardline_events WHERE persistence_id = $1", &[&pid])
        .await
        .map_err(db)?;
    to_u64(col(&row, 0)?, pid, 0, "last sequence number")
}

async fn append(tx: &Transaction<'_>, req: AppendRequest) -> Result<u64, JournalError> {
    check_fence(tx, &req.fence).await?;
    let pid = &req.persistence_id;
    if let Some(r) = &req.reply {
        if let Some(reply) = recorded_reply(tx, pid, &r.request_id).await? {
            return Err(JournalError::Duplicate {
                persistence_id: pid.clone(),
                request_id: r.request_id.clone(),
                reply,
            });
        }
    }
    let last = last_seq(tx, pid).await?;
    if last != req.expected_seq {
        return Err(JournalError::Conflict { persistence_id: pid.clone(), expected: req.expected_seq, actual: last });
    }
    if !req.events.is_empty() {
        let seqs: Vec<i64> =
            (0..req.events.len()).map(|i| to_i64(last + 1 + i as u64, "sequence number")).collect::<Result<_, _>>()?;
        let names: Vec<&str> = req.events.iter().map(|e| e.type_name.as_str()).collect();
        let versions: Vec<i64> = req.events.iter().map(|e| i64::from(e.schema_version)).collect();
        let payloads: Vec<&[u8]> = req.events.iter().map(|e| e.payload.as_slice()).collect();
        let inserted = tx
            .execute(
                "INSERT INTO shardline_events (persistence_id, seq, type_name, schema_version, payload)
                 SELECT $1, * FROM UNNEST($2::BIGINT[], $3::TEXT[], $4::BIGINT[], $5::BYTEA[])",
                &[pid, &seqs, &names, &versions, &payloads],
            )
            .await;
        if let Err(e) = inserted {
            // Another process appended the same sequence numbers first.
            if e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
                return Err(JournalError::Conflict {
                    persistence_id: pid.clone(),
                    expected: req.expected_seq,
                    actual: req.expected_seq + 1,
                });
            }
            return Err(db(e));
        }
    }
    let new_last = last + req.events.len() as u64;
    if req.remember {
        tx.execute(
            "INSERT INTO shardline_remembered (type_key, shard, entity_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            &[&req.fence.type_key, &i64::from(req.fence.shard.0), &req.entity_id],
        )
        .await
        .map_err(db)?;
    }
    if let Some(r) = &req.reply {
        let seq = to_i64(new_last, "sequence number")?;
        let keep = i64::try_from(req.keep_replies.as_millis()).unwrap_or(i64::MAX);
        // Through the index by time, by the server's clock: usually the one reply that just aged out.
        tx.execute(
            "DELETE FROM shardline_replies WHERE persistence_id = $1
                AND recorded_at < (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT - $2",
            &[pid, &keep],
        )
        .await
        .map_err(db)?;
        tx.execute(
            "INSERT INTO shardline_replies (persistence_id, request_id, seq, reply) VALUES ($1, $2, $3, $4)
             ON CONFLICT (persistence_id, request_id) DO UPDATE SET seq = EXCLUDED.seq, reply = EXCLUDED.reply,
                recorded = DEFAULT, recorded_at = DEFAULT",
            &[pid, &r.request_id, &seq, &r.reply],
        )
        .await
        .map_err(db)?;
    }
    Ok(new_last)
}

async fn read(tx: &impl GenericClient, pid: &str, from: u64) -> Result<Vec<StoredEvent>, JournalError> {
    let rows = tx
        .query(
            "SELECT seq, type_name, schema_version, payload FROM shardline_events
             WHERE persistence_id = $1 AND seq >= $2 ORDER BY seq",
            &[&pid, &to_i64(from, "sequence number")?],
        )
        .await
        .map_err(db)?;
    rows.into_iter()
        .map(|r| {
            let seq = to_u64(col(&r, 0)?, pid, 0, "sequence number")?;
            let schema_version = to_u32(col(&r, 2)?, pid, seq, "schema version")?;
            Ok(StoredEvent { seq, event: EventRecord { type_name: col(&r, 1)?, schema_version, payload: col(&r, 3)? } })
        })
        .collect()
}

async fn save_snapshot(tx: &Transaction<'_>, f: Fence, pid: String, s: Snapshot) -> Result<(), JournalError> {
    check_fence(tx, &f).await?;
    tx.execute(
        "INSERT INTO shardline_snapshots (persistence_id, seq, schema_version, payload) VALUES ($1, $2, $3, $4)
         ON CONFLICT (persistence_id) DO UPDATE SET seq = EXCLUDED.seq, schema_version = EXCLUDED.schema_version,
            payload = EXCLUDED.payload
         WHERE EXCLUDED.seq > shardline_snapshots.seq",
        &[&pid, &to_i64(s.seq, "sequence number")?, &i64::from(s.schema_version), &s.payload],
    )
    .await
    .map_err(db)?;
    Ok(())
}

async fn load_snapshot(tx: &impl GenericClient, pid: &str) -> Result<Option<Snapshot>, JournalError> {
    let row = tx
        .query_opt("SELECT seq, schema_version, payload FROM shardline_snapshots WHERE persistence_id = $1", &[&pid])
        .await
        .map_err(db)?;
    row.map(|r| {
        let seq = to_u64(col(&r, 0)?, pid, 0, "snapshot sequence number")?;
        let schema_version = to_u32(col(&r, 1)?, pid, seq, "snapshot schema version")?;
        Ok(Snapshot { seq, schema_version, payload: col(&r, 2)? })
    })
    .transpose()
}

async fn recorded_reply(tx: &impl GenericClient, pid: &str, id: &str) -> Result<Option<Vec<u8>>, JournalError> {
    let row = tx
        .query_opt("SELECT reply FROM shardline_replies WHERE persistence_id = $1 AND request_id = $2", &[&pid, &id])
        .await
        .map_err(db)?;
    row.map(|r| col(&r, 0)).transpose()
}

async fn recorded_replies(
    tx: &impl GenericClient,
    pid: &str,
    newest: usize,
) -> Result<Vec<RecordedReply>, JournalError> {
    let limit = i64::try_from(newest).unwrap_or(i64::MAX);
    let rows = tx
        .query(
            "SELECT request_id, reply FROM shardline_replies WHERE persistence_id = $1
             ORDER BY seq DESC, recorded DESC LIMIT $2",
            &[&pid, &limit],
        )
        .await
        .map_err(db)?;
    let mut replies: Vec<RecordedReply> = rows
        .iter()
        .map(|r| Ok(RecordedReply { request_id: col(r, 0)?, reply: col(r, 1)? }))
        .collect::<Result<_, _>>()?;
    replies.reverse();
    Ok(replies)
}

async fn remembered(tx: &impl GenericClient, type_key: &str, shard: ShardId) -> Result<Vec<String>, JournalError> {
    let rows = tx
        .query(
            "SELECT entity_id FROM shardline_remembered WHERE type_key = $1 AND shard = $2 ORDER BY entity_id",
            &[&type_key, &i64::from(shard.0)],
        )
        .await
        .map_err(db)?;
    rows.iter().map(|r| col(r, 0)).collect()
}

async fn highest_term(tx: &impl GenericClient) -> Result<u64, JournalError> {
    let row = tx.query_one("SELECT MAX(term) FROM shardline_fences", &[]).await.map_err(db)?;
    let top: Option<i64> = col(&row, 0)?;
    top.map_or(Ok(0), |t| to_u64(t, "fences", 0, "term"))
}

async fn forget(tx: &Transaction<'_>, f: Fence, entity_id: String) -> Result<(), JournalError> {
    check_fence(tx, &f).await?;
    tx.execute(
        "DELETE FROM shardline_remembered WHERE type_key = $1 AND shard = $2 AND entity_id = $3",
        &[&f.type_key, &i64::from(f.shard.0), &entity_id],
    )
    .await
    .map_err(db)?;
    Ok(())
}

/// The floor the journal benchmark compares appends with: the same rows inserted raw, in
/// transactions of `per_transaction` rows (one multi-row `INSERT` each), into a table of the same
/// shape (no fence, no sequence check) in `config`'s schema. Returns how long the inserts took.
pub async fn floor_insert(
    config: &PostgresConfig,
    rows: &[(String, u64, Vec<u8>)],
    per_transaction: usize,
) -> Result<Duration, JournalError> {
    let client = connect(config).await?;
    client
        .batch_execute(
            "DROP TABLE IF EXISTS shardline_bench_floor;
             CREATE TABLE shardline_bench_floor (persistence_id TEXT NOT NULL, seq BIGINT NOT NULL,
                payload BYTEA NOT NULL, PRIMARY KEY (persistence_id, seq))",
        )
        .await
        .map_err(db)?;
    let start = std::time::Instant::now();
    for chunk in rows.chunks(per_transaction.max(1)) {
        let pids: Vec<&str> = chunk.iter().map(|r| r.0.as_str()).collect();
        let seqs: Vec<i64> = chunk.iter().map(|r| to_i64(r.1, "sequence number")).collect::<Result<_, _>>()?;
        let payloads: Vec<&[u8]> = chunk.iter().map(|r| r.2.as_slice()).collect();
        client
            .execute(
                "INSERT INTO shardline_bench_floor (persistence_id, seq, payload)
                 SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BYTEA[])",
                &[&pids, &seqs, &payloads],
            )
            .await
            .map_err(db)?;
    }
    let took = start.elapsed();
    client.batch_execute("DROP TABLE shardline_bench_floor").await.map_err(db)?;
    Ok(took)
}

/// Drops `config`'s schema and everything in it (benchmarks and tests clean up with it).
pub async fn drop_schema(config: &PostgresConfig) -> Result<(), JournalError> {
    let client = connect(config).await?;
    client.batch_execute(&format!("DROP SCHEMA {} CASCADE", config.schema)).await.map_err(db)
}

/// How the server makes a commit durable, as `fsync=…, synchronous_commit=…` from its own
/// settings: benchmarks print it beside their figures, since a server run with `fsync=off` (as the
/// test drills' own servers are, to spare the disk) commits far faster than one that syncs.
pub async fn durability(config: &PostgresConfig) -> Result<String, JournalError> {
    let client = connect(config).await?;
    let mut settings = Vec::new();
    for name in ["fsync", "synchronous_commit"] {
        let row = client.query_one(&format!("SHOW {name}"), &[]).await.map_err(db)?;
        let value: String = row.try_get(0).map_err(db)?;
        settings.push(format!("{name}={value}"));
    }
    Ok(settings.join(", "))
}
