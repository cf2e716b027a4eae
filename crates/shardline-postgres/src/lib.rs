//! Shardline's journal on PostgreSQL.
//!
//! - **One writer task per node** owns a connection. It takes every request waiting in its queue
//!   and runs them in one transaction, each in a savepoint of its own (group commit): one commit
//!   for many appends, while a refused append (fenced, conflict) rolls back alone. Requests for
//!   one persistence id keep their order, since the queue does.
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
];

/// Most requests one transaction takes.
const MAX_BATCH: usize = 256;

/// Settings of a PostgreSQL journal.
#[derive(Clone, Debug)]
pub struct PostgresConfig {
    /// `postgres://user@host:port/database` (or a key=value connection string).
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

/// Connects and points the session at the schema.
async fn connect(config: &PostgresConfig) -> Result<Client, JournalError> {
    let pg: tokio_postgres::Config =
        config.url.parse().map_err(|e| JournalError::Failed(format!("database url {:?}: {e}", config.url)))?;
    let (client, connection) = tokio::time::timeout(config.timeout, pg.connect(NoTls))
        .await
        .map_err(|_| {
            JournalError::Unavailable(format!("connecting to the database timed out after {:?}", config.timeout))
        })?
        .map_err(db)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            warn!(error = %e, "journal database connection closed");
        }
    });
    let schema = &config.schema;
    let statement_ms = config.timeout.as_millis();
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {schema}; SET search_path TO {schema};
             SET statement_timeout = {statement_ms}; SET idle_in_transaction_session_timeout = {statement_ms}"
        ))
        .await
        .map_err(db)?;
    Ok(client)
}

/// Maps a database error: a lost connection or an unreachable server is `Unavailable`; a
/// duplicate key (another process appended the same sequence numbers) is left to the caller.
fn db(e: tokio_postgres::Error) -> JournalError {
    match e.code() {
        None => JournalError::Unavailable(e.to_string()),
        Some(c) if *c == SqlState::ADMIN_SHUTDOWN || *c == SqlState::CANNOT_CONNECT_NOW => {
            JournalError::Unavailable(e.to_string())
        }
        Some(_) => JournalError::Failed(e.as_db_error().map_or_else(|| e.to_string(), |d| d.to_string())),
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
            | Job::RecordedReplies(pid, _) => Some(pid.as_str()),
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
        | Job::RecordedReplies(pid, _) => Some(Some(pid.as_str())),
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
        Job::RecordedReplies(pid, r) => Outcome::Replies(r, recorded_replies(client, &pid).await),
        Job::Remembered(t, s, r) => Outcome::Ids(r, remembered(client, &t, s).await),
        Job::HighestTerm(r) => Outcome::Seq(r, highest_term(client).await),
        other => Outcome::failed(other, JournalError::Failed("a write was taken for a read".into())),
    }
}

/// Every check and write of an append in one statement: nothing is written unless the fence and
/// the expected sequence number allow it, and the statement says which check failed instead of
/// raising an error, so a refused append does not abort the transaction around it.
const APPEND: &str = "
WITH fence AS (
    SELECT term, seq FROM shardline_fences WHERE type_key = $1 AND shard = $2 FOR SHARE
), last AS (
    SELECT COALESCE(MAX(seq), 0) AS s FROM shardline_events WHERE persistence_id = $3
), ok AS (
    SELECT 1 FROM fence, last WHERE (fence.term, fence.seq) <= ($4::BIGINT, $5::BIGINT) AND last.s = $6::BIGINT
), ins AS (
    INSERT INTO shardline_events (persistence_id, seq, type_name, schema_version, payload)
    SELECT $3, $6::BIGINT + e.ord, e.name, e.version, e.payload
    FROM ok, UNNEST($7::TEXT[], $8::BIGINT[], $9::BYTEA[]) WITH ORDINALITY AS e(name, version, payload, ord)
), rem AS (
    INSERT INTO shardline_remembered (type_key, shard, entity_id)
    SELECT $1, $2, $10 FROM ok WHERE $11::BOOL ON CONFLICT DO NOTHING
), rep AS (
    INSERT INTO shardline_replies (persistence_id, request_id, seq, reply)
    SELECT $3, $12::TEXT, $6::BIGINT + cardinality($7::TEXT[]), $13::BYTEA FROM ok WHERE $12::TEXT IS NOT NULL
    ON CONFLICT (persistence_id, request_id) DO UPDATE
        SET seq = EXCLUDED.seq, reply = EXCLUDED.reply, recorded = DEFAULT
), old AS (
    DELETE FROM shardline_replies
    WHERE persistence_id = $3 AND $12::TEXT IS NOT NULL AND EXISTS (SELECT 1 FROM ok)
      AND request_id IN (
          SELECT request_id FROM shardline_replies WHERE persistence_id = $3 AND request_id <> $12::TEXT
          ORDER BY seq DESC, recorded DESC OFFSET GREATEST($14::BIGINT - 1, 0))
)
SELECT (SELECT term FROM fence), (SELECT seq FROM fence), (SELECT s FROM last), EXISTS (SELECT 1 FROM ok)";

