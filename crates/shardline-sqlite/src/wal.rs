//! The write-ahead log kept bounded: the connection's commit hook in place of SQLite's automatic
//! checkpoint, and the writer's restart of the log once it grows past its limit.

use std::cell::Cell;
use std::ffi::c_int;
use std::path::Path;

use rusqlite::hooks::{CheckpointMode, Wal};
use rusqlite::Connection;
use tracing::{debug, warn};

/// Frames (pages) of write-ahead log past which a commit copies it into the database without
/// waiting for anyone (SQLite's automatic checkpoint, which [`after_commit`] replaces). 8,000
/// (32 MiB) rather than SQLite's 1,000: appends dirty pages all over the file, and a page written
/// many times between two checkpoints is copied back once; the demo's journaled phase ran about
/// a fifth faster (medians of 4 alternated runs). Below the restart mark of the default options.
const CHECKPOINT_FRAMES: c_int = 8000;

thread_local! {
    /// The length of the write-ahead log after this thread's last commit, from [`after_commit`]
    /// (a plain function: it cannot capture anything, and the writer thread makes every commit).
    static WAL_FRAMES: Cell<c_int> = const { Cell::new(0) };
}

/// The connection's write-ahead log hook, run after each commit: SQLite's automatic checkpoint,
/// plus the log's length for [`bound_wal`]. Never an error: the commit has happened, and an error
/// here would make it look failed.
pub(crate) fn after_commit(wal: &Wal, frames: c_int) -> rusqlite::Result<()> {
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
/// [`SqliteOptions::wal_restart_pages`](crate::SqliteOptions::wal_restart_pages), a `RESTART`
/// checkpoint holds new writers back (through the busy handler) until the log is copied and
/// unread, and the next transaction writes it from its beginning.
pub(crate) fn bound_wal(conn: &Connection, path: &Path, limit: u32) {
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
