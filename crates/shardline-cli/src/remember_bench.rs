//! `shardline bench --scenario remember`: three node processes that remember their accounts;
//! `--entities` accounts (100,000 by default), all in shards of one node, each written once;
//! that node killed with SIGKILL. The survivors take its shards over and restart its remembered
//! accounts (64 recovering at once per node) while every one of them is asked once; reports the
//! time from the kill until the last one answered (`restart_ms`), and how many asks timed out on
//! the way (`timeouts`: each is asked again until it answers).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use shardline::entity::Persist;
use shardline::{Error, StrategyKind};
use shardline_cli::{register_accounts, AccountCmd, Accounts};

use crate::args::BenchArgs;
use crate::bench::{cluster_of, settle};
use crate::load::percentiles;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SHARDS: u32 = 256;
/// How long one ask may take before it counts as timed out (and is asked again).
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
const CALLERS: usize = 64;

/// Asks every id once (again while it fails) with `CALLERS` callers; returns each answered ask's
/// latency (microseconds) and the failed asks, timed out and otherwise.
async fn ask_all(accounts: &Accounts, ids: Arc<Vec<String>>, cmd: fn(u64) -> AccountCmd) -> (Vec<u32>, u64, u64) {
    let next = Arc::new(AtomicUsize::new(0));
    let (timeouts, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(ids.len())));
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        let (accounts, ids, next) = (accounts.clone(), ids.clone(), next.clone());
        let (timeouts, failed, latencies) = (timeouts.clone(), failed.clone(), latencies.clone());
        callers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(i) else { break };
                loop {
                    let start = Instant::now();
                    match accounts
                        .ask_persist(id, Persist { request_id: None, command: cmd(i as u64) }, ASK_TIMEOUT)
                        .await
                    {
                        Ok(_) => {
                            mine.push(start.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                            break;
                        }
                        Err(Error::Timeout(_)) => timeouts.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            if let Ok(mut all) = latencies.lock() {
                all.extend(mine);
            }
        }));
    }
    for c in callers {
        let _ = c.await;
    }
    let latencies = latencies.lock().map(|mut l| std::mem::take(&mut *l)).unwrap_or_default();
    (latencies, timeouts.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
}

pub async fn remember(args: &BenchArgs) -> Result<serde_json::Value, BoxError> {
    let n = args.entities.unwrap_or(100_000).max(1) as usize;
    let remember = ["--remember-entities", "1000000"];
    let (mut nodes, _addrs, driver, _dir) =
        cluster_of(3, SHARDS, "bench-remember", &args.membership, false, &remember).await?;
    let accounts: Accounts = register_accounts(&driver, SHARDS, &StrategyKind::LeastShards, None).await?;
    settle(accounts.entity_handle(), 3, Duration::from_secs(60)).await?;
    // A node that does not lead: the coordinator's own failover is the failover bench's.
    let leader = driver.view().leader.map(|(l, _)| l.name.to_string());
    let victim = nodes.iter().position(|p| Some(&p.name) != leader.as_ref()).ok_or("no node but the leader")?;
    let name = nodes[victim].name.clone();
    let homes = accounts.entity_handle().shard_homes();
    let on_victim = |id: &String| {
        let shard = accounts.entity_handle().shard_of(id).0 as usize;
        homes.get(shard).and_then(Option::as_ref).is_some_and(|h| *h.name == *name)
    };
    let ids: Arc<Vec<String>> = Arc::new((0..).map(|i| format!("acct-{i}")).filter(on_victim).take(n).collect());
    let written = Instant::now();
    let (_, timeouts, failed) = ask_all(&accounts, ids.clone(), |op| AccountCmd::Deposit { op, amount: 1 }).await;
    if timeouts + failed > 0 {
        return Err(format!("{} of {n} first writes failed before the kill", timeouts + failed).into());
    }
    let write_s = written.elapsed().as_secs_f64();
    let killed = Instant::now();
    nodes[victim].kill();
    // Until every shard has a home again, none of them the killed node.
    loop {
        let homes = accounts.entity_handle().shard_homes();
        if homes.iter().all(|h| h.as_ref().is_some_and(|h| *h.name != *name)) {
            break;
        }
        if killed.elapsed() > Duration::from_secs(120) {
            return Err("the killed node's shards found no new home in 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rehome = killed.elapsed();
    let (mut latencies, timeouts, failed) = ask_all(&accounts, ids.clone(), |_| AccountCmd::Balance).await;
    let restart = killed.elapsed();
    let lat = percentiles(&mut latencies);
    Ok(json!({
        "scenario": "remember",
        "entities": n,
        "killed": name,
        "written_per_s": n as f64 / write_s,
        "rehome_ms": rehome.as_secs_f64() * 1000.0,
        "restart_ms": restart.as_secs_f64() * 1000.0,
        "timeouts": timeouts,
        "failed": failed,
        "ask_timeout_ms": ASK_TIMEOUT.as_millis() as u64,
        "p50_us": lat.p50,
        "p99_us": lat.p99,
        "remember_at_once": 64,
    }))
}