/// [`APPEND`] for a whole batch of appends to distinct persistence ids, in one statement: the
/// server runs one statement per batch instead of one per append. (A batch that appends twice to
/// one entity takes the pipelined path: within one statement the second append would not see
/// the first one's events.) Answers one row per append, in order, shaped like [`APPEND`]'s.
const APPEND_MANY: &str = "
WITH req AS (
    SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::BIGINT[], $5::BIGINT[], $6::BIGINT[],
                         $7::TEXT[], $8::BOOL[], $9::TEXT[], $10::BYTEA[], $11::BIGINT[], $12::BIGINT[])
        WITH ORDINALITY AS r(type_key, shard, pid, term, eseq, expected, entity_id, remember, request_id, reply,
                             win, events, idx)
), fence AS (
    SELECT r.idx, f.term, f.seq FROM req r
    JOIN shardline_fences f ON f.type_key = r.type_key AND f.shard = r.shard FOR SHARE OF f
), last AS (
    SELECT r.idx, (SELECT COALESCE(MAX(e.seq), 0) FROM shardline_events e WHERE e.persistence_id = r.pid) AS s
    FROM req r
), ok AS (
    SELECT r.* FROM req r JOIN fence f ON f.idx = r.idx JOIN last l ON l.idx = r.idx
    WHERE (f.term, f.seq) <= (r.term, r.eseq) AND l.s = r.expected
), ins AS (
    INSERT INTO shardline_events (persistence_id, seq, type_name, schema_version, payload)
    SELECT ok.pid, ok.expected + e.ord, e.name, e.version, e.payload
    FROM UNNEST($13::BIGINT[], $14::BIGINT[], $15::TEXT[], $16::BIGINT[], $17::BYTEA[])
        AS e(idx, ord, name, version, payload)
    JOIN ok ON ok.idx = e.idx
), rem AS (
    INSERT INTO shardline_remembered (type_key, shard, entity_id)
    SELECT type_key, shard, entity_id FROM ok WHERE remember ON CONFLICT DO NOTHING
), rep AS (
    INSERT INTO shardline_replies (persistence_id, request_id, seq, reply)
    SELECT pid, request_id, expected + events, reply FROM ok WHERE request_id IS NOT NULL
    ON CONFLICT (persistence_id, request_id) DO UPDATE
        SET seq = EXCLUDED.seq, reply = EXCLUDED.reply, recorded = DEFAULT
), old AS (
    DELETE FROM shardline_replies d
    WHERE (d.persistence_id, d.request_id) IN (
        SELECT ok.pid, x.request_id FROM ok CROSS JOIN LATERAL (
            SELECT request_id FROM shardline_replies
            WHERE persistence_id = ok.pid AND request_id <> ok.request_id
            ORDER BY seq DESC, recorded DESC OFFSET GREATEST(ok.win - 1, 0)) x
        WHERE ok.request_id IS NOT NULL)
)
SELECT f.term, f.seq, l.s, EXISTS (SELECT 1 FROM ok WHERE ok.idx = r.idx)
FROM req r JOIN last l ON l.idx = r.idx LEFT JOIN fence f ON f.idx = r.idx
ORDER BY r.idx";

