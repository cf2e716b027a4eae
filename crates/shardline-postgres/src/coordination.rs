//! [`PostgresStore`]: Shardline's [`CoordinationStore`] on PostgreSQL, so that lease membership
//! can use the journal's database as its witness (as Orleans keeps its membership table in the
//! application's SQL database): one server fewer to run.
//!
//! - **Leases by the server's clock**: an ephemeral key's `expires_at` is the server's
//!   `clock_timestamp()` plus the TTL, and every read, refresh and compare-and-set compares it with
//!   `clock_timestamp()` again, so the nodes' clocks never matter. (`now()` would be the start of
//!   the transaction.) An expired row is absent to every call, even before it is deleted, and a
//!   refresh never revives it.
//! - **Revisions** come from one sequence: store-wide, growing at every write, as etcd's.
//! - **Watches**: triggers log every insert, update and delete of a key into a change log, in the
//!   same transaction. Every write first takes one advisory lock (a statement trigger, before it
//!   touches a row), so changes commit in the order of their log positions and a reader that has
//!   seen position `n` has seen everything before it. A watch polls the log every 100 ms for
//!   changes past its position under its prefix, and deletes the expired keys it finds, which
//!   logs their deletes: every watcher hears of an expiry. Entries older than five minutes are
//!   pruned; a watch that was away for longer (pruned past its position) ends, and its consumer
//!   lists again.
//! - **Outages**: every call is bounded by the timeout; a connection that fails or does not answer
//!   is dropped and the next call connects again, so a node recovers without a restart. A watch
//!   keeps retrying its own connection.
//!
//! The tables (`shardline_coordination`, `shardline_coordination_changes`,
//! `shardline_coordination_pruned`) may share the journal's schema.

use std::sync::Arc;
use std::time::Duration;

use shardline::journal::JournalError;
use shardline::membership::lease::{CoordinationStore, Entry, Revision, StoreError, WatchEvent};
use shardline::membership::BoxFuture;
use tokio::sync::{mpsc, Mutex};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, IsolationLevel, Row};
use tracing::{debug, error, info, warn};

use crate::PostgresConfig;

/// How often a watch polls the change log (and looks for expired keys).
const POLL: Duration = Duration::from_millis(100);
/// How long the change log keeps a change.
const KEEP_CHANGES: Duration = Duration::from_secs(300);
/// How often a connection prunes the change log.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The tables, created once per schema.
const TABLES: &str = "
    CREATE SEQUENCE shardline_coordination_revision;
    CREATE TABLE shardline_coordination (
        key TEXT COLLATE \"C\" PRIMARY KEY, value BYTEA NOT NULL,
        revision BIGINT NOT NULL DEFAULT nextval('shardline_coordination_revision'),
        expires_at TIMESTAMPTZ);
    CREATE TABLE shardline_coordination_changes (
        seq BIGSERIAL PRIMARY KEY, key TEXT COLLATE \"C\" NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('put', 'delete')), value BYTEA, revision BIGINT NOT NULL,
        at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());
    -- The highest position pruned from the change log.
    CREATE TABLE shardline_coordination_pruned (upto BIGINT NOT NULL);
    INSERT INTO shardline_coordination_pruned VALUES (0);
    -- Writers one at a time, each taking the lock before it touches a row: changes commit in the
    -- order of their positions in the log.
    CREATE FUNCTION shardline_coordination_lock() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('shardline-coordination-writes-' || TG_TABLE_SCHEMA));
        RETURN NULL;
    END $$;
    CREATE TRIGGER shardline_coordination_lock BEFORE INSERT OR UPDATE OR DELETE ON shardline_coordination
        FOR EACH STATEMENT EXECUTE FUNCTION shardline_coordination_lock();
    CREATE FUNCTION shardline_coordination_log() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
    BEGIN
        IF TG_OP = 'DELETE' THEN
            INSERT INTO shardline_coordination_changes (key, kind, revision)
                VALUES (OLD.key, 'delete', nextval('shardline_coordination_revision'));
        ELSE
            INSERT INTO shardline_coordination_changes (key, kind, value, revision)
                VALUES (NEW.key, 'put', NEW.value, NEW.revision);
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER shardline_coordination_log AFTER INSERT OR UPDATE OR DELETE ON shardline_coordination
        FOR EACH ROW EXECUTE FUNCTION shardline_coordination_log();";

