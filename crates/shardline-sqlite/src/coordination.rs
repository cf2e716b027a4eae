//! [`SqliteStore`]: Shardline's [`CoordinationStore`] in a SQLite file, for the node processes of
//! one host (the journal's file will do): lease membership with no server to run.
//!
//! - **Leases by the host's clock**: an ephemeral key's `expires_at` is the wall clock in
//!   milliseconds plus the TTL, taken inside the write transaction; every read, refresh and
//!   compare-and-set compares it with the clock again. The processes share one host, hence one
//!   clock. An expired row is absent to every call, even before it is deleted, and a refresh never
//!   revives it.
//! - **Revisions** come from a counter in the file: store-wide, growing at every write.
//! - **Watches**: triggers log every insert, update and delete of a key into a change log, in the
//!   same transaction; SQLite runs one write transaction at a time, so changes commit in the order
//!   of their log positions. A watch's thread polls the log every 100 ms for changes past its
//!   position under its prefix, and deletes the expired keys it finds, which logs their deletes:
//!   every watcher hears of an expiry. Entries older than five minutes are pruned; a watch that
//!   fell behind them ends, and its consumer lists again.
//! - **Several processes**: WAL mode, `synchronous = FULL` (a lease write is durable when it
//!   returns), and a busy handler like the journal's: a write waits up to 5 s for the file's lock,
//!   then is `Unavailable`.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, ErrorCode, OptionalExtension, TransactionBehavior};
use shardline::membership::lease::{CoordinationStore, Entry, Revision, StoreError, WatchEvent};
use shardline::membership::BoxFuture;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use crate::connection::{is_busy, OPEN_WAIT};
use crate::sql::now_ms;

/// How often a watch polls the change log (and looks for expired keys).
const POLL: Duration = Duration::from_millis(100);
/// How long the change log keeps a change.
const KEEP_CHANGES: Duration = Duration::from_secs(300);
/// How often a connection prunes the change log.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Longest wait for the file's write lock, held by another process.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// Polls for the write lock another process holds, as the journal does (every 200 µs: SQLite's own
/// busy timeout sleeps up to 100 ms at a time), for at most [`LOCK_WAIT`] by the clock (a count of
/// 200 µs sleeps overshoots: each sleeps longer).
fn wait_for_lock(attempt: i32) -> bool {
    thread_local! {
        /// When the current wait began (the handler runs on the thread that waits).
        static SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    let now = Instant::now();
    let since = SINCE.with(|s| {
        if attempt == 0 {
            s.set(Some(now));
        }
        s.get().unwrap_or(now)
    });
    if now.duration_since(since) >= LOCK_WAIT {
        return false;
    }
    std::thread::sleep(Duration::from_micros(200));
    true
}

/// The tables, created if absent.
const TABLES: &str = "
    CREATE TABLE IF NOT EXISTS shardline_coordination (
        key TEXT PRIMARY KEY, value BLOB NOT NULL, revision INTEGER NOT NULL, expires_at INTEGER);
    CREATE TABLE IF NOT EXISTS shardline_coordination_changes (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('put', 'delete')), value BLOB, revision INTEGER NOT NULL,
        at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)));
    -- The last revision given, and the highest position pruned from the change log.
    CREATE TABLE IF NOT EXISTS shardline_coordination_state (revision INTEGER NOT NULL, pruned INTEGER NOT NULL);
    INSERT INTO shardline_coordination_state SELECT 0, 0
        WHERE NOT EXISTS (SELECT 1 FROM shardline_coordination_state);
    CREATE TRIGGER IF NOT EXISTS shardline_coordination_inserted AFTER INSERT ON shardline_coordination BEGIN
        INSERT INTO shardline_coordination_changes (key, kind, value, revision)
            VALUES (NEW.key, 'put', NEW.value, NEW.revision);
    END;
    CREATE TRIGGER IF NOT EXISTS shardline_coordination_updated AFTER UPDATE ON shardline_coordination BEGIN
        INSERT INTO shardline_coordination_changes (key, kind, value, revision)
            VALUES (NEW.key, 'put', NEW.value, NEW.revision);
    END;
    CREATE TRIGGER IF NOT EXISTS shardline_coordination_deleted AFTER DELETE ON shardline_coordination BEGIN
        UPDATE shardline_coordination_state SET revision = revision + 1;
        INSERT INTO shardline_coordination_changes (key, kind, revision)
            VALUES (OLD.key, 'delete', (SELECT revision FROM shardline_coordination_state));
    END;";

/// A coordination store in a SQLite file. Cloning shares the connection.
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Db>>,
    path: PathBuf,
}

