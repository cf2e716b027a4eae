//! Shardline's embedded journal on SQLite: one file, which several node processes on one host can
//! share, and no system library (SQLite is compiled in).
//!
//! - **One writer thread per process** owns the connection. It takes every request waiting in its
//!   queue and runs them in one `BEGIN IMMEDIATE` transaction, each in a savepoint of its own
//!   (group commit): one fsync for many appends, while a refused append (fenced, conflict) rolls
//!   back alone. Requests for one persistence id keep their order, since the queue does.
//! - **Several processes**: WAL mode, and a wait of up to 5 s for the file lock, polled often;
//!   the fence check and the write happen under the same `IMMEDIATE` lock, so no other process
//!   can raise a fence between. SQLite's automatic checkpoint never lets the write-ahead log start
//!   over while other processes keep writing, so a writer whose commit leaves it past
//!   [`SqliteOptions::wal_restart_pages`] waits for a checkpoint that does.
//! - **Schema**: versioned migrations in `shardline_schema`; a file written by a newer version is
//!   refused instead of misread.
//!
//! The same file can hold a [`SqliteStore`] for lease membership (see its module).

use std::cell::Cell;
use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::hooks::{CheckpointMode, Wal};
use rusqlite::{params, Connection, ErrorCode, OptionalExtension, Transaction};
use shardline::journal::queue::{Job, Outcome};
use shardline::journal::{
    AppendRequest, EventRecord, Fence, JournalError, QueuedJournal, RecordedReply, Snapshot, StoredEvent,
};
use shardline_core::{Epoch, ShardId};
use tokio::sync::mpsc;
use tracing::{debug, warn};

mod coordination;
pub use coordination::SqliteStore;

/// The schema, one migration per version, applied in order.
const MIGRATIONS: &[&str] = &[
    // 1: events, snapshots, fences, recorded replies, remembered entities.
    "CREATE TABLE shardline_fences (
        type_key TEXT NOT NULL, shard INTEGER NOT NULL, term INTEGER NOT NULL, seq INTEGER NOT NULL,
        PRIMARY KEY (type_key, shard));
     CREATE TABLE shardline_events (
        persistence_id TEXT NOT NULL, seq INTEGER NOT NULL, type_name TEXT NOT NULL,
        schema_version INTEGER NOT NULL, payload BLOB NOT NULL, PRIMARY KEY (persistence_id, seq));
     CREATE TABLE shardline_snapshots (
        persistence_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, schema_version INTEGER NOT NULL,
        payload BLOB NOT NULL);
     CREATE TABLE shardline_replies (
        persistence_id TEXT NOT NULL, request_id TEXT NOT NULL, seq INTEGER NOT NULL, reply BLOB NOT NULL,
        PRIMARY KEY (persistence_id, request_id));
     CREATE TABLE shardline_remembered (
        type_key TEXT NOT NULL, shard INTEGER NOT NULL, entity_id TEXT NOT NULL,
        PRIMARY KEY (type_key, shard, entity_id));",
    // 2: the reply window pruned through an index (it read every reply of the entity on each
    // append), and events stored in their primary key's B-tree (one B-tree per insert, not two).
    "CREATE INDEX shardline_replies_by_seq ON shardline_replies (persistence_id, seq);
     CREATE TABLE shardline_events_v2 (
        persistence_id TEXT NOT NULL, seq INTEGER NOT NULL, type_name TEXT NOT NULL,
        schema_version INTEGER NOT NULL, payload BLOB NOT NULL, PRIMARY KEY (persistence_id, seq))
        WITHOUT ROWID;
     INSERT INTO shardline_events_v2 (persistence_id, seq, type_name, schema_version, payload)
        SELECT persistence_id, seq, type_name, schema_version, payload FROM shardline_events;
     DROP TABLE shardline_events;
     ALTER TABLE shardline_events_v2 RENAME TO shardline_events;",
    // 3: replies kept for a time rather than a count (milliseconds since the Unix epoch by the
    // writer's clock); those recorded before the upgrade count from the upgrade.
    "ALTER TABLE shardline_replies ADD COLUMN recorded_at INTEGER NOT NULL DEFAULT 0;
     UPDATE shardline_replies SET recorded_at = CAST(strftime('%s', 'now') AS INTEGER) * 1000;
     CREATE INDEX shardline_replies_by_time ON shardline_replies (persistence_id, recorded_at);",
];

