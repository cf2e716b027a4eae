//! The coordination store in a SQLite file: the lease store conformance suite, two stores on one
//! file (two node processes of a host), leases by the host's clock, the change log's pruning, and
//! a file locked by another process.
//!
//! Needs: nothing but a temporary directory (SQLite is compiled in).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::Connection;
use shardline::journal::Journal;
use shardline::membership::lease::{conformance, CoordinationStore, StoreError, WatchEvent};
use shardline_sqlite::{SqliteJournal, SqliteStore};
use tokio::sync::mpsc;

fn temp_file(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("shardline-sqlite-coord-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("node.db")
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// The next event of `w` within 5 s.
async fn next(w: &mut mpsc::Receiver<WatchEvent>) -> Option<WatchEvent> {
    tokio::time::timeout(Duration::from_secs(5), w.recv()).await.expect("a watch event within 5 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_conforms() {
    let path = temp_file("suite");
    let started = Instant::now();
    conformance::run_all(Arc::new(SqliteStore::open(&path).unwrap()), "conf", Duration::from_secs(1)).await.unwrap();
    eprintln!("conformance suite: {:?}", started.elapsed());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Two stores on one file, as two node processes of a host (beside the journal in the same
/// file): each sees the other's writes in reads and watches, and one of them leads at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_file_see_each_other() {
    let path = temp_file("shared");
    let journal = SqliteJournal::open(&path).unwrap();
    let (a, b) = (SqliteStore::open(&path).unwrap(), SqliteStore::open(&path).unwrap());
    let mut watch_b = b.watch("cluster/").await.unwrap();

    let rev = a.compare_and_put("cluster/map", b"m".to_vec(), 0).await.unwrap().expect("written");
    match next(&mut watch_b).await {
        Some(WatchEvent::Put(e)) => {
            assert_eq!((e.key.as_str(), e.value.as_slice(), e.revision), ("cluster/map", &b"m"[..], rev))
        }
        other => panic!("b's watch did not see a's put: {other:?}"),
    }
    assert_eq!(b.get("cluster/map").await.unwrap().map(|e| e.revision), Some(rev));
    assert_eq!(b.compare_and_put("cluster/map", b"n".to_vec(), 0).await.unwrap(), None, "b overwrote a's key");

    // One leader between them; when it stops refreshing, the other takes over, and the expiry
    // reaches b's watch.
    let ttl = Duration::from_secs(1);
    let (wa, wb) = tokio::join!(
        a.create_ephemeral("cluster/leader", b"a".to_vec(), ttl),
        b.create_ephemeral("cluster/leader", b"b".to_vec(), ttl)
    );
    let (wa, wb) = (wa.unwrap(), wb.unwrap());
    assert!(wa.is_some() != wb.is_some(), "leaders: a {wa:?}, b {wb:?}");
    let (first, second) = if wa.is_some() { (&a, &b) } else { (&b, &a) };
    let leader = first.get("cluster/leader").await.unwrap().expect("a leader");
    assert_eq!(second.get("cluster/leader").await.unwrap().as_ref(), Some(&leader), "the stores disagree");
    let mut events = Vec::new();
    while !matches!(events.last(), Some(WatchEvent::Delete { .. })) {
        events.push(next(&mut watch_b).await.expect("watch open"));
    }
    assert_eq!(events.len(), 2, "b's watch saw {events:?}: the leader's put, then its expiry");
    assert!(second.create_ephemeral("cluster/leader", b"2".to_vec(), ttl).await.unwrap().is_some(), "no take-over");
    assert_eq!(first.get("cluster/leader").await.unwrap().map(|e| e.value), Some(b"2".to_vec()));
    // The journal in the same file is untouched.
    assert_eq!(journal.last_seq("nobody").await.unwrap(), 0);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Node processes that start together on a new file all open it (beside the journal): the loser
/// of the race to switch it to WAL starts over instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_that_open_a_new_file_together_all_open_it() {
    for round in 0..30 {
        let path = temp_file(&format!("together-{round}"));
        let start = Arc::new(std::sync::Barrier::new(8));
        let opens: Vec<_> = (0..8)
            .map(|i| {
                let (path, start) = (path.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    if i % 4 == 0 {
                        SqliteJournal::open(&path).map(|_| ()).map_err(|e| e.to_string())
                    } else {
                        SqliteStore::open(&path).map(|_| ()).map_err(|e| e.to_string())
                    }
                })
            })
            .collect();
        for o in opens {
            o.join().unwrap().unwrap();
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}

/// An ephemeral key's expiry is the host's clock plus the TTL, and whatever `expires_at` says
/// decides: a refresh after it fails and does not revive the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_expire_by_the_stored_clock() {
    let path = temp_file("clock");
    let store = SqliteStore::open(&path).unwrap();
    let raw = Connection::open(&path).unwrap();
    let expires = |key: &str| -> i64 {
        raw.query_row("SELECT expires_at FROM shardline_coordination WHERE key = ?1", [key], |r| r.get(0)).unwrap()
    };
    let ttl = Duration::from_secs(1);
    let before = now_ms();
    let rev = store.create_ephemeral("a", b"a".to_vec(), ttl).await.unwrap().expect("created");
    let after = now_ms();
    let at = expires("a");
    assert!(before + 1000 <= at && at <= after + 1000, "expires_at {at} is not the clock + 1 s ({before}..{after})");
    while now_ms() <= at {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.get("a").await.unwrap(), None, "an expired key was read");
    assert_eq!(store.refresh("a", b"a".to_vec(), rev, ttl).await.unwrap(), None, "an expired key was refreshed");
    assert_eq!(expires("a"), at, "the refresh of an expired key moved its expiry");
    assert_eq!(store.compare_and_put("a", b"x".to_vec(), rev).await.unwrap(), None, "an expired key was written");

    // A key the file says expires in an hour outlives its TTL; one it says expired is gone.
    let rev = store.create_ephemeral("b", b"b".to_vec(), ttl).await.unwrap().expect("created");
    raw.execute("UPDATE shardline_coordination SET expires_at = ?1 WHERE key = 'b'", [now_ms() + 3_600_000]).unwrap();
    tokio::time::sleep(ttl * 2).await;
    assert!(store.get("b").await.unwrap().is_some(), "a key expired before the file said");
    raw.execute("UPDATE shardline_coordination SET expires_at = ?1 WHERE key = 'b'", [now_ms()]).unwrap();
    assert_eq!(store.get("b").await.unwrap(), None, "a key the file expired was read");
    assert_eq!(store.refresh("b", b"b".to_vec(), rev, ttl).await.unwrap(), None, "an expired key was refreshed");
    assert!(store.create_ephemeral("b", b"c".to_vec(), ttl).await.unwrap().is_some(), "cannot recreate");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Old changes are pruned (their highest position remembered), and a watch whose position was
/// pruned past ends instead of missing changes silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_changes_are_pruned_and_a_watch_behind_them_ends() {
    let path = temp_file("prune");
    let store = SqliteStore::open(&path).unwrap();
    // The store prunes at its first write, and then once a minute.
    store.compare_and_put("w/0", b"0".to_vec(), 0).await.unwrap();
    let mut watch = store.watch("w/").await.unwrap();
    let raw = Connection::open(&path).unwrap();
    let old: i64 = raw
        .query_row(
            "INSERT INTO shardline_coordination_changes (key, kind, revision, at) VALUES ('old', 'delete', 0, ?1)
             RETURNING seq",
            [now_ms() - 3_600_000],
            |r| r.get(0),
        )
        .unwrap();
    // The watch passes it before it is pruned.
    store.compare_and_put("w/1", b"1".to_vec(), 0).await.unwrap();
    assert!(matches!(next(&mut watch).await, Some(WatchEvent::Put(e)) if e.key == "w/1"), "the watch missed a put");
    // A second store prunes at its first write.
    let other = SqliteStore::open(&path).unwrap();
    other.compare_and_put("w/x", b"x".to_vec(), 0).await.unwrap();
    let (gone, upto): (i64, i64) = raw
        .query_row(
            "SELECT (SELECT COUNT(*) FROM shardline_coordination_changes WHERE seq = ?1),
                (SELECT pruned FROM shardline_coordination_state)",
            [old],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((gone, upto), (0, old), "the old change was not pruned, or its position not remembered");
    assert!(matches!(next(&mut watch).await, Some(WatchEvent::Put(e)) if e.key == "w/x"), "the watch missed a put");
    // Pruned past the watch's position (as after a long stall): it ends.
    raw.execute("UPDATE shardline_coordination_state SET pruned = pruned + 1000", []).unwrap();
    assert_eq!(next(&mut watch).await, None, "a watch behind the pruned changes did not end");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A file another process keeps locked: a write waits for the lock (up to 5 s), then is
/// `Unavailable`, and works once the lock is released; reads go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_file_is_unavailable_then_recovers() {
    let path = temp_file("locked");
    let store = SqliteStore::open(&path).unwrap();
    store.compare_and_put("k", b"v".to_vec(), 0).await.unwrap();
    let raw = Connection::open(&path).unwrap();
    raw.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert!(store.get("k").await.unwrap().is_some(), "a read waited for the writer");
    let started = Instant::now();
    let r = store.compare_and_put("k2", b"v".to_vec(), 0).await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(6),
        "the write waited {waited:?}, not 5 s"
    );
    raw.execute_batch("ROLLBACK").unwrap();
    assert!(store.compare_and_put("k2", b"v".to_vec(), 0).await.unwrap().is_some(), "the store did not recover");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