/// A connection, and when the change log was last pruned through it.
struct Db {
    conn: Connection,
    pruned: Option<Instant>,
}

/// Maps a database error: a busy or locked file, or one that cannot be opened or written, is
/// `Unavailable` (try again later); the rest is `Failed`.
fn db(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked | ErrorCode::CannotOpen | ErrorCode::SystemIoFailure,
        ) => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Failed(e.to_string()),
    }
}

fn revision(r: i64) -> Result<Revision, StoreError> {
    Revision::try_from(r).map_err(|_| StoreError::Failed(format!("negative revision {r}")))
}

fn db_revision(r: Revision) -> Result<i64, StoreError> {
    i64::try_from(r).map_err(|_| StoreError::Failed(format!("revision {r} does not fit the database")))
}

fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// Opens a connection to the file, in WAL mode, creating the tables if absent. Processes that
/// open a new file together race to switch it to WAL; SQLite answers the loser "busy" at once
/// (no busy handler waits for that), so it starts over.
fn connect(path: &Path) -> Result<Connection, StoreError> {
    let attempt = || -> Result<Connection, rusqlite::Error> {
        let mut conn = Connection::open(path)?;
        conn.busy_handler(Some(wait_for_lock))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(TABLES)?;
        tx.commit()?;
        Ok(conn)
    };
    let deadline = Instant::now() + OPEN_WAIT;
    loop {
        match attempt() {
            Ok(conn) => return Ok(conn),
            Err(e) if is_busy(&e) && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(at(path, db(e))),
        }
    }
}

/// Names the file in an error.
fn at(path: &Path, e: StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(format!("{}: {m}", path.display())),
        StoreError::Failed(m) => StoreError::Failed(format!("{}: {m}", path.display())),
    }
}

impl SqliteStore {
    /// Opens (creating it if needed) the file at `path` and the store's tables in it.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let conn = connect(&path)?;
        Ok(SqliteStore { conn: Arc::new(Mutex::new(Db { conn, pruned: None })), path })
    }

    /// Runs `f` on the connection, on a blocking thread; a write also prunes the change log when
    /// that is due.
    async fn call<T: Send + 'static>(
        &self,
        write: bool,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (conn, path) = (self.conn.clone(), self.path.clone());
        let r = tokio::task::spawn_blocking(move || {
            let mut link = conn.lock().unwrap_or_else(|e| e.into_inner());
            let r = f(&mut link.conn);
            if write && r.is_ok() {
                link.prune_if_due(&path);
            }
            r
        })
        .await;
        r.unwrap_or_else(|e| Err(StoreError::Failed(format!("the store's call failed: {e}"))))
            .map_err(|e| at(&self.path, e))
    }
}

impl Db {
    /// Prunes the change log of entries older than [`KEEP_CHANGES`], once a [`PRUNE_EVERY`].
    fn prune_if_due(&mut self, path: &Path) {
        if self.pruned.is_some_and(|t| t.elapsed() < PRUNE_EVERY) {
            return;
        }
        self.pruned = Some(Instant::now());
        if let Err(e) = prune(&mut self.conn) {
            debug!(path = %path.display(), error = %e, "cannot prune the coordination change log");
        }
    }
}

/// Runs `f` in a write transaction, with the clock read once the file's lock is held.
fn write<T>(c: &mut Connection, f: impl FnOnce(&Connection, i64) -> Result<T, StoreError>) -> Result<T, StoreError> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db)?;
    let r = f(&tx, now_ms())?;
    tx.commit().map_err(db)?;
    Ok(r)
}

fn next_revision(c: &Connection) -> Result<i64, StoreError> {
    c.query_row("UPDATE shardline_coordination_state SET revision = revision + 1 RETURNING revision", [], |r| r.get(0))
        .map_err(db)
}

/// The revision of `key` if it is live at `now`.
fn live_revision(c: &Connection, key: &str, now: i64) -> Result<Option<i64>, StoreError> {
    c.query_row(
        "SELECT revision FROM shardline_coordination WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)",
        params![key, now],
        |r| r.get(0),
    )
    .optional()
    .map_err(db)
}

/// Creates `key` unless it is live (an expired row is deleted first, logging its delete); `ttl`
/// in milliseconds, `None` for a durable key.
fn insert(c: &Connection, now: i64, key: &str, value: &[u8], ttl: Option<i64>) -> Result<Option<Revision>, StoreError> {
    c.execute("DELETE FROM shardline_coordination WHERE key = ?1 AND expires_at <= ?2", params![key, now])
        .map_err(db)?;
    if live_revision(c, key, now)?.is_some() {
        return Ok(None);
    }
    let rev = next_revision(c)?;
    c.execute(
        "INSERT INTO shardline_coordination (key, value, revision, expires_at) VALUES (?1, ?2, ?3, ?4)",
        params![key, value, rev, ttl.map(|t| now.saturating_add(t))],
    )
    .map_err(db)?;
    revision(rev).map(Some)
}