/// Most requests one transaction takes.
const MAX_BATCH: usize = 256;

/// Opens SQLite journals.
pub struct SqliteJournal;

/// Settings of a journal file.
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// Pages of write-ahead log past which a writer waits until the log can start over (the
    /// file's size on disk is about this many times 4 KiB; see the module docs). Default 16,384.
    pub wal_restart_pages: u32,
    /// When a commit reaches the disk. Default [`Synchronous::Full`]: an answered command is on
    /// disk.
    pub synchronous: Synchronous,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions { wal_restart_pages: 16_384, synchronous: Synchronous::Full }
    }
}

/// SQLite's `synchronous` setting for the journal file (in WAL mode).
///
/// An entity answers a command once its events are committed, so this decides what an answer
/// promises.
///
/// ```
/// use shardline_sqlite::{SqliteOptions, Synchronous};
///
/// assert_eq!(SqliteOptions::default().synchronous, Synchronous::Full);
/// assert_eq!("normal".parse::<Synchronous>(), Ok(Synchronous::Normal));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// Every commit is synced to disk before it is answered: an answered command survives a
    /// power loss or an operating system crash. The group commit of the writer thread pays one
    /// sync for every request waiting.
    #[default]
    Full,
    /// Commits are synced at checkpoints only: an answered command survives a crash of the
    /// process, but the last commits before a power loss or an operating system crash can be
    /// lost although they were answered. Faster; choose it only where that is acceptable.
    Normal,
}

impl Synchronous {
    /// The pragma's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

impl std::str::FromStr for Synchronous {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "full" => Ok(Synchronous::Full),
            "normal" => Ok(Synchronous::Normal),
            _ => Err(format!("synchronous: expected full or normal, got {s:?}")),
        }
    }
}

impl SqliteJournal {
    /// Opens (creating it if needed) the journal file at `path`, migrates its schema and starts
    /// its writer thread.
    pub fn open(path: impl AsRef<Path>) -> Result<QueuedJournal, JournalError> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// [`open`](Self::open) with settings.
    pub fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<QueuedJournal, JournalError> {
        let path = path.as_ref().to_path_buf();
        // Node processes that start together race to create the file, switch it to WAL and
        // migrate it; SQLite answers one of two connections that both want to upgrade a lock
        // "busy" at once (no busy handler can resolve that), so the loser starts over.
        let deadline = Instant::now() + OPEN_WAIT;
        let conn = loop {
            match connect(&path, options.synchronous) {
                Ok(conn) => break conn,
                Err(e) if is_busy(&e) && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Err(e) if is_busy(&e) => return Err(unavailable(&path, e)),
                Err(e) => return Err(failed(&path, e)),
            }
        };
        let (journal, rx) = QueuedJournal::new(4096);
        let thread_path = path.clone();
        std::thread::Builder::new()
            .name("shardline-sqlite".into())
            .spawn(move || writer(conn, rx, thread_path, options))
            .map_err(|e| JournalError::Failed(format!("cannot start the journal thread: {e}")))?;
        Ok(journal)
    }
}

/// Polls for the write lock another process holds: every 200 µs, for at most 5 s (then the batch
/// fails as unavailable). SQLite's own busy timeout sleeps up to 100 ms at a time, which turns a
/// lock held for a millisecond by a node process next door into a wait of tens.
fn wait_for_lock(attempt: i32) -> bool {
    const STEP: Duration = Duration::from_micros(200);
    const ATTEMPTS: i32 = 25_000;
    if attempt >= ATTEMPTS {
        return false;
    }
    std::thread::sleep(STEP);
    true
}

fn unavailable(path: &Path, e: rusqlite::Error) -> JournalError {
    JournalError::Unavailable(format!("{}: {e}", path.display()))
}

fn failed(path: &Path, e: rusqlite::Error) -> JournalError {
    JournalError::Failed(format!("{}: {e}", path.display()))
}

/// Maps a database error: a busy or locked file, or one that cannot be opened or written, is
/// `Unavailable` (try again later); the rest is `Failed`.
fn db(e: rusqlite::Error) -> JournalError {
    match e.sqlite_error_code() {
        Some(
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked | ErrorCode::CannotOpen | ErrorCode::SystemIoFailure,
        ) => JournalError::Unavailable(e.to_string()),
        _ => JournalError::Failed(e.to_string()),
    }
}