/// Runs a batch of appends to distinct persistence ids as one [`APPEND_MANY`] statement in one
/// transaction. Returns each append's result and the commit's; `Err` when the statement failed,
/// which rolled everything back.
async fn batched_appends(
    client: &mut Client,
    statement: &tokio_postgres::Statement,
    requests: &[&AppendRequest],
) -> Result<(Vec<Result<u64, JournalError>>, Result<(), JournalError>), JournalError> {
    let args: Vec<AppendArgs<'_>> = requests.iter().map(|r| AppendArgs::new(r)).collect::<Result<_, _>>()?;
    let column = |f: &dyn Fn(&AppendArgs<'_>) -> i64| args.iter().map(f).collect::<Vec<i64>>();
    let (shards, terms, eseqs, expected, windows) = (
        column(&|a| a.shard),
        column(&|a| a.term),
        column(&|a| a.epoch_seq),
        column(&|a| a.expected),
        column(&|a| a.window),
    );
    let counts = column(&|a| a.names.len() as i64);
    let type_keys: Vec<&str> = requests.iter().map(|r| r.fence.type_key.as_str()).collect();
    let pids: Vec<&str> = requests.iter().map(|r| r.persistence_id.as_str()).collect();
    let entity_ids: Vec<&str> = requests.iter().map(|r| r.entity_id.as_str()).collect();
    let remember: Vec<bool> = requests.iter().map(|r| r.remember).collect();
    let request_ids: Vec<Option<&str>> = args.iter().map(|a| a.request_id).collect();
    let replies: Vec<Option<&[u8]>> = args.iter().map(|a| a.reply).collect();
    let (mut ev_idx, mut ev_ord, mut names, mut versions, mut payloads) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, a) in args.iter().enumerate() {
        for (k, name) in a.names.iter().enumerate() {
            ev_idx.push(i as i64 + 1);
            ev_ord.push(k as i64 + 1);
            names.push(*name);
            versions.push(a.versions[k]);
            payloads.push(a.payloads[k]);
        }
    }
    let tx = client.transaction().await.map_err(db)?;
    let rows = tx
        .query(
            statement,
            &[
                &type_keys,
                &shards,
                &pids,
                &terms,
                &eseqs,
                &expected,
                &entity_ids,
                &remember,
                &request_ids,
                &replies,
                &windows,
                &counts,
                &ev_idx,
                &ev_ord,
                &names,
                &versions,
                &payloads,
            ],
        )
        .await;
    let rows = match rows {
        Ok(rows) if rows.len() == requests.len() => rows,
        Ok(rows) => {
            let _ = tx.rollback().await;
            return Err(JournalError::Failed(format!("{} answers to {} appends", rows.len(), requests.len())));
        }
        Err(e) => {
            let _ = tx.rollback().await;
            return Err(db(e));
        }
    };
    let results = requests.iter().zip(&rows).map(|(req, row)| append_outcome(req, row)).collect();
    let committed = tx.commit().await.map_err(|e| match db(e) {
        JournalError::Unavailable(m) => JournalError::CommitUnknown(m),
        other => other,
    });
    Ok((results, committed))
}

/// Runs many appends in one transaction, their statements pipelined on the connection (they
/// still run in order, so a later append of the same entity sees an earlier one). Returns each
/// append's result and the commit's; `Err` when a statement failed, which rolled everything
/// back.
async fn pipelined_appends(
    client: &mut Client,
    statement: &tokio_postgres::Statement,
    requests: &[&AppendRequest],
) -> Result<(Vec<Result<u64, JournalError>>, Result<(), JournalError>), JournalError> {
    let tx = client.transaction().await.map_err(db)?;
    let mut args = Vec::with_capacity(requests.len());
    for req in requests {
        args.push(AppendArgs::new(req)?);
    }
    let params: Vec<[&(dyn tokio_postgres::types::ToSql + Sync); 14]> = args.iter().map(AppendArgs::params).collect();
    let rows = futures_util::future::join_all(params.iter().map(|p| tx.query_one(statement, &p[..]))).await;
    let mut results = Vec::with_capacity(requests.len());
    for (req, row) in requests.iter().zip(rows) {
        let row = match row {
            Ok(row) => row,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(db(e));
            }
        };
        results.push(append_outcome(req, &row));
    }
    let committed = tx.commit().await.map_err(|e| match db(e) {
        JournalError::Unavailable(m) => JournalError::CommitUnknown(m),
        other => other,
    });
    Ok((results, committed))
}

