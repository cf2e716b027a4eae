//! Multi-process tests: real `shardline node` processes on 127.0.0.1, killed for real. This
//! test process joins as a proxy node to drive and observe them. Deadlines are generous; no
//! test depends on timing luck.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardline::{Cluster, EntityHandle, Seeds};
use shardline_cli::{account_settings, Account, AccountCmd};

const SHARDS: u32 = 64;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(name: &str, port: u16, seed: u16) -> Node {
    let child = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args([
            "node",
            "--name",
            name,
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--seeds",
            &format!("127.0.0.1:{seed}"),
            "--shards",
            &SHARDS.to_string(),
        ])
        .env("RUST_LOG", std::env::var("SHARDLINE_TEST_NODE_LOG").unwrap_or_else(|_| "warn".into()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("the shardline binary starts");
    Node(child)
}

async fn driver(seed: u16) -> (Cluster, EntityHandle<Account>) {
    let c = Cluster::builder()
        .cluster_name("shardline-demo")
        .node_name("test-driver")
        .proxy()
        .membership(Seeds::new([format!("127.0.0.1:{seed}")]))
        .build()
        .await
        .expect("driver starts");
    let h = c.register::<Account>(account_settings(SHARDS)).await.expect("type registers");
    (c, h)
}

async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn owners(h: &EntityHandle<Account>) -> Vec<String> {
    h.shard_homes().iter().map(|o| o.as_ref().map(|n| n.name.to_string()).unwrap_or_default()).collect()
}

#[test]
fn bad_flags_exit_2_with_a_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_shardline")).args(["node", "--bind", "127.0.0.1:1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--name"), "names the missing flag");
    let out = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args(["node", "--name", "x", "--bind", "127.0.0.1:1", "--seeds", "127.0.0.1:1", "--shards", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args(["node", "--name", "x", "--bind", "not-an-address", "--seeds", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a bind failure is reported, not a panic");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot bind"));
    let out = Command::new(env!("CARGO_BIN_EXE_shardline")).args(["demo", "--nodes", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn flags_read_from_the_environment() {
    let port = free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .arg("node")
        .env("SHARDLINE_NAME", "envnode")
        .env("SHARDLINE_BIND", "not-an-address")
        .env("SHARDLINE_SEEDS", format!("127.0.0.1:{port}"))
        .output()
        .unwrap();
    // Every required flag came from the environment: it got as far as binding.
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot bind"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_node_moves_its_shards_within_the_down_timeout() {
    let (p1, p2) = (free_port(), free_port());
    let _n1 = spawn("n1", p1, p1);
    let mut n2 = spawn("n2", p2, p1);
    let (_c, h) = driver(p1).await;
    let h2 = h.clone();
    eventually("both nodes host shards", Duration::from_secs(60), move || {
        let o = owners(&h2);
        o.iter().all(|n| !n.is_empty()) && o.iter().any(|n| n == "n1") && o.iter().any(|n| n == "n2")
    })
    .await;
    for i in 0..50 {
        h.entity_ref(format!("acct-{i}")).ask(AccountCmd::Deposit { op: i, amount: 1 }).await.unwrap();
    }
    n2.0.kill().unwrap();
    let _ = n2.0.wait();
    let killed = Instant::now();
    let h3 = h.clone();
    eventually("every shard on n1", Duration::from_secs(60), move || owners(&h3).iter().all(|n| n == "n1")).await;
    for i in 0..50 {
        h.entity_ref(format!("acct-{i}")).ask_timeout(AccountCmd::Balance, Duration::from_secs(10)).await.unwrap();
    }
    // Down after 5 s of silence: the shards came back well within the generous deadline.
    assert!(killed.elapsed() < Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_shards_off_without_losing_state() {
    let (p1, p2) = (free_port(), free_port());
    let _n1 = spawn("n1", p1, p1);
    let mut n2 = spawn("n2", p2, p1);
    let (_c, h) = driver(p1).await;
    let h2 = h.clone();
    eventually("both nodes host shards", Duration::from_secs(60), move || {
        let o = owners(&h2);
        o.iter().all(|n| !n.is_empty()) && o.iter().any(|n| n == "n2")
    })
    .await;
    for i in 0..100 {
        h.entity_ref(format!("acct-{i}")).ask(AccountCmd::Deposit { op: i, amount: 10 }).await.unwrap();
    }
    // SIGTERM: the node leaves gracefully. libc::kill has no memory-safety preconditions.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(n2.0.id() as libc::pid_t, libc::SIGTERM);
    }
    // Keep depositing while n2 leaves.
    for i in 0..100 {
        h.entity_ref(format!("acct-{i}")).ask(AccountCmd::Deposit { op: 1000 + i, amount: 1 }).await.unwrap();
    }
    let status = n2.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "graceful leave exits 0");
    for i in 0..100 {
        let r = h.entity_ref(format!("acct-{i}")).ask(AccountCmd::Audit).await.unwrap();
        assert_eq!(r.balance, 11, "acct-{i}");
        assert_eq!(r.ops, vec![i, 1000 + i]);
    }
    assert!(owners(&h).iter().all(|n| n == "n1"));
}