/// Deletes `$1` if it has expired (logging the delete), before a write that needs it absent.
const SWEEP_KEY: &str = "DELETE FROM shardline_coordination WHERE key = $1 AND expires_at <= clock_timestamp()";
/// Creates `$1` unless present; `$3` is the TTL in seconds (NULL: durable).
const INSERT: &str = "INSERT INTO shardline_coordination (key, value, expires_at)
    VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3))
    ON CONFLICT (key) DO NOTHING RETURNING revision";
/// Rewrites a live key at revision `$3`; `$4` is the TTL in seconds (NULL: durable).
const UPDATE: &str = "UPDATE shardline_coordination SET value = $2,
        revision = nextval('shardline_coordination_revision'),
        expires_at = clock_timestamp() + make_interval(secs => $4)
    WHERE key = $1 AND revision = $3 AND (expires_at IS NULL OR expires_at > clock_timestamp())
    RETURNING revision";

/// A coordination store in a PostgreSQL schema. Cloning shares the connection.
#[derive(Clone)]
pub struct PostgresStore {
    link: Arc<Mutex<Link>>,
    config: PostgresConfig,
}

/// A connection, made again when it fails, and when the change log was last pruned through it.
struct Link {
    config: PostgresConfig,
    client: Option<Client>,
    pruned: Option<Instant>,
}

fn timed_out(timeout: Duration) -> StoreError {
    StoreError::Unavailable(format!("the database did not answer within {timeout:?}"))
}

/// Errors of a server that is going away, starting up, full, or too slow for the timeout.
const TRANSIENT: [SqlState; 5] = [
    SqlState::QUERY_CANCELED,
    SqlState::ADMIN_SHUTDOWN,
    SqlState::CRASH_SHUTDOWN,
    SqlState::CANNOT_CONNECT_NOW,
    SqlState::TOO_MANY_CONNECTIONS,
];

/// Maps a database error: a lost or refused connection, or a statement cancelled by the timeout,
/// is `Unavailable`; the rest is `Failed`.
fn db(e: tokio_postgres::Error) -> StoreError {
    let text = e.as_db_error().map_or_else(|| e.to_string(), |d| d.to_string());
    match e.code() {
        None => StoreError::Unavailable(text),
        Some(c) if c.code().starts_with("08") || TRANSIENT.contains(c) => StoreError::Unavailable(text),
        Some(_) => StoreError::Failed(text),
    }
}

/// Maps an error of the journal's `connect`, which this store shares.
fn from_journal(e: JournalError) -> StoreError {
    match e {
        JournalError::Unavailable(m) => StoreError::Unavailable(m),
        JournalError::Failed(m) => StoreError::Failed(m),
        other => StoreError::Failed(other.to_string()),
    }
}

/// A column of a row this module's own query returned.
fn col<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, i: usize) -> Result<T, StoreError> {
    row.try_get(i).map_err(|e| StoreError::Failed(format!("column {i} does not match the schema: {e}")))
}

fn revision(row: &Row, i: usize) -> Result<Revision, StoreError> {
    let r: i64 = col(row, i)?;
    Revision::try_from(r).map_err(|_| StoreError::Failed(format!("negative revision {r}")))
}

fn db_revision(r: Revision) -> Result<i64, StoreError> {
    i64::try_from(r).map_err(|_| StoreError::Failed(format!("revision {r} does not fit the database")))
}

impl Link {
    fn new(config: PostgresConfig) -> Link {
        Link { config, client: None, pruned: None }
    }