/// How long opening a file may wait for other processes that open it at the same time.
const OPEN_WAIT: Duration = Duration::from_secs(10);

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked))
}

/// Opens the file, switches it to WAL and migrates it.
fn connect(path: &Path, synchronous: Synchronous) -> Result<Connection, rusqlite::Error> {
    let mut conn = Connection::open(path)?;
    conn.busy_handler(Some(wait_for_lock))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", synchronous.as_str())?;
    conn.wal_hook(Some(after_commit));
    migrate(&mut conn)?;
    Ok(conn)
}

/// A file of a newer schema version than this build knows.
fn newer(version: i64, known: i64) -> rusqlite::Error {
    let msg = format!("schema version {version} is newer than this build knows ({known})");
    rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR), Some(msg))
}

fn migrate(conn: &mut Connection) -> Result<(), rusqlite::Error> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute("CREATE TABLE IF NOT EXISTS shardline_schema (version INTEGER NOT NULL)", [])?;
    let version: Option<i64> = tx.query_row("SELECT MAX(version) FROM shardline_schema", [], |r| r.get(0))?;
    let version = version.unwrap_or(0);
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(newer(version, known));
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(m)?;
        tx.execute("INSERT INTO shardline_schema (version) VALUES (?1)", [i as i64 + 1])?;
    }
    tx.commit()
}

fn to_i64(v: u64, what: &str) -> Result<i64, JournalError> {
    i64::try_from(v).map_err(|_| JournalError::Failed(format!("{what} {v} does not fit the database")))
}

fn to_u64(v: i64, pid: &str, seq: u64, what: &str) -> Result<u64, JournalError> {
    u64::try_from(v).map_err(|_| JournalError::Corrupt {
        persistence_id: pid.to_string(),
        seq,
        reason: format!("{what} is negative ({v})"),
    })
}

/// Frames (pages) of write-ahead log past which a commit copies it into the database without
/// waiting for anyone (SQLite's automatic checkpoint, which [`after_commit`] replaces).
const CHECKPOINT_FRAMES: c_int = 1000;

thread_local! {
    /// The length of the write-ahead log after this thread's last commit, from [`after_commit`]
    /// (a plain function: it cannot capture anything, and the writer thread makes every commit).
    static WAL_FRAMES: Cell<c_int> = const { Cell::new(0) };
}

/// The connection's write-ahead log hook, run after each commit: SQLite's automatic checkpoint,
/// plus the log's length for [`bound_wal`]. Never an error: the commit has happened, and an error
/// here would make it look failed.
fn after_commit(wal: &Wal, frames: c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.with(|f| f.set(frames));
    if frames >= CHECKPOINT_FRAMES {
        // As the automatic checkpoint: copy what no reader needs, never wait; a busy or failed
        // checkpoint is tried again after the next commit.
        let _ = wal.checkpoint_v2(CheckpointMode::PASSIVE);
    }
    Ok(())
}

/// Keeps the write-ahead log bounded when several processes write. The automatic checkpoint
/// never waits, and with another process always mid-transaction it never finds the whole log
/// copied, so the log never starts over: it grew by gigabytes in a minute of the demo, every commit
/// wrote past its end (the kernel zeroes each new page) and every page lookup searched it. Past
/// [`SqliteOptions::wal_restart_pages`], a `RESTART` checkpoint holds new writers back (through the busy handler)
/// until the log is copied and unread, and the next transaction writes it from its beginning.
fn bound_wal(conn: &Connection, path: &Path, limit: u32) {
    let frames = WAL_FRAMES.with(Cell::get);
    if i64::from(frames) <= i64::from(limit) {
        return;
    }
    WAL_FRAMES.with(|f| f.set(0));
    match conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get::<_, i64>(0)) {
        Ok(0) => debug!(path = %path.display(), frames, "write-ahead log restarted"),
        Ok(_) => debug!(path = %path.display(), frames, "write-ahead log still in use; restart postponed"),
        // Only the log's size is at stake: the next commit past the mark tries again.
        Err(e) => warn!(path = %path.display(), error = %e, "write-ahead log checkpoint failed"),
    }
}