/// Rewrites a live `key` whose revision is `expected`.
fn update(
    c: &Connection,
    now: i64,
    key: &str,
    value: &[u8],
    expected: i64,
    ttl: Option<i64>,
) -> Result<Option<Revision>, StoreError> {
    if live_revision(c, key, now)? != Some(expected) {
        return Ok(None);
    }
    let rev = next_revision(c)?;
    c.execute(
        "UPDATE shardline_coordination SET value = ?2, revision = ?3, expires_at = ?4 WHERE key = ?1",
        params![key, value, rev, ttl.map(|t| now.saturating_add(t))],
    )
    .map_err(db)?;
    revision(rev).map(Some)
}

fn entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, Vec<u8>, i64)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
}

fn get(c: &Connection, key: &str) -> Result<Option<Entry>, StoreError> {
    let row = c
        .query_row(
            "SELECT key, value, revision FROM shardline_coordination
             WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)",
            params![key, now_ms()],
            entry,
        )
        .optional()
        .map_err(db)?;
    row.map(|(key, value, rev)| Ok(Entry { key, value, revision: revision(rev)? })).transpose()
}

fn list(c: &Connection, prefix: &str) -> Result<Vec<Entry>, StoreError> {
    let mut q = c
        .prepare_cached(
            "SELECT key, value, revision FROM shardline_coordination
             WHERE substr(key, 1, length(?1)) = ?1 AND (expires_at IS NULL OR expires_at > ?2) ORDER BY key",
        )
        .map_err(db)?;
    let rows = q.query_map(params![prefix, now_ms()], entry).map_err(db)?;
    rows.map(|r| {
        let (key, value, rev) = r.map_err(db)?;
        Ok(Entry { key, value, revision: revision(rev)? })
    })
    .collect()
}

/// Deletes `key` (at revision `expected`, when given); true if it was live.
fn delete(c: &Connection, now: i64, key: &str, expected: Option<i64>) -> Result<bool, StoreError> {
    let live: Option<bool> = c
        .query_row(
            "DELETE FROM shardline_coordination WHERE key = ?1 AND (?2 IS NULL OR revision = ?2)
             RETURNING expires_at IS NULL OR expires_at > ?3",
            params![key, expected, now],
            |r| r.get(0),
        )
        .optional()
        .map_err(db)?;
    Ok(live == Some(true))
}

/// The change log's position: its newest entry (or the highest pruned one).
const POSITION: &str = "SELECT MAX(COALESCE((SELECT MAX(seq) FROM shardline_coordination_changes), 0),
    (SELECT pruned FROM shardline_coordination_state))";

/// What a watch's poll found.
enum Polled {
    /// Changes past the watch's position under its prefix, and the log's new position.
    Changes { events: Vec<WatchEvent>, position: i64, expired: bool },
    /// The log was pruned past the watch's position: changes were lost.
    Pruned { upto: i64 },
}

