//! `shardline bench --scenario passivation`: passivation by a budget under a scan. One node; a
//! hot set of 10,000 ids asked for all along, and between every two of its asks one id never
//! seen before, a million of them by default. The type keeps at most twice the hot set in memory
//! ([`EntitySettings::max_active`]).
//!
//! Reports the memory the scan leaves behind per id scanned (bounded: it would be the
//! `idle-memory` scenario's per-entity figure without a budget), and the hot set's hit rate: the
//! share of its asks that found their entity in memory, under frequency admission (W-TinyLFU)
//! and, in a second cluster of the same process, under least-recently-used.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use shardline::{Cluster, Entity, EntityContext, EntityHandle, EntityId, EntitySettings, PassivationPolicy};

use crate::args::BenchArgs;
use crate::bench::rss_bytes;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const HOT: u64 = 10_000;
const CALLERS: usize = 64;

/// Counts its asks: an answer of 1 for an id asked before means it had left memory and started
/// afresh (a miss).
#[derive(Debug, Default)]
struct Visits {
    n: u64,
}

impl Entity for Visits {
    type Message = ();
    type Reply = u64;

    fn new(_id: &EntityId) -> Self {
        Visits::default()
    }

    async fn handle(&mut self, _ctx: &mut EntityContext, _msg: ()) -> u64 {
        self.n += 1;
        self.n
    }
}

/// One run under `policy`.
struct Run {
    asks: u64,
    hot_hits: u64,
    hot_asks: u64,
    secs: f64,
    in_memory: usize,
    /// The process's resident set once the run settled, before the cluster left.
    rss: u64,
    /// Live heap bytes then (counted from before the run).
    heap: i64,
}

async fn run(name: &str, policy: PassivationPolicy, scanned: u64) -> Result<Run, BoxError> {
    let cluster = Cluster::builder().cluster_name(name).build().await?;
    let settings =
        EntitySettings::new("visits").shards(1024).mailbox(4).max_active(2 * HOT as usize).passivation_policy(policy);
    let visits: EntityHandle<Visits> = cluster.register::<Visits>(settings).await?;
    // The hot set, in memory before the scan starts.
    for i in 0..HOT {
        visits.entity_ref(format!("hot-{i}")).ask(()).await?;
    }
    let next = Arc::new(AtomicU64::new(0));
    let (hits, hot_asks) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let total = 2 * scanned;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CALLERS {
        let (visits, next, hits, hot_asks) = (visits.clone(), next.clone(), hits.clone(), hot_asks.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<(), shardline::Error>(());
                }
                if i % 2 == 0 {
                    // A hot id drawn from the ask's number (a multiplicative hash: spread, and
                    // the same in every run).
                    let hot = (i / 2).wrapping_mul(0x9e37_79b9_7f4a_7c15) % HOT;
                    let n = visits.entity_ref(format!("hot-{hot}")).ask(()).await?;
                    hot_asks.fetch_add(1, Ordering::Relaxed);
                    hits.fetch_add(u64::from(n > 1), Ordering::Relaxed);
                } else {
                    visits.entity_ref(format!("scan-{}", i / 2)).ask(()).await?;
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    // Picked entities whose task still ran leave once it would go idle.
    let settled = Instant::now();
    while visits.active_entities() > 0 && settled.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let in_memory = visits.local_entities();
    let rss = rss_bytes()?;
    let heap = shardline_cli::heap::live();
    cluster.leave().await?;
    Ok(Run {
        rss,
        heap,
        asks: total,
        hot_hits: hits.load(Ordering::Relaxed),
        hot_asks: hot_asks.load(Ordering::Relaxed),
        secs,
        in_memory,
    })
}

pub async fn passivation(args: &BenchArgs) -> Result<serde_json::Value, BoxError> {
    let scanned = args.entities.unwrap_or(1_000_000).max(1);
    // Warm the runtime so its own allocations are not counted.
    let before = {
        run("bench-passivation-warm", PassivationPolicy::FrequencyAdmission, 1_000).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        rss_bytes()?
    };
    shardline_cli::heap::start();
    let admitted = run("bench-passivation", PassivationPolicy::FrequencyAdmission, scanned).await?;
    let after = admitted.rss;
    let lru = run("bench-passivation-lru", PassivationPolicy::LeastRecentlyUsed, scanned).await?;
    let rate = |r: &Run| r.hot_hits as f64 / r.hot_asks.max(1) as f64;
    Ok(json!({
        "scenario": "passivation",
        "entities": scanned,
        "hot_set": HOT,
        "max_active": 2 * HOT,
        "policy": "frequency-admission",
        "entities_in_memory": admitted.in_memory,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "rss_bytes_per_entity": after.saturating_sub(before) as f64 / scanned as f64,
        "heap_bytes_per_entity": admitted.heap as f64 / scanned as f64,
        "heap_peak_bytes": shardline_cli::heap::peak(),
        "hot_hit_rate": rate(&admitted),
        "ops_per_s": admitted.asks as f64 / admitted.secs,
        "lru_hot_hit_rate": rate(&lru),
        "lru_ops_per_s": lru.asks as f64 / lru.secs,
        "lru_entities_in_memory": lru.in_memory,
    }))
}
