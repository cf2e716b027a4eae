//! The coordination store on PostgreSQL: the lease store conformance suite, leases by the server's
//! clock, the change log's pruning, and outages.
//!
//! Needs: PostgreSQL at `SHARDLINE_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`, trust authentication), where each test works in a
//! schema of its own, dropped at the end; and, for the outage test, Debian's PostgreSQL server
//! binaries (`initdb`, `postgres`, package `postgresql`): it starts, stops and restarts a server
//! of its own on a free port. Either missing fails the test, saying what is needed.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::{stamp, url, Server};
use shardline::membership::lease::{conformance, CoordinationStore, StoreError, WatchEvent};
use shardline_postgres::{PostgresConfig, PostgresJournal, PostgresStore};
use tokio_postgres::{Client, NoTls};

fn schema(name: &str) -> String {
    format!("shardline_test_coord_{name}_{}", stamp())
}

async fn store(schema: &str, timeout: Duration) -> PostgresStore {
    match PostgresStore::connect(&url(), schema, timeout).await {
        Ok(s) => s,
        Err(e) => panic!("this test needs PostgreSQL at {} (set SHARDLINE_TEST_POSTGRES): {e}", url()),
    }
}

/// A plain session on the shared server, to look at the tables behind the store's back.
async fn raw() -> Client {
    let (client, conn) = match tokio_postgres::connect(&url(), NoTls).await {
        Ok(c) => c,
        Err(e) => panic!("this test needs PostgreSQL at {} (set SHARDLINE_TEST_POSTGRES): {e}", url()),
    };
    tokio::spawn(conn);
    client
}

async fn drop_schema(schema: &str) {
    raw().await.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("schema dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_conforms() {
    let s = schema("suite");
    let started = Instant::now();
    conformance::run_all(Arc::new(store(&s, Duration::from_secs(5)).await), "conf", Duration::from_secs(1))
        .await
        .unwrap();
    eprintln!("conformance suite: {:?}", started.elapsed());
    drop_schema(&s).await;
}

/// Node processes that start together on a fresh database all open the store beside the journal
/// in one schema: schema and tables are created once, not raced for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_start_together_all_open_a_fresh_schema() {
    let s = schema("together");
    let url = url();
    let stores = (0..8).map(|_| PostgresStore::connect(&url, &s, Duration::from_secs(10)));
    let journals = (0..4).map(|_| PostgresJournal::connect(PostgresConfig::new(&url).schema(&s)));
    let (stores, journals) =
        tokio::join!(futures_util::future::join_all(stores), futures_util::future::join_all(journals));
    for r in &stores {
        if let Err(e) = r {
            panic!("a node could not open the store beside the others (PostgreSQL at {url}): {e}");
        }
    }
    assert!(journals.iter().all(Result::is_ok), "a journal could not open beside the stores");
    let [Ok(a), Ok(b), ..] = &stores[..] else { unreachable!("checked above") };
    assert!(a.compare_and_put("k", b"v".to_vec(), 0).await.unwrap().is_some());
    assert!(b.get("k").await.unwrap().is_some_and(|e| e.value == b"v"), "stores on one schema share keys");
    drop_schema(&s).await;
}

/// A server that cannot be reached is `Unavailable`, promptly; a schema name that is not a plain
/// identifier is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_reports_an_unreachable_server_and_a_bad_schema() {
    let port = shardline::ports::free_port().unwrap();
    let r = PostgresStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/test"), "s", Duration::from_secs(2))
        .await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{:?}", r.err());
    let r = PostgresStore::connect(&url(), "x; DROP TABLE y", Duration::from_secs(2)).await;
    assert!(matches!(r, Err(StoreError::Failed(_))), "{:?}", r.err());
}