/// The writer thread: one transaction for every request waiting, one savepoint per request.
fn writer(mut conn: Connection, mut rx: mpsc::Receiver<Job>, path: PathBuf, options: SqliteOptions) {
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
        Job::Read(pid, from, r) => Outcome::Events(r, read(tx, &pid, from)),
        Job::LastSeq(pid, r) => Outcome::Seq(r, last_seq(tx, &pid)),
        Job::SaveSnapshot(f, pid, s, r) => Outcome::Unit(r, in_savepoint(tx, |sp| save_snapshot(sp, &f, &pid, &s))),
        Job::LoadSnapshot(pid, r) => Outcome::Snapshot(r, load_snapshot(tx, &pid)),
        Job::RecordedReply(pid, id, r) => Outcome::Bytes(r, recorded_reply(tx, &pid, &id)),
        Job::RecordedReplies(pid, n, r) => Outcome::Replies(r, recorded_replies(tx, &pid, n)),
        Job::Remembered(t, s, r) => Outcome::Ids(r, remembered(tx, &t, s)),
        Job::Forget(f, id, r) => Outcome::Unit(r, in_savepoint(tx, |sp| forget(sp, &f, &id))),
        Job::HighestTerm(r) => Outcome::Seq(r, highest_term(tx)),
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

fn stored_fence(c: &Connection, type_key: &str, shard: ShardId) -> Result<Option<Epoch>, JournalError> {
    let row: Option<(i64, i64)> = c
        .prepare_cached("SELECT term, seq FROM shardline_fences WHERE type_key = ?1 AND shard = ?2")
        .map_err(db)?
        .query_row(params![type_key, shard.0], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(db)?;
    row.map(|(t, s)| {
        let what = format!("fence of {type_key} shard {}", shard.0);
        Ok(Epoch { term: to_u64(t, &what, 0, "term")?, seq: to_u64(s, &what, 0, "seq")? })
    })
    .transpose()
}

fn check_fence(c: &Connection, f: &Fence) -> Result<(), JournalError> {
    f.admitted_by(stored_fence(c, &f.type_key, f.shard)?)
}

fn raise_fence(c: &Connection, f: &Fence) -> Result<Epoch, JournalError> {
    let (term, seq) = (to_i64(f.epoch.term, "term")?, to_i64(f.epoch.seq, "epoch")?);
    c.prepare_cached(
        "INSERT INTO shardline_fences (type_key, shard, term, seq) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (type_key, shard) DO UPDATE SET term = excluded.term, seq = excluded.seq
         WHERE (excluded.term, excluded.seq) > (shardline_fences.term, shardline_fences.seq)",
    )
    .map_err(db)?
    .execute(params![f.type_key, f.shard.0, term, seq])
    .map_err(db)?;
    stored_fence(c, &f.type_key, f.shard)?
        .ok_or_else(|| JournalError::Failed(format!("the fence of {} shard {} was not stored", f.type_key, f.shard.0)))
}

fn last_seq(c: &Connection, pid: &str) -> Result<u64, JournalError> {
    let last: Option<i64> = c
        .prepare_cached("SELECT MAX(seq) FROM shardline_events WHERE persistence_id = ?1")
        .map_err(db)?
        .query_row([pid], |r| r.get(0))
        .map_err(db)?;
    to_u64(last.unwrap_or(0), pid, 0, "last sequence number")
}

fn append(c: &Connection, req: &AppendRequest) -> Result<u64, JournalError> {
    check_fence(c, &req.fence)?;
    let pid = &req.persistence_id;
    if let Some(r) = &req.reply {
        if let Some(reply) = recorded_reply(c, pid, &r.request_id)? {
            return Err(JournalError::Duplicate {
                persistence_id: pid.clone(),
                request_id: r.request_id.clone(),
                reply,
            });
        }
    }
    let last = last_seq(c, pid)?;
    if last != req.expected_seq {
        return Err(JournalError::Conflict { persistence_id: pid.clone(), expected: req.expected_seq, actual: last });
    }
    let mut insert = c
        .prepare_cached(
            "INSERT INTO shardline_events (persistence_id, seq, type_name, schema_version, payload)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(db)?;
    for (i, e) in req.events.iter().enumerate() {
        let seq = to_i64(last + 1 + i as u64, "sequence number")?;
        insert.execute(params![pid, seq, e.type_name, e.schema_version, e.payload]).map_err(db)?;
    }
    let new_last = last + req.events.len() as u64;
    if req.remember {
        c.prepare_cached("INSERT OR IGNORE INTO shardline_remembered (type_key, shard, entity_id) VALUES (?1, ?2, ?3)")
            .map_err(db)?
            .execute(params![req.fence.type_key, req.fence.shard.0, req.entity_id])
            .map_err(db)?;
    }
    if let Some(r) = &req.reply {
        let seq = to_i64(new_last, "sequence number")?;
        let now = now_ms();
        let keep = i64::try_from(req.keep_replies.as_millis()).unwrap_or(i64::MAX);
        // Through the index by time: usually the one reply that just aged out.
        c.prepare_cached("DELETE FROM shardline_replies WHERE persistence_id = ?1 AND recorded_at < ?2")
            .map_err(db)?
            .execute(params![pid, now.saturating_sub(keep)])
            .map_err(db)?;
        c.prepare_cached(
            "INSERT OR REPLACE INTO shardline_replies (persistence_id, request_id, seq, reply, recorded_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(db)?
        .execute(params![pid, r.request_id, seq, r.reply, now])
        .map_err(db)?;
    }
    Ok(new_last)
}

fn read(c: &Connection, pid: &str, from: u64) -> Result<Vec<StoredEvent>, JournalError> {
    let mut q = c
        .prepare_cached(
            "SELECT seq, type_name, schema_version, payload FROM shardline_events
             WHERE persistence_id = ?1 AND seq >= ?2 ORDER BY seq",
        )
        .map_err(db)?;
    let rows = q
        .query_map(params![pid, to_i64(from, "sequence number")?], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?, r.get::<_, Vec<u8>>(3)?))
        })
        .map_err(db)?;
    let mut out: Vec<StoredEvent> = Vec::new();
    for row in rows {
        // A row of the wrong type (text where bytes belong, say) is corrupt: name where it is.
        let (seq, type_name, version, payload) = row.map_err(|e| JournalError::Corrupt {
            persistence_id: pid.to_string(),
            seq: out.last().map_or(from, |e| e.seq + 1),
            reason: e.to_string(),
        })?;
        let seq = to_u64(seq, pid, 0, "sequence number")?;
        let schema_version = u32::try_from(version).map_err(|_| JournalError::Corrupt {
            persistence_id: pid.to_string(),
            seq,
            reason: format!("schema version {version} is out of range"),
        })?;
        out.push(StoredEvent { seq, event: EventRecord { type_name, schema_version, payload } });
    }
    Ok(out)
}

fn save_snapshot(c: &Connection, f: &Fence, pid: &str, s: &Snapshot) -> Result<(), JournalError> {
    check_fence(c, f)?;
    c.prepare_cached(
        "INSERT INTO shardline_snapshots (persistence_id, seq, schema_version, payload) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (persistence_id) DO UPDATE SET seq = excluded.seq, schema_version = excluded.schema_version,
            payload = excluded.payload
         WHERE excluded.seq > shardline_snapshots.seq",
    )
    .map_err(db)?
    .execute(params![pid, to_i64(s.seq, "sequence number")?, s.schema_version, s.payload])
    .map_err(db)?;
    Ok(())
}

fn load_snapshot(c: &Connection, pid: &str) -> Result<Option<Snapshot>, JournalError> {
    let row: Option<(i64, i64, Vec<u8>)> = c
        .query_row(
            "SELECT seq, schema_version, payload FROM shardline_snapshots WHERE persistence_id = ?1",
            [pid],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(db)?;
    row.map(|(seq, version, payload)| {
        let seq = to_u64(seq, pid, 0, "snapshot sequence number")?;
        let schema_version = u32::try_from(version).map_err(|_| JournalError::Corrupt {
            persistence_id: pid.to_string(),
            seq,
            reason: format!("snapshot schema version {version} is out of range"),
        })?;
        Ok(Snapshot { seq, schema_version, payload })
    })
    .transpose()
}

fn recorded_reply(c: &Connection, pid: &str, id: &str) -> Result<Option<Vec<u8>>, JournalError> {
    // Prepared once: every append with a request id looks its id up first.
    c.prepare_cached("SELECT reply FROM shardline_replies WHERE persistence_id = ?1 AND request_id = ?2")
        .map_err(db)?
        .query_row([pid, id], |r| r.get(0))
        .optional()
        .map_err(db)
}

fn recorded_replies(c: &Connection, pid: &str, newest: usize) -> Result<Vec<RecordedReply>, JournalError> {
    let limit = i64::try_from(newest).unwrap_or(i64::MAX);
    let mut q = c
        .prepare_cached(
            "SELECT request_id, reply FROM shardline_replies WHERE persistence_id = ?1
             ORDER BY seq DESC, rowid DESC LIMIT ?2",
        )
        .map_err(db)?;
    let rows = q
        .query_map(params![pid, limit], |r| Ok(RecordedReply { request_id: r.get(0)?, reply: r.get(1)? }))
        .map_err(db)?;
    let mut newest_first: Vec<RecordedReply> = rows.map(|r| r.map_err(db)).collect::<Result<_, _>>()?;
    newest_first.reverse();
    Ok(newest_first)
}

/// The writer's clock, in milliseconds since the Unix epoch: what replies are kept by.
fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn remembered(c: &Connection, type_key: &str, shard: ShardId) -> Result<Vec<String>, JournalError> {
    let mut q = c
        .prepare_cached(
            "SELECT entity_id FROM shardline_remembered WHERE type_key = ?1 AND shard = ?2 ORDER BY entity_id",
        )
        .map_err(db)?;
    let rows = q.query_map(params![type_key, shard.0], |r| r.get::<_, String>(0)).map_err(db)?;
    rows.map(|r| r.map_err(db)).collect()
}

fn highest_term(c: &Connection) -> Result<u64, JournalError> {
    let top: Option<i64> = c
        .prepare_cached("SELECT MAX(term) FROM shardline_fences")
        .map_err(db)?
        .query_row([], |r| r.get(0))
        .map_err(db)?;
    top.map_or(Ok(0), |t| to_u64(t, "fences", 0, "term"))
}

fn forget(c: &Connection, f: &Fence, entity_id: &str) -> Result<(), JournalError> {
    check_fence(c, f)?;
    c.prepare_cached("DELETE FROM shardline_remembered WHERE type_key = ?1 AND shard = ?2 AND entity_id = ?3")
        .map_err(db)?
        .execute(params![f.type_key, f.shard.0, entity_id])
        .map_err(db)?;
    Ok(())
}

/// The floor the journal benchmark compares appends with: the same rows inserted raw, in
/// transactions of `per_transaction` rows, into a table of the same shape (no fence, no sequence
/// check), in a file of its own next to `path`, synced as the journal is (`synchronous`).
/// Returns how long the inserts took.
pub fn floor_insert(
    path: &Path,
    rows: &[(String, u64, Vec<u8>)],
    per_transaction: usize,
    synchronous: Synchronous,
) -> Result<Duration, JournalError> {
    let file = path.with_extension("floor.db");
    let _ = std::fs::remove_file(&file);
    let mut conn = Connection::open(&file).map_err(|e| unavailable(&file, e))?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(|e| failed(&file, e))?;
    conn.pragma_update(None, "synchronous", synchronous.as_str()).map_err(|e| failed(&file, e))?;
    conn.execute_batch(
        "CREATE TABLE floor (persistence_id TEXT NOT NULL, seq INTEGER NOT NULL, payload BLOB NOT NULL,
            PRIMARY KEY (persistence_id, seq)) WITHOUT ROWID",
    )
    .map_err(|e| failed(&file, e))?;
    let start = std::time::Instant::now();
    for chunk in rows.chunks(per_transaction.max(1)) {
        let tx = conn.transaction().map_err(db)?;
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO floor (persistence_id, seq, payload) VALUES (?1, ?2, ?3)")
                .map_err(db)?;
            for (pid, seq, payload) in chunk {
                insert.execute(params![pid, to_i64(*seq, "sequence number")?, payload]).map_err(db)?;
            }
        }
        tx.commit().map_err(db)?;
    }
    let took = start.elapsed();
    drop(conn);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(took)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answered command is on disk unless the user chose otherwise: the journal's connection
    /// syncs every commit by default.
    #[test]
    fn the_journal_syncs_every_commit_by_default() {
        let dir = std::env::temp_dir().join(format!("shardline-sync-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (chosen, pragma) in [(SqliteOptions::default().synchronous, 2), (Synchronous::Normal, 1)] {
            let path = dir.join(format!("{}.db", chosen.as_str()));
            let conn = connect(&path, chosen).unwrap();
            let got: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
            assert_eq!(got, pragma, "{chosen:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
