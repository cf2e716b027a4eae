//! `shardline load`: the demo's ledger load against a cluster this process did not start.
//!
//! The driver joins as a proxy member (it routes, hosts nothing, never leads), writes to accounts
//! of its own range for a while, retrying unanswered operations with their request ids, then
//! audits every account it wrote: each acknowledged operation applied exactly once, nothing else
//! applied, balances equal to what was applied. Operators use it to check a cluster; the partition
//! tests use it as the load that must survive.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use shardline::{Cluster, StrategyKind};

use crate::args::LoadArgs;
use shardline_cli::history::HistoryWriter;

use crate::load::{percentiles, run_accounts, shards_per_node, AccountRange, Invariants, Latency, Ledger, Route};
use shardline_cli::membership::provider_with;
use shardline_cli::{register_accounts, Accounts};

/// What `shardline load --json` writes.
#[derive(Debug, Serialize)]
pub struct LoadReport {
    pub cluster: String,
    pub shards: u32,
    pub accounts: AccountRange,
    pub duration_s: f64,
    pub acked: u64,
    pub failed: u64,
    pub ops_per_s: f64,
    pub latency_us: Latency,
    pub errors: std::collections::BTreeMap<String, u64>,
    pub invariants: Invariants,
    /// Shards per hosting node as this driver saw them at the end.
    pub nodes: Vec<crate::demo::NodeReport>,
}

/// Runs the load; returns the exit code: 0 when every account is as the ledger says, 1 when the
/// audit found a broken promise or the cluster could not be joined.
pub async fn run(args: LoadArgs) -> i32 {
    match run_inner(args).await {
        Ok(report) => {
            let i = report.invariants;
            if i.lost_acked + i.double_applied + i.ledger_mismatches == 0 {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("load failed: {e}");
            1
        }
    }
}

/// A first account for this run: drivers that share a cluster write disjoint ranges.
fn drawn_first_account() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::process::id().hash(&mut h);
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()).hash(&mut h);
    // Ranges of up to 10^8 accounts (the flag's limit) start on multiples of 10^9.
    (h.finish() % 1_000_000) * 1_000_000_000
}

/// Joins the cluster as a proxy member and registers the accounts.
async fn join(args: &LoadArgs, name: &str) -> Result<(Cluster, Accounts), Box<dyn std::error::Error>> {
    // A proxy follows its side of a partition, so it resolves with the same settings.
    let (leases, gossip) = args.members.settings()?;
    let m = &args.members;
    let provider = provider_with(&m.spec(), &args.cluster, &m.seeds, leases, gossip).await?;
    let mut driver = Cluster::builder()
        .cluster_name(args.cluster.clone())
        .node_name(name.to_string())
        .bind(args.bind.clone())
        .proxy()
        .membership_boxed(provider);
    if let Some(tls) = args.tls.load()? {
        driver = driver.tls(tls);
    }
    let driver = driver.build().await?;
    // A proxy never runs a coordinator, so the strategy here is never used.
    let accounts = register_accounts(&driver, args.shards, &StrategyKind::LeastShards, None).await?;
    Ok((driver, accounts))
}