/// An ephemeral key's expiry is the server's `clock_timestamp()` plus the TTL, read by the
/// server's clock: whatever `expires_at` says, no timer of the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_expire_by_the_servers_clock() {
    let s = schema("clock");
    let store = store(&s, Duration::from_secs(5)).await;
    let client = raw().await;
    let (db, table) = (&client, format!("{s}.shardline_coordination"));
    let table = &table;
    let clock =
        move || async move { db.query_one("SELECT clock_timestamp()", &[]).await.unwrap().get::<_, SystemTime>(0) };
    let expires = move |key: &'static str| async move {
        let q = format!("SELECT expires_at FROM {table} WHERE key = $1");
        db.query_one(&q, &[&key]).await.unwrap().get::<_, SystemTime>(0)
    };
    let ttl = Duration::from_secs(1);

    // Set to the server's clock plus the TTL.
    let before = clock().await;
    let rev = store.create_ephemeral("a", b"a".to_vec(), ttl).await.unwrap().expect("created");
    let after = clock().await;
    let at = expires("a").await;
    assert!(
        before + ttl <= at && at <= after + ttl,
        "expires_at {at:?} is not the server's clock + 1 s ({before:?}..{after:?})"
    );
    // Absent once the server's clock passes it; a refresh then fails, and does not revive it.
    while clock().await <= at {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.get("a").await.unwrap(), None, "an expired key was read");
    assert_eq!(store.refresh("a", b"a".to_vec(), rev, ttl).await.unwrap(), None, "an expired key was refreshed");
    assert_eq!(expires("a").await, at, "the refresh of an expired key moved its expiry");
    assert_eq!(store.list("").await.unwrap(), vec![], "an expired key was listed");
    assert_eq!(store.compare_and_put("a", b"x".to_vec(), rev).await.unwrap(), None, "an expired key was written");

    // The server's word only: a key the database says expires in an hour outlives its TTL...
    let rev = store.create_ephemeral("b", b"b".to_vec(), ttl).await.unwrap().expect("created");
    let q = format!("UPDATE {table} SET expires_at = clock_timestamp() + interval '1 hour' WHERE key = 'b'");
    db.execute(&q, &[]).await.unwrap();
    tokio::time::sleep(ttl * 2).await;
    assert!(store.get("b").await.unwrap().is_some(), "a key expired before the database said");
    // ...and one it says expired is gone at once: absent, not refreshable, and its expiry reaches
    // a watch as a delete.
    let mut watch = store.watch("b").await.unwrap();
    let q = format!("UPDATE {table} SET expires_at = clock_timestamp() WHERE key = 'b'");
    db.execute(&q, &[]).await.unwrap();
    assert_eq!(store.get("b").await.unwrap(), None, "a key the database expired was read");
    assert_eq!(store.refresh("b", b"b".to_vec(), rev, ttl).await.unwrap(), None, "an expired key was refreshed");
    loop {
        // (The edit of `expires_at` itself is a put.)
        match tokio::time::timeout(Duration::from_secs(5), watch.recv()).await {
            Ok(Some(WatchEvent::Delete { key })) => break assert_eq!(key, "b"),
            Ok(Some(WatchEvent::Put(e))) if e.key == "b" => {}
            other => panic!("the watch did not report the expiry: {other:?}"),
        }
    }
    // Created anew after its expired row is deleted.
    assert!(store.create_ephemeral("b", b"c".to_vec(), ttl).await.unwrap().is_some(), "cannot recreate");
    drop_schema(&s).await;
}

/// Old changes are pruned (their highest position remembered), and a watch whose position was
/// pruned past ends instead of missing changes silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_changes_are_pruned_and_a_watch_behind_them_ends() {
    let s = schema("prune");
    let store = store(&s, Duration::from_secs(5)).await;
    // The store prunes at its first write, and then once a minute.
    store.compare_and_put("w/0", b"0".to_vec(), 0).await.unwrap();
    let mut watch = store.watch("w/").await.unwrap();
    let db = raw().await;
    let old: i64 = db
        .query_one(
            &format!(
                "INSERT INTO {s}.shardline_coordination_changes (key, kind, revision, at)
                 VALUES ('old', 'delete', 0, clock_timestamp() - interval '1 hour') RETURNING seq"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // The watch passes it before it is pruned.
    store.compare_and_put("w/1", b"1".to_vec(), 0).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), watch.recv()).await {
        Ok(Some(WatchEvent::Put(e))) => assert_eq!(e.key, "w/1"),
        other => panic!("the watch missed a put: {other:?}"),
    }
    // A second store prunes at its first write.
    let other = PostgresStore::connect(&url(), &s, Duration::from_secs(5)).await.unwrap();
    other.compare_and_put("w/x", b"x".to_vec(), 0).await.unwrap();
    let gone: i64 = db
        .query_one(&format!("SELECT COUNT(*) FROM {s}.shardline_coordination_changes WHERE seq = $1"), &[&old])
        .await
        .unwrap()
        .get(0);
    let upto: i64 =
        db.query_one(&format!("SELECT upto FROM {s}.shardline_coordination_pruned"), &[]).await.unwrap().get(0);
    assert_eq!((gone, upto), (0, old), "the old change was not pruned, or its position not remembered");
    match tokio::time::timeout(Duration::from_secs(5), watch.recv()).await {
        Ok(Some(WatchEvent::Put(e))) => assert_eq!(e.key, "w/x"),
        other => panic!("the watch missed a put: {other:?}"),
    }
    // Pruned past the watch's position (as after a long outage of its connection): it ends.
    db.execute(&format!("UPDATE {s}.shardline_coordination_pruned SET upto = upto + 1000"), &[]).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), watch.recv()).await {
        Ok(None) => {}
        other => panic!("a watch behind the pruned changes did not end: {other:?}"),
    }
    drop_schema(&s).await;
}