/// Reads the changes after `last` under `prefix`, in one read transaction (one snapshot).
fn poll(c: &mut Connection, prefix: &str, last: i64) -> Result<Polled, StoreError> {
    let tx = c.transaction().map_err(db)?;
    let (position, upto, expired): (i64, i64, bool) = tx
        .query_row(
            &format!(
                "SELECT ({POSITION}), (SELECT pruned FROM shardline_coordination_state),
                    EXISTS (SELECT 1 FROM shardline_coordination WHERE expires_at <= ?1)"
            ),
            [now_ms()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(db)?;
    if upto > last {
        return Ok(Polled::Pruned { upto });
    }
    let events = {
        let mut q = tx
            .prepare_cached(
                "SELECT key, kind, value, revision FROM shardline_coordination_changes
                 WHERE seq > ?1 AND substr(key, 1, length(?2)) = ?2 ORDER BY seq",
            )
            .map_err(db)?;
        let rows = q
            .query_map(params![last, prefix], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, Option<Vec<u8>>>(2)?, r.get(3)?))
            })
            .map_err(db)?;
        rows.map(|r| {
            let (key, kind, value, rev) = r.map_err(db)?;
            Ok(match (kind.as_str(), value) {
                ("put", Some(value)) => WatchEvent::Put(Entry { key, value, revision: revision(rev)? }),
                _ => WatchEvent::Delete { key },
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?
    };
    tx.commit().map_err(db)?;
    Ok(Polled::Changes { events, position, expired })
}

/// Deletes the change log's entries older than [`KEEP_CHANGES`] and records the highest one.
fn prune(c: &mut Connection) -> Result<(), StoreError> {
    let cutoff = now_ms().saturating_sub(ttl_ms(KEEP_CHANGES));
    write(c, |c, _| {
        let upto: Option<i64> = c
            .query_row("SELECT MAX(seq) FROM shardline_coordination_changes WHERE at < ?1", [cutoff], |r| r.get(0))
            .map_err(db)?;
        if let Some(upto) = upto {
            c.execute("DELETE FROM shardline_coordination_changes WHERE seq <= ?1", [upto]).map_err(db)?;
            c.execute("UPDATE shardline_coordination_state SET pruned = MAX(pruned, ?1)", [upto]).map_err(db)?;
        }
        Ok(())
    })
}

/// A watch's thread: polls the change log on a connection of its own until the receiver is
/// dropped, or the log was pruned past its position.
fn follow(conn: Connection, path: PathBuf, prefix: String, mut last: i64, tx: mpsc::Sender<WatchEvent>) {
    let mut link = Db { conn, pruned: None };
    let mut failing = false;
    loop {
        std::thread::sleep(POLL);
        if tx.is_closed() {
            return;
        }
        match poll(&mut link.conn, &prefix, last) {
            Ok(Polled::Changes { events, position, expired }) => {
                if failing {
                    info!(path = %path.display(), prefix, "coordination watch polls again");
                    failing = false;
                }
                for ev in events {
                    if tx.blocking_send(ev).is_err() {
                        return;
                    }
                }
                last = position;
                if expired {
                    let swept = write(&mut link.conn, |c, now| {
                        c.execute("DELETE FROM shardline_coordination WHERE expires_at <= ?1", [now]).map_err(db)
                    });
                    if let Err(e) = swept {
                        debug!(path = %path.display(), error = %e, "cannot delete expired coordination keys");
                    }
                }
            }
            Ok(Polled::Pruned { upto }) => {
                error!(
                    path = %path.display(),
                    prefix,
                    position = last,
                    pruned = upto,
                    "coordination changes were pruned past this watch's position: ending the watch"
                );
                return;
            }
            Err(e) => {
                if !failing {
                    warn!(path = %path.display(), error = %e, prefix, "coordination watch cannot poll; retrying");
                    failing = true;
                }
            }
        }
        link.prune_if_due(&path);
    }
}

impl CoordinationStore for SqliteStore {
    fn create_ephemeral(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let key = key.to_string();
        Box::pin(self.call(true, move |c| write(c, |c, now| insert(c, now, &key, &value, Some(ttl_ms(ttl))))))
    }

    fn refresh(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let key = key.to_string();
        Box::pin(self.call(true, move |c| {
            let expected = db_revision(expected)?;
            write(c, |c, now| update(c, now, &key, &value, expected, Some(ttl_ms(ttl))))
        }))
    }

    fn compare_and_put(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let key = key.to_string();
        Box::pin(self.call(true, move |c| {
            if expected == 0 {
                return write(c, |c, now| insert(c, now, &key, &value, None));
            }
            let expected = db_revision(expected)?;
            write(c, |c, now| update(c, now, &key, &value, expected, None))
        }))
    }

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, StoreError>> {
        let key = key.to_string();
        Box::pin(self.call(false, move |c| get(c, &key)))
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<Entry>, StoreError>> {
        let prefix = prefix.to_string();
        Box::pin(self.call(false, move |c| list(c, &prefix)))
    }

    fn delete(&self, key: &str, expected: Option<Revision>) -> BoxFuture<'_, Result<bool, StoreError>> {
        let key = key.to_string();
        Box::pin(self.call(true, move |c| {
            let expected = expected.map(db_revision).transpose()?;
            write(c, |c, now| delete(c, now, &key, expected))
        }))
    }

    fn watch(&self, prefix: &str) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>> {
        let (prefix, path) = (prefix.to_string(), self.path.clone());
        Box::pin(async move {
            let (conn, last) = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
                let conn = connect(&path)?;
                let last: i64 = conn.query_row(POSITION, [], |r| r.get(0)).map_err(db).map_err(|e| at(&path, e))?;
                Ok((conn, last))
            })
            .await
            .map_err(|e| StoreError::Failed(format!("cannot start the watch: {e}")))??;
            let (tx, rx) = mpsc::channel(1024);
            let path = self.path.clone();
            std::thread::Builder::new()
                .name("shardline-sqlite-watch".into())
                .spawn(move || follow(conn, path, prefix, last, tx))
                .map_err(|e| StoreError::Failed(format!("cannot start the watch's thread: {e}")))?;
            Ok(rx)
        })
    }
}
