//! The end-to-end failure drills on real PostgreSQL servers.
//!
//! Needs: PostgreSQL at `SHARDLINE_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`) for the two-owners drill, and Debian's PostgreSQL
//! server binaries (`initdb`, `postgres`, package `postgresql`) for the outage drill, which
//! starts, stops and restarts a server of its own on a free port. Either missing fails the test
//! and says what to install.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{stamp, url, Server};
use shardline::drills;
use shardline_postgres::{PostgresConfig, PostgresJournal};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_owners_of_one_shard() {
    let schema = format!("shardline_test_owners_{}", stamp());
    let j = match PostgresJournal::connect(PostgresConfig::new(url()).schema(&schema)).await {
        Ok(j) => j,
        Err(e) => panic!("this test needs PostgreSQL at {} (set SHARDLINE_TEST_POSTGRES): {e}", url()),
    };
    drills::two_owners_of_one_shard(Arc::new(j), "pg").await.unwrap();
    let (client, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls).await.expect("connects");
    tokio::spawn(conn);
    client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("schema dropped");
}

/// The server stops under load and comes back on the same port: the node's asks fail meanwhile,
/// it serves again afterwards without a restart, and nothing acknowledged is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_under_load() {
    let server = Arc::new(Mutex::new(Server::init()));
    let url = server.lock().unwrap().url();
    let config = PostgresConfig { timeout: Duration::from_secs(2), ..PostgresConfig::new(&url).schema("drill") };
    let j = PostgresJournal::connect(config).await.expect("connects to the test's server");
    let (down, up) = (server.clone(), server.clone());
    let cut = async move { tokio::task::spawn_blocking(move || down.lock().unwrap().stop()).await.unwrap() };
    let restore = async move { tokio::task::spawn_blocking(move || up.lock().unwrap().start()).await.unwrap() };
    drills::outage_under_load(Arc::new(j), "pg", cut, restore).await.unwrap();
}
