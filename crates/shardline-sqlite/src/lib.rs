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

use std::path::Path;
use std::time::{Duration, Instant};

use shardline::journal::{JournalError, QueuedJournal};

mod bench;
mod connection;
mod coordination;
mod reminders;
mod schema;
mod sql;
mod wal;
mod writer;

pub use bench::floor_insert;
use connection::{connect, failed, is_busy, unavailable, OPEN_WAIT};
pub use coordination::SqliteStore;
use writer::writer;

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
