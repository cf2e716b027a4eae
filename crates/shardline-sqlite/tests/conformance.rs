//! The journal conformance suite on a real SQLite file, and what only a file can show: a second
//! handle on the same file (another node process on the host) sees the same fences and history,
//! and reopening keeps everything.

use std::sync::Arc;

use shardline::journal::conformance::{append, run_all, two_handles_share_fences_and_history};
use shardline::journal::{Fence, Journal, JournalError};
use shardline::{Epoch, ShardId};
use shardline_sqlite::SqliteJournal;

fn temp_file(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("shardline-sqlite-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("journal.db")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_journal_passes_the_conformance_suite() {
    let path = temp_file("suite");
    run_all(Arc::new(SqliteJournal::open(&path).unwrap()), "sqlite").await.unwrap();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Two handles on one file, as two node processes of one host: a fence raised through one
/// refuses the other's older writes, and both see one history; reopening keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_on_one_file_share_fences_and_history() {
    let path = temp_file("shared");
    let a = SqliteJournal::open(&path).unwrap();
    let b = SqliteJournal::open(&path).unwrap();
    two_handles_share_fences_and_history(&a, &b, "acct").await.unwrap();
    drop((a, b));
    let again = SqliteJournal::open(&path).unwrap();
    assert_eq!(again.read("acct|x", 1).await.unwrap().len(), 3);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A file written by a newer schema version is refused, not misread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_from_a_newer_schema_is_refused() {
    let path = temp_file("newer");
    drop(SqliteJournal::open(&path).unwrap());
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute("INSERT INTO shardline_schema (version) VALUES (999)", []).unwrap();
    drop(c);
    let r = SqliteJournal::open(&path);
    assert!(matches!(&r, Err(JournalError::Failed(m)) if m.contains("newer")), "{:?}", r.err());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Two nodes that both believe they own a shard, on one SQLite file: the older one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_owners_of_one_shard() {
    let path = temp_file("owners");
    let j = SqliteJournal::open(&path).unwrap();
    shardline::drills::two_owners_of_one_shard(Arc::new(j), "lite").await.unwrap();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// The file is locked by another process's long transaction (the outage an embedded database
/// has) under load, then released: asks fail meanwhile, nothing acknowledged is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_outage_under_load() {
    let path = temp_file("outage");
    let j = SqliteJournal::open(&path).unwrap();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (locked_tx, locked_rx) = tokio::sync::oneshot::channel::<()>();
    let locker_path = path.clone();
    let cut = async move {
        std::thread::spawn(move || {
            let c = rusqlite::Connection::open(&locker_path).expect("a second connection opens");
            // The node is writing under load: without a busy timeout, BEGIN EXCLUSIVE fails at
            // once whenever one of its transactions holds the lock.
            c.busy_timeout(std::time::Duration::from_secs(30)).expect("sets a busy timeout");
            c.execute_batch("BEGIN EXCLUSIVE").expect("takes the write lock");
            let _ = locked_tx.send(());
            let _ = release_rx.recv();
            c.execute_batch("ROLLBACK").expect("releases it");
        });
        locked_rx.await.expect("the lock was taken");
    };
    let restore = async move {
        let _ = release_tx.send(());
    };
    shardline::drills::outage_under_load(Arc::new(j), "lite", cut, restore).await.unwrap();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Node processes that start together open (create, switch to WAL, migrate) one new file at
/// once: every one of them gets the journal.
#[test]
fn many_open_one_new_file_at_once() {
    let path = temp_file("racing-opens");
    let openers: Vec<_> = (0..8)
        .map(|_| {
            let p = path.clone();
            std::thread::spawn(move || SqliteJournal::open(&p).map(drop))
        })
        .collect();
    for o in openers {
        assert_eq!(o.join().expect("opener"), Ok(()));
    }
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A file of schema version 1 (events in a rowid table) is migrated with its history: the events
/// read back the same, and appends go on after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_file_is_migrated_with_its_events() {
    let path = temp_file("v1");
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE shardline_schema (version INTEGER NOT NULL);
             INSERT INTO shardline_schema (version) VALUES (1);
             CREATE TABLE shardline_fences (
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
                PRIMARY KEY (type_key, shard, entity_id));
             INSERT INTO shardline_fences VALUES ('acct', 1, 1, 1);
             INSERT INTO shardline_events VALUES ('acct|x', 1, 'a', 1, x'00ff'), ('acct|x', 2, 'b', 2, x'01');",
        )
        .unwrap();
    }
    let j = SqliteJournal::open(&path).unwrap();
    let events = j.read("acct|x", 1).await.unwrap();
    let got: Vec<(u64, &str, u32, &[u8])> = events
        .iter()
        .map(|e| (e.seq, e.event.type_name.as_str(), e.event.schema_version, &e.event.payload[..]))
        .collect();
    assert_eq!(got, vec![(1, "a", 1, &[0u8, 255][..]), (2, "b", 2, &[1u8][..])]);
    let f = Fence { type_key: "acct".into(), shard: ShardId(1), epoch: Epoch { term: 1, seq: 1 } };
    assert_eq!(j.append(append(&f, "acct|x", 2, 1)).await, Ok(3));
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Three handles on one file write at once, as three node processes of a host under load. The
/// write-ahead log stays near its limit: SQLite's own checkpoint never finds a moment when the
/// log can start over while another writer is always mid-transaction (the demo's log grew by
/// gigabytes in a minute), so a writer past the limit waits for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_ahead_log_stays_bounded_under_writers_from_several_handles() {
    const LIMIT_PAGES: u32 = 256;
    let path = temp_file("wal-bound");
    let options = shardline_sqlite::SqliteOptions { wal_restart_pages: LIMIT_PAGES, ..Default::default() };
    let handles: Vec<Arc<dyn Journal>> = (0..3)
        .map(|_| Arc::new(SqliteJournal::open_with(&path, options.clone()).unwrap()) as Arc<dyn Journal>)
        .collect();
    let f = Fence { type_key: "acct".into(), shard: ShardId(1), epoch: Epoch { term: 1, seq: 1 } };
    handles[0].raise_fence(&f).await.unwrap();
    let wal = path.with_file_name("journal.db-wal");
    let mut largest = 0;
    let mut writers = tokio::task::JoinSet::new();
    for (h, journal) in handles.iter().enumerate() {
        for w in 0..16 {
            let (journal, f) = (journal.clone(), f.clone());
            writers.spawn(async move {
                for n in 0..150u64 {
                    let pid = format!("acct|{h}-{w}");
                    journal.append(append(&f, &pid, n, 1)).await.unwrap();
                }
            });
        }
    }
    while !writers.is_empty() {
        if let Ok(Some(done)) = tokio::time::timeout(std::time::Duration::from_millis(5), writers.join_next()).await {
            done.unwrap();
        }
        largest = largest.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
    }
    let pages = largest / 4096;
    // The limit, plus what other writers commit while one waits for the restart.
    assert!(pages <= 8 * u64::from(LIMIT_PAGES), "the write-ahead log grew to {pages} pages (limit {LIMIT_PAGES})");
    for (h, journal) in handles.iter().enumerate() {
        assert_eq!(journal.last_seq(&format!("acct|{h}-0")).await.unwrap(), 150);
    }
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
