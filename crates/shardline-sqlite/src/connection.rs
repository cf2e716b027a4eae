//! Opening the journal file (WAL, the sync setting, the busy handler, the migrations), waiting
//! for the lock other processes hold, and what a database error means to a caller.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode};
use shardline::journal::JournalError;

use crate::schema::migrate;
use crate::wal::after_commit;
use crate::Synchronous;

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

pub(crate) fn unavailable(path: &Path, e: rusqlite::Error) -> JournalError {
    JournalError::Unavailable(format!("{}: {e}", path.display()))
}

pub(crate) fn failed(path: &Path, e: rusqlite::Error) -> JournalError {
    JournalError::Failed(format!("{}: {e}", path.display()))
}

/// Maps a database error: a busy or locked file, or one that cannot be opened or written, is
/// `Unavailable` (try again later); the rest is `Failed`.
pub(crate) fn db(e: rusqlite::Error) -> JournalError {
    match e.sqlite_error_code() {
        Some(
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked | ErrorCode::CannotOpen | ErrorCode::SystemIoFailure,
        ) => JournalError::Unavailable(e.to_string()),
        _ => JournalError::Failed(e.to_string()),
    }
}

/// How long opening a file may wait for other processes that open it at the same time.
pub(crate) const OPEN_WAIT: Duration = Duration::from_secs(10);

pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked))
}

/// Opens the file, switches it to WAL and migrates it.
pub(crate) fn connect(path: &Path, synchronous: Synchronous) -> Result<Connection, rusqlite::Error> {
    let mut conn = Connection::open(path)?;
    conn.busy_handler(Some(wait_for_lock))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", synchronous.as_str())?;
    conn.pragma_update(None, "cache_size", -65_536)?;
    conn.wal_hook(Some(after_commit));
    migrate(&mut conn)?;
    Ok(conn)
}
