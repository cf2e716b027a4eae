//! Failure tests on real coordination stores, with real `shardline node` processes.
//! Needs: etcd (Debian `etcd-server`) and nats-server with JetStream (Debian `nats-server`);
//! each test starts its own server on free loopback ports. A missing binary fails the test. The
//! SQLite tests keep their leases in a file of their own; the PostgreSQL ones (the `postgres`
//! feature) in the server at `SHARDLINE_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`), in the schema of the nodes' cluster, which they
//! drop first; a server that cannot be reached fails them.
//!
//! Every node appends `time node type shard epoch start|stop` to one ownership log; after each
//! test a checker proves no two nodes ever hosted the same shard at overlapping times (a killed
//! node's shards count as hosted until the moment it was killed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardline::membership::lease::server::ServerProcess;
use shardline::membership::lease::ShardMaps;
use shardline::{Cluster, StrategyKind};
use shardline_cli::membership::{provider, store, MembershipSpec};
use shardline_cli::{register_accounts, AccountCmd, Accounts};

mod ownership;
use ownership::{check_ownership, now_ms, ownership_events};

const SHARDS: u32 = 32;

/// These tests stop and restart servers and nodes on ports chosen as free at the time: run
/// concurrently, one test could take a port another test's stopped server must come back on.
/// So they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// Lease TTL of the nodes (the CLI default).
const TTL: Duration = Duration::from_secs(5);

fn free_port() -> u16 {
    shardline::ports::free_port().unwrap()
}

struct Node {
    name: String,
    port: u16,
    child: Option<Child>,
}

impl Node {
    fn spawn(name: &str, membership: &str, log: &Path) -> Node {
        let port = free_port();
        let mut n = Node { name: name.into(), port, child: None };
        n.start(membership, log);
        n
    }