    /// Runs `f` on the connection (connecting first if there is none, or it broke) before
    /// `deadline`. A connection that failed or did not answer in time is dropped.
    async fn run<T>(
        &mut self,
        deadline: Instant,
        f: impl for<'c> FnOnce(&'c mut Client) -> BoxFuture<'c, Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let (config, client) = (&self.config, &mut self.client);
        let r = tokio::time::timeout_at(deadline, async {
            if client.as_ref().is_none_or(Client::is_closed) {
                *client = Some(crate::connection::connect(config).await.map_err(from_journal)?);
            }
            match client.as_mut() {
                Some(c) => f(c).await,
                None => Err(StoreError::Unavailable("no connection".into())),
            }
        })
        .await
        .unwrap_or_else(|_| Err(timed_out(config.timeout)));
        if matches!(r, Err(StoreError::Unavailable(_))) {
            self.client = None;
        }
        r
    }

    /// Prunes the change log of entries older than [`KEEP_CHANGES`], once a [`PRUNE_EVERY`], before
    /// `deadline` (the one of the call it follows).
    async fn prune_if_due(&mut self, deadline: Instant) {
        if self.pruned.is_some_and(|t| t.elapsed() < PRUNE_EVERY) {
            return;
        }
        self.pruned = Some(Instant::now());
        if let Err(e) = self.run(deadline, |c| Box::pin(prune(c))).await {
            debug!(error = %e, "cannot prune the coordination change log");
        }
    }
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user@host:port/database`), creating `schema` and the
    /// store's tables in it if absent (node processes that start together create them once).
    /// Every later call is bounded by `timeout`, also the server's statement timeout.
    pub async fn connect(url: &str, schema: &str, timeout: Duration) -> Result<PostgresStore, StoreError> {
        if schema.is_empty() || !schema.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(StoreError::Failed(format!("schema name {schema:?}: letters, digits and underscores only")));
        }
        let config = PostgresConfig { url: url.into(), schema: schema.into(), timeout, connections: 1 };
        let mut link = Link::new(config.clone());
        let schema = schema.to_string();
        link.run(Instant::now() + timeout, move |c| Box::pin(create_tables(c, schema))).await?;
        Ok(PostgresStore { link: Arc::new(Mutex::new(link)), config })
    }

    /// Runs `f` on the store's connection, within the timeout; a write also prunes the change
    /// log when that is due.
    async fn call<T>(
        &self,
        write: bool,
        f: impl for<'c> FnOnce(&'c mut Client) -> BoxFuture<'c, Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let deadline = Instant::now() + self.config.timeout;
        let mut link =
            tokio::time::timeout_at(deadline, self.link.lock()).await.map_err(|_| timed_out(self.config.timeout))?;
        let r = link.run(deadline, f).await;
        if write && r.is_ok() {
            link.prune_if_due(deadline).await;
        }
        r
    }
}

async fn create_tables(c: &mut Client, schema: String) -> Result<(), StoreError> {
    let tx = c.transaction().await.map_err(db)?;
    // Processes that start together would race to create the tables: one at a time, and the
    // others find them made.
    tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&format!("shardline-coordination-tables-{schema}")])
        .await
        .map_err(db)?;
    let row = tx.query_one("SELECT to_regclass('shardline_coordination') IS NOT NULL", &[]).await.map_err(db)?;
    if !col::<bool>(&row, 0)? {
        tx.batch_execute(TABLES).await.map_err(db)?;
        info!(schema, "coordination tables created");
    }
    tx.commit().await.map_err(db)
}

/// Creates `key` unless it is present (an expired row is deleted first, logging its delete).
async fn insert(c: &mut Client, key: String, value: Vec<u8>, ttl: Option<f64>) -> Result<Option<Revision>, StoreError> {
    let tx = c.transaction().await.map_err(db)?;
    tx.execute(SWEEP_KEY, &[&key]).await.map_err(db)?;
    let row = tx.query_opt(INSERT, &[&key, &value, &ttl]).await.map_err(db)?;
    tx.commit().await.map_err(db)?;
    row.map(|r| revision(&r, 0)).transpose()
}

/// Rewrites a live `key` whose revision is `expected`.
async fn update(
    c: &mut Client,
    key: String,
    value: Vec<u8>,
    expected: i64,
    ttl: Option<f64>,
) -> Result<Option<Revision>, StoreError> {
    let row = c.query_opt(UPDATE, &[&key, &value, &expected, &ttl]).await.map_err(db)?;
    row.map(|r| revision(&r, 0)).transpose()
}

async fn get(c: &mut Client, key: String) -> Result<Option<Entry>, StoreError> {
    let row = c
        .query_opt(
            "SELECT value, revision FROM shardline_coordination
             WHERE key = $1 AND (expires_at IS NULL OR expires_at > clock_timestamp())",
            &[&key],
        )
        .await
        .map_err(db)?;
    row.map(|r| Ok(Entry { key, value: col(&r, 0)?, revision: revision(&r, 1)? })).transpose()
}

async fn list(c: &mut Client, prefix: String) -> Result<Vec<Entry>, StoreError> {
    let rows = c
        .query(
            "SELECT key, value, revision FROM shardline_coordination
             WHERE starts_with(key, $1) AND (expires_at IS NULL OR expires_at > clock_timestamp()) ORDER BY key",
            &[&prefix],
        )
        .await
        .map_err(db)?;
    rows.iter().map(|r| Ok(Entry { key: col(r, 0)?, value: col(r, 1)?, revision: revision(r, 2)? })).collect()
}

/// Deletes `key` (at revision `expected`, when given); true if it was live.
async fn delete(c: &mut Client, key: String, expected: Option<i64>) -> Result<bool, StoreError> {
    let row = c
        .query_opt(
            "DELETE FROM shardline_coordination WHERE key = $1 AND ($2::BIGINT IS NULL OR revision = $2)
             RETURNING expires_at IS NULL OR expires_at > clock_timestamp()",
            &[&key, &expected],
        )
        .await
        .map_err(db)?;
    row.map_or(Ok(false), |r| col(&r, 0))
}

/// The change log's position: its newest entry (or the highest pruned one).
const POSITION: &str = "SELECT GREATEST(
    (SELECT COALESCE(MAX(seq), 0) FROM shardline_coordination_changes),
    (SELECT COALESCE(MAX(upto), 0) FROM shardline_coordination_pruned))";

async fn position(c: &mut Client) -> Result<i64, StoreError> {
    col(&c.query_one(POSITION, &[]).await.map_err(db)?, 0)
}

/// What a watch's poll found.
enum Polled {
    /// Changes past the watch's position under its prefix, and the log's new position.
    Changes { events: Vec<WatchEvent>, position: i64, expired: bool },
    /// The log was pruned past the watch's position: changes were lost.
    Pruned { upto: i64 },
}

/// Reads the changes after `last` under `prefix`, in one snapshot: since writers commit in the
/// order of their positions, every change up to the newest one seen is in it.
async fn poll(c: &mut Client, prefix: String, last: i64) -> Result<Polled, StoreError> {
    let tx = c
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(db)?;
    let row = tx
        .query_one(
            &format!(
                "SELECT ({POSITION}), (SELECT COALESCE(MAX(upto), 0) FROM shardline_coordination_pruned),
                    EXISTS (SELECT 1 FROM shardline_coordination WHERE expires_at <= clock_timestamp())"
            ),
            &[],
        )
        .await
        .map_err(db)?;
    let (position, upto, expired): (i64, i64, bool) = (col(&row, 0)?, col(&row, 1)?, col(&row, 2)?);
    if upto > last {
        return Ok(Polled::Pruned { upto });
    }
    let rows = tx
        .query(
            "SELECT key, kind, value, revision FROM shardline_coordination_changes
             WHERE seq > $1 AND starts_with(key, $2) ORDER BY seq",
            &[&last, &prefix],
        )
        .await
        .map_err(db)?;
    tx.commit().await.map_err(db)?;
    let events = rows
        .iter()
        .map(|r| {
            let key: String = col(r, 0)?;
            match col::<&str>(r, 1)? {
                "put" => Ok(WatchEvent::Put(Entry { key, value: col(r, 2)?, revision: revision(r, 3)? })),
                _ => Ok(WatchEvent::Delete { key }),
            }
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Polled::Changes { events, position, expired })
}

/// Deletes every expired key; the log trigger records each delete.
async fn sweep(c: &mut Client) -> Result<(), StoreError> {
    c.execute("DELETE FROM shardline_coordination WHERE expires_at <= clock_timestamp()", &[]).await.map_err(db)?;
    Ok(())
}

/// Deletes the change log's entries older than [`KEEP_CHANGES`] and records the highest one.
async fn prune(c: &mut Client) -> Result<(), StoreError> {
    c.execute(
        "WITH gone AS (DELETE FROM shardline_coordination_changes
                       WHERE at < clock_timestamp() - make_interval(secs => $1) RETURNING seq)
         UPDATE shardline_coordination_pruned SET upto = GREATEST(upto, (SELECT MAX(seq) FROM gone))",
        &[&KEEP_CHANGES.as_secs_f64()],
    )
    .await
    .map_err(db)?;
    Ok(())
}

/// A watch's task: polls the change log on a connection of its own until the receiver is
/// dropped, or the log was pruned past its position.
async fn follow(mut link: Link, prefix: String, mut last: i64, tx: mpsc::Sender<WatchEvent>) {
    let mut failing = false;
    loop {
        tokio::select! {
            () = tx.closed() => return,
            () = tokio::time::sleep(POLL) => {}
        }
        let deadline = Instant::now() + link.config.timeout;
        let p = prefix.clone();
        match link.run(deadline, move |c| Box::pin(poll(c, p, last))).await {
            Ok(Polled::Changes { events, position, expired }) => {
                if failing {
                    info!(prefix, "coordination watch polls again");
                    failing = false;
                }
                for ev in events {
                    if tx.send(ev).await.is_err() {
                        return;
                    }
                }
                last = position;
                if expired {
                    if let Err(e) = link.run(deadline, |c| Box::pin(sweep(c))).await {
                        debug!(error = %e, "cannot delete expired coordination keys");
                    }
                }
            }
            Ok(Polled::Pruned { upto }) => {
                error!(
                    prefix,
                    position = last,
                    pruned = upto,
                    "coordination changes were pruned past this watch's position: ending the watch"
                );
                return;
            }
            Err(e) => {
                if !failing {
                    warn!(error = %e, prefix, "coordination watch cannot poll; retrying");
                    failing = true;
                }
            }
        }
        link.prune_if_due(Instant::now() + link.config.timeout).await;
    }
}

impl CoordinationStore for PostgresStore {
    fn create_ephemeral(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let (key, ttl) = (key.to_string(), Some(ttl.as_secs_f64()));
        Box::pin(self.call(true, move |c| Box::pin(insert(c, key, value, ttl))))
    }

    fn refresh(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            let expected = db_revision(expected)?;
            let ttl = Some(ttl.as_secs_f64());
            self.call(true, move |c| Box::pin(update(c, key, value, expected, ttl))).await
        })
    }

    fn compare_and_put(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            if expected == 0 {
                return self.call(true, move |c| Box::pin(insert(c, key, value, None))).await;
            }
            let expected = db_revision(expected)?;
            self.call(true, move |c| Box::pin(update(c, key, value, expected, None))).await
        })
    }

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, StoreError>> {
        let key = key.to_string();
        Box::pin(self.call(false, move |c| Box::pin(get(c, key))))
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<Entry>, StoreError>> {
        let prefix = prefix.to_string();
        Box::pin(self.call(false, move |c| Box::pin(list(c, prefix))))
    }

    fn delete(&self, key: &str, expected: Option<Revision>) -> BoxFuture<'_, Result<bool, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            let expected = expected.map(db_revision).transpose()?;
            self.call(true, move |c| Box::pin(delete(c, key, expected))).await
        })
    }

    fn watch(&self, prefix: &str) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>> {
        let prefix = prefix.to_string();
        Box::pin(async move {
            let last = self.call(false, |c| Box::pin(position(c))).await?;
            let (tx, rx) = mpsc::channel(1024);
            tokio::spawn(follow(Link::new(self.config.clone()), prefix, last, tx));
            Ok(rx)
        })
    }
}