/// The parameters of [`APPEND`] for one request, owned so that they outlive the pipeline.
struct AppendArgs<'a> {
    req: &'a AppendRequest,
    shard: i64,
    term: i64,
    epoch_seq: i64,
    expected: i64,
    names: Vec<&'a str>,
    versions: Vec<i64>,
    payloads: Vec<&'a [u8]>,
    request_id: Option<&'a str>,
    reply: Option<&'a [u8]>,
    window: i64,
}

impl<'a> AppendArgs<'a> {
    fn new(req: &'a AppendRequest) -> Result<Self, JournalError> {
        Ok(AppendArgs {
            req,
            shard: i64::from(req.fence.shard.0),
            term: to_i64(req.fence.epoch.term, "term")?,
            epoch_seq: to_i64(req.fence.epoch.seq, "epoch")?,
            expected: to_i64(req.expected_seq, "sequence number")?,
            names: req.events.iter().map(|e| e.type_name.as_str()).collect(),
            versions: req.events.iter().map(|e| i64::from(e.schema_version)).collect(),
            payloads: req.events.iter().map(|e| e.payload.as_slice()).collect(),
            request_id: req.reply.as_ref().map(|r| r.request_id.as_str()),
            reply: req.reply.as_ref().map(|r| r.reply.as_slice()),
            window: to_i64(req.reply_window.max(1) as u64, "reply window")?,
        })
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 14] {
        [
            &self.req.fence.type_key,
            &self.shard,
            &self.req.persistence_id,
            &self.term,
            &self.epoch_seq,
            &self.expected,
            &self.names,
            &self.versions,
            &self.payloads,
            &self.req.entity_id,
            &self.req.remember,
            &self.request_id,
            &self.reply,
            &self.window,
        ]
    }
}

/// What [`APPEND`]'s answer row says about one request.
fn append_outcome(req: &AppendRequest, row: &tokio_postgres::Row) -> Result<u64, JournalError> {
    let pid = &req.persistence_id;
    let written: bool = col(row, 3)?;
    let last = to_u64(col(row, 2)?, pid, 0, "last sequence number")?;
    if written {
        return Ok(req.expected_seq + req.events.len() as u64);
    }
    let what = format!("fence of {} shard {}", req.fence.type_key, req.fence.shard.0);
    let stored = match (col::<Option<i64>>(row, 0)?, col::<Option<i64>>(row, 1)?) {
        (Some(t), Some(s)) => Some(Epoch { term: to_u64(t, &what, 0, "term")?, seq: to_u64(s, &what, 0, "seq")? }),
        _ => None,
    };
    req.fence.admitted_by(stored)?;
    Err(JournalError::Conflict { persistence_id: pid.clone(), expected: req.expected_seq, actual: last })
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
        Job::RecordedReplies(pid, r) => Outcome::Replies(r, recorded_replies(tx, &pid).await),
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
        tx.execute(
            "INSERT INTO shardline_replies (persistence_id, request_id, seq, reply) VALUES ($1, $2, $3, $4)
             ON CONFLICT (persistence_id, request_id) DO UPDATE SET seq = EXCLUDED.seq, reply = EXCLUDED.reply,
                recorded = DEFAULT",
            &[pid, &r.request_id, &seq, &r.reply],
        )
        .await
        .map_err(db)?;
        let window = to_i64(req.reply_window.max(1) as u64, "reply window")?;
        tx.execute(
            "DELETE FROM shardline_replies WHERE persistence_id = $1 AND request_id IN (
                SELECT request_id FROM shardline_replies WHERE persistence_id = $1
                ORDER BY seq DESC, recorded DESC OFFSET $2)",
            &[pid, &window],
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

async fn recorded_replies(tx: &impl GenericClient, pid: &str) -> Result<Vec<RecordedReply>, JournalError> {
    let rows = tx
        .query("SELECT request_id, reply FROM shardline_replies WHERE persistence_id = $1 ORDER BY seq", &[&pid])
        .await
        .map_err(db)?;
    rows.iter().map(|r| Ok(RecordedReply { request_id: col(r, 0)?, reply: col(r, 1)? })).collect()
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