    fn start(&mut self, membership: &str, log: &Path) {
        let child = Command::new(env!("CARGO_BIN_EXE_shardline"))
            .args(["node", "--name", &self.name, "--bind", &format!("127.0.0.1:{}", self.port)])
            .args(["--membership", membership, "--shards", &SHARDS.to_string()])
            .args(["--ownership-log", &log.display().to_string()])
            // The nodes of one test share one journal, next to their ownership log.
            .args(["--store", &format!("sqlite://{}", log.with_extension("journal.db").display())])
            .env("RUST_LOG", std::env::var("SHARDLINE_TEST_NODE_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("the shardline binary starts");
        self.child = Some(child);
    }

    /// Sends a signal (`STOP`, `CONT`) to the process.
    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill").args([&format!("-{sig}"), &pid]).status().expect("kill runs").success();
        assert!(ok, "kill -{sig} {pid} failed");
    }

    /// kill -9; returns when it happened.
    fn kill(&mut self) -> u128 {
        let at = now_ms();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        at
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn temp_log(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("shardline-ownership-{what}-{}-{}.log", std::process::id(), now_ms()))
}

async fn driver(spec: &MembershipSpec) -> (Cluster, Accounts) {
    let _ = tracing_subscriber::fmt().with_env_filter("warn").with_test_writer().try_init();
    let p = provider(spec, "shardline-demo", &[]).await.expect("store reachable");
    let c = Cluster::builder()
        .cluster_name("shardline-demo")
        .node_name("test-driver")
        .proxy()
        .membership_boxed(p)
        .build()
        .await
        .unwrap();
    let h = register_accounts(&c, SHARDS, &StrategyKind::LeastShards, None).await.unwrap();
    (c, h)
}

async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

fn owners(h: &Accounts) -> Vec<String> {
    h.entity_handle().shard_homes().iter().map(|o| o.as_ref().map(|n| n.name.to_string()).unwrap_or_default()).collect()
}

/// Asks one entity per shard until all answer; returns how long it took.
async fn every_shard_answers(h: &Accounts, limit: Duration) -> Duration {
    let start = Instant::now();
    let mut ids = vec![String::new(); SHARDS as usize];
    let mut k = 0;
    while ids.iter().any(String::is_empty) {
        let id = format!("probe-{k}");
        let s = shardline_core::shard_of(&id, SHARDS).0 as usize;
        if ids[s].is_empty() {
            ids[s] = id;
        }
        k += 1;
    }
    loop {
        let mut failed = Vec::new();
        for (shard, id) in ids.iter().enumerate() {
            if let Err(e) = h.ask_timeout(id, AccountCmd::Balance, Duration::from_millis(300)).await {
                failed.push((shard, e));
            }
        }
        if failed.is_empty() {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "some shards never answered again: {:?}", &failed[..failed.len().min(4)]);
    }
}

/// Waits until every shard is owned by a node still running (a killed node's `child` is gone);
/// then every running node must host some: a failover leaves none of the living out.
async fn every_shard_on_the_living(h: &Accounts, nodes: &[Node]) {
    let living: Vec<String> = nodes.iter().filter(|n| n.child.is_some()).map(|n| n.name.clone()).collect();
    let h2 = h.clone();
    let l2 = living.clone();
    eventually("every shard on a living node", Duration::from_secs(30), move || {
        owners(&h2).iter().all(|o| l2.contains(o))
    })
    .await;
    let o = owners(h);
    for n in &living {
        assert!(o.contains(n), "{n} is alive and hosts nothing: {o:?}");
    }
}

/// Waits until the stored map of the account type was written by the coordinator of `term`.
async fn stored_map_of(maps: &ShardMaps, term: u64) {
    let start = Instant::now();
    loop {
        let m = maps.load("account").await.expect("the map is readable");
        if m.as_ref().is_some_and(|m| m.term == term && m.map.unallocated().count() == 0) {
            return;
        }
        let got = m.map(|m| m.term);
        assert!(start.elapsed() < Duration::from_secs(30), "no map of term {term} stored (found term {got:?})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where the leases live.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Etcd,
    Nats,
    /// A file of the test's own, next to its ownership log.
    Sqlite,
    /// The machine's PostgreSQL server.
    #[cfg(feature = "postgres")]
    Postgres,
}

/// A running store: a server of the test's own, a file, or a schema of the machine's server.
struct Witness {
    server: Option<ServerProcess>,
    spec: MembershipSpec,
}

fn postgres_url() -> String {
    std::env::var("SHARDLINE_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

async fn start_witness(kind: Kind, log: &Path) -> Witness {
    let server = match kind {
        Kind::Etcd => Some(ServerProcess::etcd().expect("etcd starts")),
        Kind::Nats => Some(ServerProcess::nats().expect("nats-server starts")),
        _ => None,
    };
    let spec = match (kind, &server) {
        (Kind::Etcd, Some(s)) => MembershipSpec::Etcd(s.addr.clone()),
        (Kind::Nats, Some(s)) => MembershipSpec::Nats(format!("nats://{}", s.addr)),
        (Kind::Sqlite, _) => MembershipSpec::Sqlite(log.with_extension("members.db").display().to_string()),
        #[cfg(feature = "postgres")]
        (Kind::Postgres, _) => {
            // The nodes' cluster's schema, left over from an earlier run: gone first.
            let config = shardline_postgres::PostgresConfig::new(postgres_url()).schema("shardline_demo");
            if let Err(e) = shardline_postgres::drop_schema(&config).await {
                assert!(e.to_string().contains("does not exist"), "PostgreSQL at {}: {e}", postgres_url());
            }
            MembershipSpec::Postgres(postgres_url())
        }
        _ => unreachable!("a server for every server kind"),
    };
    Witness { server, spec }
}

/// Nodes n1, n2 and n3 on `server`, every one hosting shards and every shard answering, and a
/// driver that knows the leader.
async fn three_serving(witness: &Witness, log: &Path) -> (Vec<Node>, Cluster, Accounts) {
    let (spec, url) = (witness.spec.clone(), witness.spec.to_string());
    let nodes: Vec<Node> = ["n1", "n2", "n3"].iter().map(|n| Node::spawn(n, &url, log)).collect();
    let (driver, h) = driver(&spec).await;
    let h2 = h.clone();
    eventually("three nodes host shards", Duration::from_secs(60), move || {
        let o = owners(&h2);
        ["n1", "n2", "n3"].iter().all(|n| o.iter().any(|x| x == n))
    })
    .await;
    every_shard_answers(&h, Duration::from_secs(30)).await;
    let d = driver.clone();
    eventually("the driver knows the leader", Duration::from_secs(30), move || d.view().leader.is_some()).await;
    (nodes, driver, h)
}

async fn kill_member_then_leader(kind: Kind) {
    let _one = ONE_AT_A_TIME.lock().await;
    let log = temp_log("kill");
    let witness = start_witness(kind, &log).await;
    let spec = witness.spec.clone();
    let (mut nodes, driver, h) = three_serving(&witness, &log).await;
    let mut killed = Vec::new();
    // A member (not the leader) dies.
    let (leader, term) = driver.view().leader.expect("a leader");
    let store = store(&spec, "shardline-demo").await.expect("store reachable").expect("a lease store");
    let maps = ShardMaps::new(store, "shardline-demo");
    stored_map_of(&maps, term).await;
    let victim = nodes.iter().position(|n| *n.name != *leader.name).unwrap();
    killed.push((nodes[victim].name.clone(), nodes[victim].kill()));
    let took = every_shard_answers(&h, Duration::from_secs(60)).await;
    every_shard_on_the_living(&h, &nodes).await;
    // Measured, not asserted: timings are the benchmarks' business.
    println!("member failover: every shard answered {took:?} after the kill (lease TTL {TTL:?})");
    // The leader dies: a new one with a larger term takes over.
    let victim = nodes.iter().position(|n| *n.name == *leader.name).unwrap();
    killed.push((nodes[victim].name.clone(), nodes[victim].kill()));
    let d2 = driver.clone();
    eventually("a new leader with a larger term", Duration::from_secs(60), move || {
        d2.view().leader.is_some_and(|(l, t)| *l.name != *leader.name && t > term)
    })
    .await;
    every_shard_answers(&h, Duration::from_secs(60)).await;
    every_shard_on_the_living(&h, &nodes).await;
    // The new leader resumed from the stored map and stores its own, under its term.
    let (_, new_term) = driver.view().leader.expect("a leader");
    stored_map_of(&maps, new_term).await;
    drop(nodes);
    check_ownership(&log, &killed);
}

async fn store_outage_fences_everyone(kind: Kind) {
    let _one = ONE_AT_A_TIME.lock().await;
    let log = temp_log("outage");
    let witness = start_witness(kind, &log).await;
    let (spec, url) = (witness.spec.clone(), witness.spec.to_string());
    let mut server = witness.server.expect("a server the test can stop");
    let nodes: Vec<Node> = ["n1", "n2"].iter().map(|n| Node::spawn(n, &url, &log)).collect();
    let (_driver, h) = driver(&spec).await;
    let h2 = h.clone();
    eventually("two nodes host shards", Duration::from_secs(60), move || {
        let o = owners(&h2);
        ["n1", "n2"].iter().all(|n| o.iter().any(|x| x == n))
    })
    .await;
    let stopped_at = now_ms();
    server.stop();
    // Longer than the TTL: every node's lease lapses while the store is away.
    tokio::time::sleep(TTL + Duration::from_secs(2)).await;
    // Without the store, every node stops every shard it hosts, before the store comes back.
    let still_hosting = |log: &Path| {
        let mut hosting: HashMap<(String, (String, String)), bool> = HashMap::new();
        for (_, node, shard, start) in ownership_events(log) {
            hosting.insert((node, shard), start);
        }
        hosting.into_iter().filter(|(_, h)| *h).map(|(k, _)| k).collect::<Vec<_>>()
    };
    let log2 = log.clone();
    eventually("every node stops its shards without the store", Duration::from_secs(60), move || {
        still_hosting(&log2).is_empty()
    })
    .await;
    // Measured, not asserted.
    let last_stop = ownership_events(&log).iter().filter(|e| !e.3).map(|e| e.0).max().unwrap_or(stopped_at);
    println!(
        "store outage: the last shard stopped {} ms after the store went away (lease TTL {TTL:?})",
        last_stop.saturating_sub(stopped_at)
    );
    // The store returns: the cluster recovers by itself. This test's driver held a lease too
    // and fenced itself like every node: a client rejoins as a new incarnation.
    server.resume().unwrap();
    let (_driver2, h) = driver(&spec).await;
    every_shard_answers(&h, Duration::from_secs(90)).await;
    drop(nodes);
    check_ownership(&log, &[]);
}

/// The leader is paused (SIGSTOP) for longer than its lease: cut off from the store and from
/// everyone. The others take over its shards; when it wakes up it processes nothing, fences
/// itself and rejoins as a new incarnation, and it never overlaps the new owners.
async fn paused_leader_fences_and_rejoins(kind: Kind) {
    let _one = ONE_AT_A_TIME.lock().await;
    let log = temp_log("pause");
    let witness = start_witness(kind, &log).await;
    let (nodes, driver, h) = three_serving(&witness, &log).await;
    let (leader, term) = driver.view().leader.expect("a leader");
    let victim = nodes.iter().find(|n| *n.name == *leader.name).expect("the leader is a node");
    let paused_at = Instant::now();
    victim.signal("STOP");
    let d = driver.clone();
    eventually("a new leader", Duration::from_secs(60), move || d.view().leader.is_some_and(|(_, t)| t > term)).await;
    every_shard_answers(&h, Duration::from_secs(60)).await;
    let h3 = h.clone();
    let name = leader.name.to_string();
    eventually("no shard on the paused node", Duration::from_secs(30), move || owners(&h3).iter().all(|o| *o != name))
        .await;
    tokio::time::sleep((TTL + Duration::from_secs(2)).saturating_sub(paused_at.elapsed())).await;
    victim.signal("CONT");
    // It comes back as a new incarnation and is given shards again.
    let d = driver.clone();
    let old = leader.clone();
    eventually("the paused node rejoins as a new incarnation", Duration::from_secs(60), move || {
        d.view()
            .view
            .members()
            .any(|m| m.node.name == old.name && m.node != old && m.status == shardline_core::MemberStatus::Up)
    })
    .await;
    let h4 = h.clone();
    let name = leader.name.to_string();
    eventually("the new incarnation hosts shards", Duration::from_secs(60), move || owners(&h4).contains(&name)).await;
    every_shard_answers(&h, Duration::from_secs(60)).await;
    drop(nodes);
    check_ownership(&log, &[]);
}

/// Every node restarted one by one under load with a new application version, by the demo's
/// rolling-restart scenario: its ledger proves no acknowledged operation was lost or applied
/// twice, and once a new-version node serves, no old-version node is given a shard.
async fn rolling_restart_under_load(kind: Kind) {
    let _one = ONE_AT_A_TIME.lock().await;
    let witness = start_witness(kind, &temp_log("rolling")).await;
    let url = witness.spec.to_string();
    let json = std::env::temp_dir().join(format!("shardline-rolling-{}-{}.json", std::process::id(), now_ms()));
    let out = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args(["demo", "--scenario", "rolling-restart", "--strategy", "version-aware", "--membership", &url])
        .args(["--shards", &SHARDS.to_string(), "--entities", "2000", "--duration-secs", "2"])
        .args(["--json", &json.display().to_string()])
        .stdin(Stdio::null())
        .output()
        .expect("the demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo failed ({:?}):\n{stdout}", out.status);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report written")).expect("report is JSON");
    let inv = &report["invariants"];
    for k in ["lost_acked", "double_applied", "ledger_mismatches"] {
        assert_eq!(inv[k].as_u64(), Some(0), "{k} in {inv}");
    }
    let phases = report["phases"].as_array().expect("phases");
    let names: Vec<&str> = phases.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, ["steady", "restart-n1", "restart-n2", "restart-n3"]);
    for p in phases {
        assert_eq!(p["ledger_checked"].as_bool(), Some(true), "{p}");
        // Every phase's moved shards were seen serving again: a monitor that ran out of time
        // says so (`rehomed` false, `rehome_error`), and is never taken for "nothing moved".
        assert_eq!(p["rehomed"].as_bool(), Some(true), "{p}");
        assert!(p.get("rehome_error").is_none(), "{p}");
        assert!(p["rehome_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{p}");
        assert_ne!(p["old_version_gained"].as_bool(), Some(true), "an old-version node got a shard: {p}");
    }
    // After the second restart the first two nodes run the new version and hold every shard
    // the old ones gave up; after the last, all of them.
    assert!(phases[2]["new_version_shards"].as_u64().unwrap_or(0) > 0, "{}", phases[2]);
    assert_eq!(phases[3]["new_version_shards"].as_u64(), Some(u64::from(SHARDS)), "{}", phases[3]);
    let _ = std::fs::remove_file(&json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rolling_restart_under_load() {
    rolling_restart_under_load(Kind::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_rolling_restart_under_load() {
    rolling_restart_under_load(Kind::Nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_paused_leader_fences_and_rejoins() {
    paused_leader_fences_and_rejoins(Kind::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_paused_leader_fences_and_rejoins() {
    paused_leader_fences_and_rejoins(Kind::Nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_paused_leader_fences_and_rejoins() {
    paused_leader_fences_and_rejoins(Kind::Sqlite).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_paused_leader_fences_and_rejoins() {
    paused_leader_fences_and_rejoins(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_kill_member_then_leader() {
    kill_member_then_leader(Kind::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_kill_member_then_leader() {
    kill_member_then_leader(Kind::Nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_kill_member_then_leader() {
    kill_member_then_leader(Kind::Sqlite).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill_member_then_leader() {
    kill_member_then_leader(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_store_outage_fences_everyone() {
    store_outage_fences_everyone(Kind::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_store_outage_fences_everyone() {
    store_outage_fences_everyone(Kind::Nats).await;
}
