//! `shardline bench --scenario reminders [--store URL]`: durable reminders with a million
//! pending. One node of a type with 1,024 shards keeps its reminders in the journal (SQLite by
//! default). Before the node starts, `--entities` reminders (1,000,000 by default) are stored:
//! 100,000 of them fall due over 10 s, a few seconds after the start, at 10,000 a second; the
//! rest are due a day later and only sit in the database. The node reads them per shard from
//! the due-time index, a page at a time, and fires each at its entity.
//!
//! Reports how late the due ones fired (`lag_p50_ms`, `lag_p99_ms`: from their due time to the
//! entity's handler) and `fired_per_s`: how many fired per second from the first due time to the
//! last firing (the offered rate, 10,000 a second, when the node keeps up). Then 50,000 more fall
//! due at one instant: `burst_fired_per_s` is how fast the node drains them, its capacity. Every
//! due reminder must fire and be acknowledged (removed from the journal), or the run fails.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use shardline::journal::{Fence, Journal, ReminderChange, StoredReminder};
use shardline::{Cluster, Entity, EntityContext, EntityId, EntitySettings, Epoch, Error, Reminder, ShardId};
use shardline_cli::store::{self, StoreSpec};
use shardline_core::shard_of;

use crate::args::BenchArgs;
use crate::procs::work_dir;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SHARDS: u32 = 1024;
const DUE: u64 = 100_000;
const WINDOW_MS: u64 = 10_000;
/// From the node's start to the first due time: the node has started and read its shards.
const LEAD_MS: u64 = 8_000;

const BURST: u64 = 50_000;
/// From the window's end to the burst's due time.
const BURST_AFTER_MS: u64 = 3_000;

/// The lag of every firing handled, in milliseconds: of the steady ones, and of the burst.
static LAGS: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static BURST_LAGS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

struct Beacon;

impl Entity for Beacon {
    type Message = ();
    type Reply = ();

    fn new(_id: &EntityId) -> Self {
        Beacon
    }

    async fn handle(&mut self, _ctx: &mut EntityContext, _msg: ()) {}

