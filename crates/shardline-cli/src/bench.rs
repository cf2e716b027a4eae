//! `shardline bench`: each scenario measures the runtime and, in the same run, the physical
//! baseline it is compared with, so the ratio holds on a noisy machine. Prints JSON.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use shardline::entity::Persist;
use shardline::{Cluster, EntityHandle, EntityRef, EntitySettings, StrategyKind};
use shardline_cli::membership::MembershipSpec;

use crate::args::BenchArgs;
use crate::false_downs::FalseDowns;
use crate::floors::{LocalFloor, Multiplexed, PingPong, PAYLOAD};
use crate::load::{probe_ids, shards_per_node, HomeMonitor};
use crate::paired::{drive, Paired, SLICE};
use crate::procs::{free_port, journal_flags, work_dir, NodeProc, RunCerts};
use crate::standalone;
use shardline_cli::{register_accounts, AccountCmd, Accounts, Echo};

/// Runs a scenario; returns the exit code.
pub async fn run(args: BenchArgs) -> i32 {
    let result = match args.scenario.as_str() {
        s if args.tls && s != "remote-ask" => Err(format!("--tls measures remote asks only, not {s}").into()),
        "local-ask" => local_ask(&args).await,
        "remote-ask" => remote_ask(&args).await,
        "idle-memory" => idle_memory(&args).await,
        "rebalance" => rebalance(&args).await,
        "failover" => failover(&args).await,
        "journal" => crate::journal_bench::journal(&args).await,
        "durable-ask" => crate::durable_bench::durable_ask(&args).await,
        "remember" => crate::remember_bench::remember(&args).await,
        "passivation" => crate::passivation_bench::passivation(&args).await,
        "reminders" => crate::reminders_bench::reminders(&args).await,
        other => Err(format!("unknown scenario {other}").into()),
    };
    match result {
        Ok(v) => {
            let text = serde_json::to_string_pretty(&v).unwrap_or_default();
            println!("{text}");
            if let Some(path) = &args.json {
                if let Err(e) = std::fs::write(path, &text) {
                    eprintln!("cannot write {path}: {e}");
                    return 1;
                }
            }
            0
        }
        Err(e) => {
            eprintln!("bench {} failed: {e}", args.scenario);
            1
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// References to `n` echo entities, each asked once so that they exist.
async fn started_echoes(echo: &EntityHandle<Echo>, n: u64) -> Result<Arc<Vec<EntityRef<Echo>>>, BoxError> {
    let refs: Vec<EntityRef<Echo>> = (0..n).map(|i| echo.entity_ref(format!("e{i}"))).collect();
    for r in &refs {
        r.ask(0).await?;
    }
    Ok(Arc::new(refs))
}

/// One caller's ask of a random echo entity.
async fn ask_echo(refs: Arc<Vec<EntityRef<Echo>>>, _: u64, rng: u64) -> (Arc<Vec<EntityRef<Echo>>>, bool) {
    let ok = refs[(rng % refs.len() as u64) as usize].ask(rng).await.is_ok();
    (refs, ok)
}

async fn local_ask(args: &BenchArgs) -> Result<serde_json::Value, BoxError> {
    let n = args.entities.unwrap_or(1_000).max(1);
    let d = Duration::from_secs(args.duration_secs);
    let cluster = Cluster::builder().cluster_name("bench-local").build().await?;
    let echo: EntityHandle<Echo> = cluster.register::<Echo>(EntitySettings::new("echo").shards(1024)).await?;
    let refs = started_echoes(&echo, n).await?;
    let floor = LocalFloor::start(n);
    let paired = Paired::run(
        args.concurrency,
        d,
        (refs, ask_echo),
        (floor.clone(), |floor: Arc<LocalFloor>, _, rng| async move {
            let ok = floor.call(rng).await;
            (floor, ok)
        }),
    );
    let (p, alone) = standalone::around("local", None, args.concurrency, n, standalone_slice(d), paired).await?;
    Ok(json!({
        "scenario": "local-ask",
        "concurrency": args.concurrency,
        "entities": n,
        "ops_per_s": p.ops,
        "latency_us": p.lat,
        "baseline": "tokio mpsc + oneshot round trip, one task per entity",
        "baseline_ops_per_s": p.floor_ops,
        "baseline_latency_us": p.floor_lat,
        "ratio": p.ratio,
        "slice_ms": SLICE.as_millis() as u64,
        "slice_ratios": p.ratios,
        "standalone_baseline_ops_per_s": alone,
        "standalone_ratio": p.ops / alone.max(1.0),
        "in_process_over_standalone_baseline": p.floor_ops / alone.max(1.0),
    }))
}

/// How long a standalone floor runs on each side of a paired run of `d`.
fn standalone_slice(d: Duration) -> Duration {
    (d / 2).max(Duration::from_secs(1))
}

/// Starts `count` node processes (with `extra` flags) and a proxy driver joined to them; waits
/// until every shard has a home.
pub(crate) async fn cluster_of(
    count: usize,
    shards: u32,
    what: &str,
    membership: &MembershipSpec,
    tls: bool,
    extra: &[&str],
) -> Result<(Vec<NodeProc>, Vec<String>, Cluster, std::path::PathBuf), BoxError> {
    let dir = work_dir(what)?;
    let mut addrs = Vec::new();
    for _ in 0..count + 1 {
        addrs.push(format!("127.0.0.1:{}", free_port()?));
    }
    let seed = addrs[0].clone();
    let names: Vec<String> = (1..=count).map(|i| format!("n{i}")).chain(["driver".to_string()]).collect();
    let certs = if tls { Some(RunCerts::make(&dir, &names)?) } else { None };
    let mut nodes = Vec::new();
    for (i, addr) in addrs.iter().take(count).enumerate() {
        let mut flags = journal_flags(&dir);
        flags.extend(extra.iter().map(|f| f.to_string()));
        flags.extend(certs.as_ref().map(|c| c.flags(&names[i])).unwrap_or_default());
        nodes.push(NodeProc::spawn(&names[i], addr, &seed, shards, &membership.to_string(), &dir, &flags)?);
        if i == 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let provider = shardline_cli::membership::provider(membership, "shardline-demo", &[seed]).await?;
    let mut driver =
        Cluster::builder().cluster_name("shardline-demo").node_name("driver").proxy().membership_boxed(provider);
    if let Some(c) = &certs {
        driver = driver.tls(c.config("driver")?);
    }
    let driver = driver.build().await?;
    Ok((nodes, addrs, driver, dir))
}

pub(crate) async fn settle<T: shardline::Entity>(
    h: &EntityHandle<T>,
    hosts: usize,
    limit: Duration,
) -> Result<(), BoxError> {
    let start = Instant::now();
    loop {
        let per = shards_per_node(&h.shard_homes());
        let all = h.shard_homes().iter().all(Option::is_some);
        if all && per.len() == hosts && per.values().max().unwrap_or(&0) - per.values().min().unwrap_or(&0) <= 1 {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(format!("cluster did not settle: {per:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn remote_ask(args: &BenchArgs) -> Result<serde_json::Value, BoxError> {
    let n = args.entities.unwrap_or(1_000).max(1);
    let d = Duration::from_secs(args.duration_secs);
    let shards = 1024;
    let (_nodes, _addrs, driver, _dir) = cluster_of(1, shards, "bench-remote", &args.membership, args.tls, &[]).await?;
    let echo: EntityHandle<Echo> = driver.register::<Echo>(EntitySettings::new("echo").shards(shards)).await?;
    settle(&echo, 1, Duration::from_secs(60)).await?;
    let refs = started_echoes(&echo, n).await?;
    // Floors: a bare TCP echo server in another process, its callers multiplexed over one
    // connection (the strongest floor: what the runtime does, bare), and one connection per
    // caller in ping-pong (a second figure); a single caller in ping-pong for one ask's latency.
    let port = free_port()?;
    let exe = std::env::current_exe()?;
    let mut server = std::process::Command::new(exe)
        .args(["echo-server", "--bind", &format!("127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let addr = format!("127.0.0.1:{port}");
    let measured = async {
        let mux = Arc::new(Multiplexed::connect(&addr).await?);
        let paired = Paired::run(
            args.concurrency,
            d,
            (refs.clone(), ask_echo),
            (mux, |mux: Arc<Multiplexed>, _, _| async move {
                let ok = mux.call().await;
                (mux, ok)
            }),
        );
        let (many, alone) =
            standalone::around("remote", Some(&addr), args.concurrency, n, standalone_slice(d), paired).await?;
        let pp = Arc::new(PingPong::connect(&addr, args.concurrency).await?);
        let pingpong = |pp: Arc<PingPong>, w, _| async move {
            let ok = pp.call(w).await;
            (pp, ok)
        };
        let (pp_ops, pp_lat) = drive(args.concurrency, d, pp.clone(), pingpong).await;
        let single = Paired::run(1, Duration::from_secs(2), (refs, ask_echo), (pp, pingpong)).await;
        Ok::<_, BoxError>((many, alone, pp_ops, pp_lat, single))
    }
    .await;
    let _ = server.kill();
    let _ = server.wait();
    let (many, alone, pp_ops, pp_lat, single) = measured?;
    Ok(json!({
        "scenario": "remote-ask",
        "tls": args.tls,
        "concurrency": args.concurrency,
        "entities": n,
        "ops_per_s": many.ops,
        "latency_us": many.lat,
        "single_ask_p50_us": single.lat.p50,
        "single_ask_latency_us": single.lat,
        "baseline": format!(
            "bare loopback TCP echo, {} callers multiplexed by request id over one connection, batched writes, \
             {PAYLOAD}-byte payload",
            args.concurrency
        ),
        "baseline_ops_per_s": many.floor_ops,
        "baseline_latency_us": many.floor_lat,
        "ratio": many.ratio,
        "slice_ms": SLICE.as_millis() as u64,
        "slice_ratios": many.ratios,
        "p99_ratio": many.lat.p99 / many.floor_lat.p99.max(1.0),
        "standalone_baseline_ops_per_s": alone,
        "standalone_ratio": many.ops / alone.max(1.0),
        "in_process_over_standalone_baseline": many.floor_ops / alone.max(1.0),
        "pingpong_baseline": "bare loopback TCP echo, one connection per caller in ping-pong",
        "pingpong_ops_per_s": pp_ops,
        "pingpong_latency_us": pp_lat,
        "pingpong_ratio": many.ops / pp_ops.max(1.0),
        "baseline_single_p50_us": single.floor_lat.p50,
        "single_ratio": single.lat.p50 / single.floor_lat.p50.max(1.0),
    }))
}

/// The process's resident set, from `/proc/self/statm`; one that cannot be read is an error, not a
/// zero that would read as no memory at all.
pub(crate) fn rss_bytes() -> Result<u64, BoxError> {
    let statm = std::fs::read_to_string("/proc/self/statm").map_err(|e| format!("/proc/self/statm: {e}"))?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("/proc/self/statm has no resident page count: {statm:?}"))?;
    Ok(pages * 4096)
}

async fn idle_memory(args: &BenchArgs) -> Result<serde_json::Value, BoxError> {
    let n = args.entities.unwrap_or(1_000_000).max(1);
    let cluster = Cluster::builder().cluster_name("bench-memory").build().await?;
    let echo: EntityHandle<Echo> =
        cluster.register::<Echo>(EntitySettings::new("echo").shards(1024).mailbox(4)).await?;
    // Warm the runtime so its own allocations are not counted.
    for i in 0..1_000 {
        echo.entity_ref(format!("warm-{i}")).ask(0).await?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    shardline_cli::heap::start();
    let heap_before = shardline_cli::heap::live();
    let before = rss_bytes()?;
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..256 {
        let (echo, next) = (echo.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), shardline::Error>(());
                }
                echo.entity_ref(format!("e{i}")).ask(i).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    // Let every entity go idle (their tasks end after a short linger).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let settled = Instant::now();
    while echo.active_entities() > 0 && settled.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let in_memory = echo.local_entities() as u64;
    let active = echo.active_entities() as u64;
    let after = rss_bytes()?;
    let heap_after = shardline_cli::heap::live();
    Ok(json!({
        "scenario": "idle-memory",
        "heap_bytes_per_entity": (heap_after - heap_before) as f64 / n as f64,
        "heap_peak_bytes": shardline_cli::heap::peak(),
        "entities": n,
        "entities_in_memory": in_memory,
        "entities_with_a_task": active,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "rss_bytes_per_entity": (after.saturating_sub(before)) as f64 / n as f64,
    }))
}

async fn rebalance(args: &BenchArgs) -> Result<serde_json::Value, BoxError> {
    let n = args.entities.unwrap_or(100_000).max(1);
    let shards = 1024;
    let (mut nodes, addrs, driver, dir) =
        cluster_of(3, shards, "bench-rebalance", &args.membership, false, &[]).await?;
    let accounts: Accounts = register_accounts(&driver, shards, &StrategyKind::LeastShards, None).await?;
    settle(accounts.entity_handle(), 3, Duration::from_secs(60)).await?;
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..128 {
        let (accounts, next) = (accounts.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), shardline::Error>(());
                }
                accounts.ask(format!("acct-{i}"), AccountCmd::Deposit { op: i, amount: 1 }).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let probes = Arc::new(probe_ids(shards));
    let event = Instant::now();
    let monitor = HomeMonitor::start(&accounts, probes, event);
    let flags = journal_flags(&dir);
    nodes.push(NodeProc::spawn("n4", &addrs[3], &addrs[0], shards, &args.membership.to_string(), &dir, &flags)?);
    settle(accounts.entity_handle(), 4, Duration::from_secs(60)).await?;
    let rehomed = monitor.finish(Duration::from_secs(60)).await?;
    let (moved, served) = (rehomed.moved, rehomed.served_after.ok_or("no shard moved to the new node")?);
    // Spot-check that the state moved with the shards.
    let mut lost = 0;
    for i in (0..n).step_by((n / 1000).max(1) as usize) {
        let r = accounts.ask(format!("acct-{i}"), AccountCmd::Balance).await?;
        if r.balance != 1 {
            lost += 1;
        }
    }
    Ok(json!({
        "scenario": "rebalance",
        "entities": n,
        "nodes_before": 3,
        "nodes_after": 4,
        "shards": shards,
        "shards_moved": moved,
        "rehome_ms": served.as_secs_f64() * 1000.0,
        "spot_checked_balances_wrong": lost,
    }))
}

/// Waits until a probe in every shard answers; returns when.
async fn all_shards_answer(
    accounts: &Accounts,
    probes: &Arc<Vec<String>>,
    limit: Duration,
) -> Result<Instant, BoxError> {
    let start = Instant::now();
    loop {
        let mut asks = Vec::new();
        for p in probes.iter() {
            let (accounts, p) = (accounts.clone(), p.clone());
            asks.push(tokio::spawn(async move {
                accounts.ask_timeout(p, AccountCmd::Balance, Duration::from_millis(200)).await.is_ok()
            }));
        }
        let mut ok = true;
        for a in asks {
            ok &= a.await.unwrap_or(false);
        }
        if ok {
            return Ok(Instant::now());
        }
        if start.elapsed() > limit {
            return Err("some shards never answered again".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn failover(args: &BenchArgs) -> Result<serde_json::Value, BoxError> {
    let shards = 256;
    let (mut nodes, addrs, driver, dir) = cluster_of(3, shards, "bench-failover", &args.membership, false, &[]).await?;
    let accounts: Accounts = register_accounts(&driver, shards, &StrategyKind::LeastShards, None).await?;
    settle(accounts.entity_handle(), 3, Duration::from_secs(60)).await?;
    // Load in the background for the whole scenario.
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for w in 0..16u64 {
        let (accounts, stop) = (accounts.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut i = w;
            while !stop.load(Ordering::Relaxed) {
                i = i.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                let _ = accounts
                    .ask_persist(
                        format!("acct-{}", i % 10_000),
                        Persist { request_id: None, command: AccountCmd::Deposit { op: i, amount: 1 } },
                        Duration::from_secs(1),
                    )
                    .await;
            }
        }));
    }
    let probes = Arc::new(probe_ids(shards));
    // Every member that goes away without being killed is a false down: the price of a
    // detector fast enough to repair a crash in seconds.
    let watch = FalseDowns::watch(&driver);
    tokio::time::sleep(Duration::from_secs(args.steady_secs)).await;
    let mut runs = Vec::new();
    for run in 0..args.runs as usize {
        all_shards_answer(&accounts, &probes, Duration::from_secs(60)).await?;
        let leader = driver.view().leader.map(|(n, _)| n.name.to_string());
        // The leader dies in the first run; members after that, in turn.
        let victim = if run == 0 {
            leader.clone().and_then(|l| nodes.iter().position(|n| n.name == l)).unwrap_or(0)
        } else {
            let members: Vec<usize> = (0..nodes.len()).filter(|i| Some(&nodes[*i].name) != leader.as_ref()).collect();
            members[run % members.len().max(1)]
        };
        let name = nodes[victim].name.clone();
        let was_leader = leader.as_deref() == Some(name.as_str());
        watch.killing(&name);
        let event = Instant::now();
        nodes[victim].kill();
        let served = all_shards_answer(&accounts, &probes, Duration::from_secs(120)).await?;
        let ms = served.duration_since(event).as_secs_f64() * 1000.0;
        runs.push(json!({ "killed": name, "was_leader": was_leader, "failover_ms": ms }));
        // Bring it back as a new incarnation and let the cluster settle.
        let idx = name.trim_start_matches('n').parse::<usize>().unwrap_or(1).saturating_sub(1);
        let flags = journal_flags(&dir);
        // Every node as a seed, as a deployment would give them: the first seed, restarted with
        // only itself to try, would start a cluster of its own.
        let seeds = addrs[..nodes.len()].join(",");
        nodes[victim] =
            NodeProc::spawn(&name, &addrs[idx], &seeds, shards, &args.membership.to_string(), &dir, &flags)?;
        settle(accounts.entity_handle(), 3, Duration::from_secs(120)).await?;
    }
    let false_downs: Vec<String> = watch.finish().iter().map(ToString::to_string).collect();
    stop.store(true, Ordering::Relaxed);
    for l in load {
        let _ = l.await;
    }
    let mut ms: Vec<f64> = runs.iter().filter_map(|r| r["failover_ms"].as_f64()).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    let p50 = ms.get(ms.len() / 2).copied().unwrap_or(0.0);
    let max = ms.last().copied().unwrap_or(0.0);
    Ok(json!({
        "scenario": "failover",
        "membership": args.membership.to_string(),
        "runs": runs,
        "failover_ms_p50": p50,
        "failover_ms_max": max,
        "steady_secs": args.steady_secs,
        "false_downs": false_downs.len(),
        "falsely_downed": false_downs,
    }))
}
