//! A journal split over two PostgreSQL databases (`SplitJournal`): the shared server and a second
//! server this test starts on a free port, as a deployment would give two database servers.
//!
//! Needs: PostgreSQL at `SHARDLINE_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`, trust authentication) and Debian's PostgreSQL server
//! binaries (`initdb`, `postgres`; package `postgresql`) for the second server. Either missing
//! fails the test and says which.

mod common;

use std::sync::Arc;

use common::Server;
use shardline::journal::conformance::{append, run_all};
use shardline::journal::{Fence, Journal, JournalError, QueuedJournal, SplitJournal};
use shardline::{Epoch, ShardId};
use shardline_postgres::{PostgresConfig, PostgresJournal};

async fn journal(url: &str, schema: &str) -> QueuedJournal {
    match PostgresJournal::connect(PostgresConfig::new(url).schema(schema)).await {
        Ok(j) => j,
        Err(e) => panic!("this test needs PostgreSQL at {url} (set SHARDLINE_TEST_POSTGRES): {e}"),
    }
}

async fn drop_schema(url: &str, schema: &str) {
    let config = PostgresConfig::new(url).schema(schema);
    shardline_postgres::drop_schema(&config).await.expect("schema dropped");
}

/// Both databases: the shared one's URL and the second server.
async fn two_databases(name: &str) -> (Server, Vec<String>, String, SplitJournal) {
    let second = tokio::task::spawn_blocking(Server::init).await.expect("the second server starts");
    let urls = vec![common::url(), second.url()];
    let schema = format!("shardline_test_{name}_{}", common::stamp());
    let mut parts: Vec<Arc<dyn Journal>> = Vec::new();
    for url in &urls {
        parts.push(Arc::new(journal(url, &schema).await));
    }
    let split = SplitJournal::new(parts).expect("two parts");
    (second, urls, schema, split)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_on_two_databases_passes_the_conformance_suite() {
    let (_second, urls, schema, split) = two_databases("split_suite").await;
    run_all(Arc::new(split), "split").await.unwrap();
    for url in &urls {
        drop_schema(url, &schema).await;
    }
}

/// Each database checks the fence of what it writes in its own transaction: a newer owner's claim
/// reaches both, and each refuses the older owner's appends to the entities it holds; entities of
/// both databases are written, each in one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_database_fences_the_entities_it_holds() {
    let (_second, urls, schema, split) = two_databases("split_fence").await;
    let old = Fence { type_key: "acct".into(), shard: ShardId(1), epoch: Epoch { term: 1, seq: 1 } };
    split.raise_fence(&old).await.unwrap();
    // One entity in each database.
    let pids: Vec<String> = (0..2)
        .map(|part| (0..).map(|i| format!("acct|{i}")).find(|p| split.part_of(p) == part).expect("a pid per part"))
        .collect();
    for pid in &pids {
        assert_eq!(split.append(append(&old, pid, 0, 1)).await, Ok(1), "{pid}");
    }
    for (part, url) in urls.iter().enumerate() {
        let alone = journal(url, &schema).await;
        for (k, pid) in pids.iter().enumerate() {
            let want = if k == part { 1 } else { 0 };
            assert_eq!(alone.last_seq(pid).await, Ok(want), "{pid} in database {part}");
        }
    }
    let new = Fence { epoch: Epoch { term: 2, seq: 0 }, ..old.clone() };
    assert_eq!(split.raise_fence(&new).await, Ok(new.epoch));
    for pid in &pids {
        let r = split.append(append(&old, pid, 1, 1)).await;
        assert!(matches!(r, Err(JournalError::Fenced { .. })), "{pid}: {r:?}");
        assert_eq!(split.append(append(&new, pid, 1, 1)).await, Ok(2), "{pid}: the new owner writes");
    }
    assert_eq!(split.highest_term().await, Ok(2));
    for url in &urls {
        drop_schema(url, &schema).await;
    }
}