/// What `shardline node` does for a node, for the driver: once its membership fences it (it
/// lost a split-brain race, or its lease lapsed), it rejoins as a new incarnation after the old
/// lease's TTL, and its callers go on through the new one. Without it, a driver downed by a
/// race under packet loss failed every ask to the end of the run.
async fn rejoin_when_fenced(args: LoadArgs, name: String, driver: Arc<Mutex<Cluster>>, route: Route) {
    let ttl = args.members.settings().map_or(Duration::from_secs(3), |(leases, _)| leases.ttl);
    loop {
        let current = driver.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let reason = current.downed().await;
        eprintln!("load {name}: the driver was fenced ({reason}); rejoining as a new incarnation");
        current.crash();
        drop(current);
        tokio::time::sleep(ttl).await;
        loop {
            // The error is not `Send`: keep it out of the wait below.
            let failed = match join(&args, &name).await {
                Ok((d, accounts)) => {
                    *driver.lock().unwrap_or_else(|e| e.into_inner()) = d;
                    route.replace(accounts);
                    eprintln!("load {name}: rejoined");
                    break;
                }
                Err(e) => e.to_string(),
            };
            eprintln!("load {name}: cannot rejoin yet: {failed}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

async fn run_inner(args: LoadArgs) -> Result<LoadReport, Box<dyn std::error::Error>> {
    let range = AccountRange { first: args.first_account.unwrap_or_else(drawn_first_account), count: args.entities };
    let name = args.name.clone().unwrap_or_else(|| format!("load-{}", std::process::id()));
    let (driver, accounts) = join(&args, &name).await?;
    println!(
        "load {name}: accounts acct-{}…acct-{}, {} callers, {} s, cluster {} ({})",
        range.first,
        range.first + range.count - 1,
        args.concurrency,
        args.duration_secs,
        args.cluster,
        args.members.spec()
    );
    let join_limit = Duration::from_secs(args.join_timeout_secs);
    let start = Instant::now();
    while !accounts.entity_handle().shard_homes().iter().all(Option::is_some) {
        if start.elapsed() > join_limit {
            let _ = driver.leave_within(Duration::from_secs(5)).await;
            return Err(format!("not every shard had a home after {join_limit:?}: is the cluster up?").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let route = Route::new(accounts.clone());
    let driver = Arc::new(Mutex::new(driver));
    let rejoin = tokio::spawn(rejoin_when_fenced(args.clone(), name.clone(), driver.clone(), route.clone()));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let next_op = Arc::new(AtomicU64::new(1));
    let last = Mutex::new(Instant::now());
    let history = args.history.as_ref().map(HistoryWriter::create).transpose()?.map(Arc::new);
    let mut load = run_accounts(
        &route,
        range,
        args.concurrency,
        Duration::from_secs(args.duration_secs),
        &ledger,
        &next_op,
        history.as_ref(),
        |acked, failed, t| {
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            if last.elapsed() >= Duration::from_secs(1) {
                *last = Instant::now();
                let rate = acked as f64 / t.as_secs_f64().max(0.001);
                println!("  {rate:>8.0} ops/s  acked {acked}  failed {failed}  ({t:.0?})");
            }
        },
    )
    .await;
    println!("  auditing {} accounts", range.count);
    let snapshot = std::mem::take(&mut *ledger.lock().unwrap_or_else(|e| e.into_inner()));
    let invariants = snapshot.audit(&route, range, 64, history.as_ref()).await;
    if let Some(h) = &history {
        h.flush()?;
        println!("  history written to {} (check it with `shardline check`)", h.path().display());
    }
    rejoin.abort();
    let driver = driver.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let nodes = shards_per_node(&route.current().entity_handle().shard_homes())
        .into_iter()
        .map(|(name, shards)| crate::demo::NodeReport { name, shards })
        .collect();
    let report = LoadReport {
        cluster: args.cluster.clone(),
        shards: args.shards,
        accounts: range,
        duration_s: load.elapsed.as_secs_f64(),
        acked: load.acked,
        failed: load.failed,
        ops_per_s: load.acked as f64 / load.elapsed.as_secs_f64().max(0.001),
        latency_us: percentiles(&mut load.latencies),
        errors: std::mem::take(&mut load.errors),
        invariants,
        nodes,
    };
    println!(
        "load: {:.0} ops/s  p50 {:.0} µs  p99 {:.0} µs  acked {}  failed {}  errors {:?}",
        report.ops_per_s, report.latency_us.p50, report.latency_us.p99, report.acked, report.failed, report.errors
    );
    println!(
        "audit: lost acknowledged {}, applied twice {}, ledger mismatches {}",
        invariants.lost_acked, invariants.double_applied, invariants.ledger_mismatches
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?).map_err(|e| format!("{path}: {e}"))?;
    }
    if let Err(e) = driver.leave_within(Duration::from_secs(10)).await {
        eprintln!("the driver's leave did not finish: {e}");
    }
    Ok(report)
}