/// A change that commits late (here: another session's open transaction) still reaches a watch:
/// writers take turns, so a later change cannot commit first and move the watch past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_commits_late_is_not_skipped() {
    let s = schema("late");
    let store = Arc::new(store(&s, Duration::from_secs(5)).await);
    let mut watch = store.watch("c/").await.unwrap();
    let mut db = raw().await;
    let tx = db.transaction().await.unwrap();
    tx.execute(&format!("INSERT INTO {s}.shardline_coordination (key, value) VALUES ('c/late', 'x')"), &[])
        .await
        .unwrap();
    let writer = store.clone();
    let after = tokio::spawn(async move { writer.compare_and_put("c/after", b"y".to_vec(), 0).await });
    // The watch polls a few times meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    tx.commit().await.unwrap();
    assert!(after.await.unwrap().unwrap().is_some(), "the later write failed");
    let mut keys = Vec::new();
    while keys.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(5), watch.recv()).await {
            Ok(Some(WatchEvent::Put(e))) => keys.push(e.key),
            other => panic!("the watch saw {keys:?}, then {other:?}"),
        }
    }
    assert_eq!(keys, ["c/late", "c/after"]);
    drop_schema(&s).await;
}

/// A call the server does not answer (here: a write waiting for a lock) is `Unavailable` within
/// the timeout, and the store works on afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_hangs_is_unavailable_within_the_timeout() {
    let s = schema("hang");
    let timeout = Duration::from_secs(1);
    let store = store(&s, timeout).await;
    let mut db = raw().await;
    let tx = db.transaction().await.unwrap();
    tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&format!("shardline-coordination-writes-{s}")])
        .await
        .unwrap();
    let started = Instant::now();
    let r = store.compare_and_put("k", b"v".to_vec(), 0).await;
    let took = started.elapsed();
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    assert!(took < timeout + Duration::from_millis(500), "the call took {took:?}, beyond its timeout {timeout:?}");
    tx.rollback().await.unwrap();
    assert!(store.compare_and_put("k", b"v".to_vec(), 0).await.unwrap().is_some(), "the store did not recover");
    drop_schema(&s).await;
}

/// The database hangs, loses its sessions, then stops: calls are `Unavailable` within the timeout,
/// not hung; it comes back: the same store works again, and so does a watch made before the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_is_a_typed_error_then_recovers() {
    let mut server = tokio::task::spawn_blocking(Server::init).await.unwrap();
    let timeout = Duration::from_secs(2);
    let store = PostgresStore::connect(&server.url(), "coord", timeout).await.expect("connects to the test's server");
    let mut watch = store.watch("k").await.unwrap();
    let r1 = store.compare_and_put("k", b"v".to_vec(), 0).await.unwrap().expect("written");
    let calls_fail = |when: &'static str| {
        let store = &store;
        async move {
            for call in ["get", "put"] {
                let started = Instant::now();
                let r = match call {
                    "get" => store.get("k").await.map(|_| ()),
                    _ => store.compare_and_put("k", b"w".to_vec(), r1).await.map(|_| ()),
                };
                assert!(matches!(r, Err(StoreError::Unavailable(_))), "{call} while the server {when}: {r:?}");
                let took = started.elapsed();
                assert!(took < timeout + Duration::from_millis(500), "{call} while the server {when} took {took:?}");
            }
        }
    };
    let works_again = || async {
        let started = Instant::now();
        loop {
            match store.get("k").await {
                Ok(e) => break e,
                Err(e) => assert!(started.elapsed() < Duration::from_secs(20), "store still failing: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    // Hung: connections open, no answer.
    server.pause();
    calls_fail("hangs").await;
    server.resume();
    let entry = works_again().await;
    assert!(entry.is_some_and(|e| e.value == b"v" && e.revision == r1), "the key changed while the server hung");
    // Sessions killed in the middle of a call: the connection just closes.
    let (db, conn) = tokio_postgres::connect(&server.url(), NoTls).await.expect("connects to the test's server");
    tokio::spawn(conn);
    let sessions = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()";
    let pids: Vec<String> =
        db.query(sessions, &[]).await.unwrap().iter().map(|r| r.get::<_, i32>(0).to_string()).collect();
    server.pause();
    let in_flight = tokio::spawn({
        let store = store.clone();
        async move { store.get("k").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A session listed above may have ended since (a connection the store dropped): kill each on
    // its own, and require that some were still there to kill.
    let killed = pids
        .iter()
        .filter(|pid| std::process::Command::new("kill").args(["-KILL", pid.as_str()]).status().unwrap().success())
        .count();
    assert!(killed > 0, "none of the sessions {pids:?} was left to kill");
    server.resume();
    let r = in_flight.await.unwrap();
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "a get whose session was killed: {r:?}");
    works_again().await;
    // Down.
    let server = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();
    calls_fail("is down").await;
    let _server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.start();
        server
    })
    .await
    .unwrap();
    let entry = works_again().await;
    assert!(entry.is_some_and(|e| e.value == b"v" && e.revision == r1), "the key did not survive the restart");
    let r2 = store.compare_and_put("k", b"w".to_vec(), r1).await.unwrap().expect("written after the restart");
    let mut seen = Vec::new();
    while !seen.contains(&r2) {
        match tokio::time::timeout(Duration::from_secs(10), watch.recv()).await {
            Ok(Some(WatchEvent::Put(e))) => seen.push(e.revision),
            other => panic!("the watch did not survive the outage: {other:?} after {seen:?}"),
        }
    }
    assert_eq!(seen, [r1, r2], "the watch saw {seen:?}");
}