    async fn reminded(&mut self, _ctx: &mut EntityContext, r: Reminder) -> Result<(), Error> {
        let lag = SystemTime::now().duration_since(r.due()).unwrap_or_default();
        let lag = u32::try_from(lag.as_millis()).unwrap_or(u32::MAX);
        let lags = if r.name() == "burst" { &BURST_LAGS } else { &LAGS };
        lags.lock().unwrap_or_else(|e| e.into_inner()).push(lag);
        Ok(())
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Stores reminders `from..to` of the run, those below `DUE` due over the window from
/// `first_due`, the next `BURST` at one instant after it, the rest a day later; per shard, 32
/// shards at a time.
async fn seed(journal: &Arc<dyn Journal>, from: u64, to: u64, first_due: u64) -> Result<(), BoxError> {
    let mut by_shard: Vec<Vec<ReminderChange>> = vec![Vec::new(); SHARDS as usize];
    for i in from..to {
        let entity_id = format!("b{i}");
        let (name, due_ms) = if i < DUE {
            ("ping", first_due + i * WINDOW_MS / DUE)
        } else if i < DUE + BURST {
            ("burst", first_due + WINDOW_MS + BURST_AFTER_MS)
        } else {
            ("ping", first_due + 86_400_000 + i)
        };
        let shard = shard_of(&entity_id, SHARDS).0 as usize;
        by_shard[shard].push(ReminderChange::Set(StoredReminder { entity_id, name: name.into(), due_ms, every_ms: 0 }));
    }
    // Below any epoch the node will host at: its fences are raised over these.
    let epoch = Epoch { term: 1, seq: 0 };
    let mut tasks = tokio::task::JoinSet::new();
    for (shard, changes) in by_shard.into_iter().enumerate() {
        if tasks.len() >= 32 {
            tasks.join_next().await.ok_or("no seeding task")???;
        }
        let journal = journal.clone();
        tasks.spawn(async move {
            let fence = Fence { type_key: "beacon".into(), shard: ShardId(shard as u32), epoch };
            journal.raise_fence(&fence).await?;
            for chunk in changes.chunks(4096) {
                journal.change_reminders(&fence, chunk.to_vec()).await?;
            }
            Ok::<(), shardline::journal::JournalError>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

/// How many of the due reminders are still stored.
async fn still_due(journal: &dyn Journal, until: u64) -> Result<usize, BoxError> {
    let mut n = 0;
    for shard in 0..SHARDS {
        n += journal.due_reminders("beacon", ShardId(shard), None, until, 100_000).await?.len();
    }
    Ok(n)
}

pub async fn reminders(args: &BenchArgs) -> Result<serde_json::Value, BoxError> {
    let pending = args.entities.unwrap_or(1_000_000).max(1);
    let spec = match &args.store {
        Some(s) => s.clone(),
        None => StoreSpec::Sqlite {
            path: work_dir("reminders-bench")?.join("journal.db").display().to_string(),
            synchronous: Default::default(),
        },
    };
    let schema = format!("shardline_reminders_{}", std::process::id());
    let journal = store::open(&spec, &schema).await?;
    let seeding = Instant::now();
    if pending < DUE + BURST {
        return Err(format!("--entities {pending}: at least {} pending reminders", DUE + BURST).into());
    }
    let due = DUE + BURST;
    // Those due a day later first; then the due ones, timed from then: the node needs a moment
    // to start, and the first due time leaves it that, plus their seeding.
    seed(&journal, due, pending, unix_ms(SystemTime::now())).await?;
    let first_due = unix_ms(SystemTime::now() + Duration::from_micros(due * 40)) + LEAD_MS;
    seed(&journal, 0, due, first_due).await?;
    let seed_secs = seeding.elapsed().as_secs_f64();
    if unix_ms(SystemTime::now()) + 2_000 > first_due {
        return Err(format!("seeding {pending} reminders took {seed_secs:.1} s, past the first due time").into());
    }
    LAGS.lock().unwrap_or_else(|e| e.into_inner()).clear();
    BURST_LAGS.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let cluster = Cluster::builder().cluster_name("bench-reminders").build().await?;
    let settings = EntitySettings::new("beacon").shards(SHARDS).journal(journal.clone()).reminders();
    cluster.register::<Beacon>(settings).await?;
    let last_due = first_due + WINDOW_MS;
    let burst_due = last_due + BURST_AFTER_MS;
    let deadline = Instant::now()
        + Duration::from_millis(last_due.saturating_sub(unix_ms(SystemTime::now())))
        + Duration::from_secs(120);
    let count = |lags: &Mutex<Vec<u32>>| lags.lock().unwrap_or_else(|e| e.into_inner()).len();
    let mut last_fire = None;
    let burst_fire = loop {
        if last_fire.is_none() && count(&LAGS) >= DUE as usize {
            last_fire = Some(SystemTime::now());
        }
        let n = count(&LAGS) + count(&BURST_LAGS);
        if last_fire.is_some() && count(&BURST_LAGS) >= BURST as usize {
            break SystemTime::now();
        }
        if Instant::now() > deadline {
            return Err(format!("{n} of {due} due reminders fired").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Every due one is acknowledged (gone from the journal); the others are still there.
    let mut left = usize::MAX;
    for _ in 0..200 {
        left = still_due(&*journal, burst_due + 1).await?;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut lags = std::mem::take(&mut *LAGS.lock().unwrap_or_else(|e| e.into_inner()));
    let mut burst = std::mem::take(&mut *BURST_LAGS.lock().unwrap_or_else(|e| e.into_inner()));
    let fired = lags.len();
    let last_fire = last_fire.unwrap_or(burst_fire);
    cluster.leave().await?;
    if left != 0 {
        return Err(format!("{left} fired reminders were never acknowledged").into());
    }
    lags.sort_unstable();
    burst.sort_unstable();
    let burst_span = unix_ms(burst_fire).saturating_sub(burst_due).max(1) as f64 / 1000.0;
    let span = unix_ms(last_fire).saturating_sub(first_due).max(1) as f64 / 1000.0;
    crate::journal_bench::cleanup(&spec, &schema).await;
    Ok(json!({
        "scenario": "reminders",
        "store": spec.kind(),
        "pending": pending,
        "due": DUE,
        "fired": fired,
        "offered_per_s": DUE as f64 / (WINDOW_MS as f64 / 1000.0),
        "fired_per_s": fired as f64 / span,
        "lag_p50_ms": percentile(&lags, 0.50),
        "lag_p99_ms": percentile(&lags, 0.99),
        "lag_max_ms": lags.last().copied().unwrap_or(0),
        "burst": burst.len(),
        "burst_fired_per_s": burst.len() as f64 / burst_span,
        "burst_lag_p50_ms": percentile(&burst, 0.50),
        "burst_lag_p99_ms": percentile(&burst, 0.99),
        "seed_secs": seed_secs,
        "shards": SHARDS,
    }))
}
