//! The journal conformance suite against a real PostgreSQL server.
//!
//! Needs: PostgreSQL at `SHARDLINE_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`, trust authentication). Each test works in a schema of
//! its own, dropped at the end. A server that cannot be reached fails the test, naming the URL.

use std::sync::Arc;

use shardline::journal::conformance::{run_all, two_handles_share_fences_and_history};
use shardline::journal::JournalError;
use shardline_postgres::{PostgresConfig, PostgresJournal};

fn url() -> String {
    std::env::var("SHARDLINE_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A schema name no other test run uses.
fn schema(name: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("shardline_test_{name}_{}_{nanos}", std::process::id())
}

async fn journal(schema: &str) -> shardline::journal::QueuedJournal {
    match PostgresJournal::connect(PostgresConfig::new(url()).schema(schema)).await {
        Ok(j) => j,
        Err(e) => panic!("this test needs PostgreSQL at {} (set SHARDLINE_TEST_POSTGRES): {e}", url()),
    }
}

async fn drop_schema(schema: &str) {
    let (client, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls).await.expect("connects");
    tokio::spawn(conn);
    client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("schema dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_journal_passes_the_conformance_suite() {
    let s = schema("suite");
    run_all(Arc::new(journal(&s).await), "pg").await.unwrap();
    drop_schema(&s).await;
}

/// Two journals on one schema, as two node processes: fences and histories are shared, the
/// older writer is refused by the database, and a second migration of the same schema is a no-op.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_schema_share_fences_and_history() {
    let s = schema("shared");
    let (a, b) = (journal(&s).await, journal(&s).await);
    two_handles_share_fences_and_history(&a, &b, "pg").await.unwrap();
    drop_schema(&s).await;
}

/// Node processes that start together on a fresh database all open the journal: the schema is
/// created once, not raced for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_start_together_all_open_a_fresh_schema() {
    let s = schema("together");
    let opens = (0..8).map(|_| PostgresJournal::connect(PostgresConfig::new(url()).schema(&s)));
    for r in futures_util::future::join_all(opens).await {
        if let Err(e) = r {
            panic!("a node could not open the journal beside the others (PostgreSQL at {}): {e}", url());
        }
    }
    drop_schema(&s).await;
}

/// A schema written by a newer version is refused, not misread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_from_a_newer_version_is_refused() {
    let s = schema("newer");
    drop(journal(&s).await);
    let (client, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls).await.expect("connects");
    tokio::spawn(conn);
    client.batch_execute(&format!("INSERT INTO {s}.shardline_schema (version) VALUES (999)")).await.unwrap();
    let r = PostgresJournal::connect(PostgresConfig::new(url()).schema(&s)).await;
    assert!(matches!(&r, Err(JournalError::Failed(m)) if m.contains("newer")), "{:?}", r.err());
    drop_schema(&s).await;
}

/// A server that cannot be reached is `Unavailable`, promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable() {
    let port = shardline::ports::free_port().unwrap();
    let config = PostgresConfig::new(format!("postgres://postgres@127.0.0.1:{port}/test"));
    let r = PostgresJournal::connect(config).await;
    assert!(matches!(r, Err(JournalError::Unavailable(_))), "{:?}", r.err());
}
