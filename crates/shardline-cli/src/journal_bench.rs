//! `shardline bench --scenario journal --store URL`: appends per second of 64 concurrent writers
//! through the journal (fence check, sequence check, group commit), against the same rows
//! inserted raw, in the order the writers produce them, in batches of as many rows as there are
//! writers, in the same run; and how long an
//! entity with 10,000 events takes to recover, from its events alone and from a snapshot 100
//! events before its end. Medians of `--runs` runs (default 3).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use shardline::journal::{AppendRequest, EventRecord, Fence, Journal, Snapshot};
use shardline::{Epoch, ShardId};
use shardline_cli::store::{self, StoreSpec};

use crate::args::BenchArgs;
use crate::procs::work_dir;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const WRITERS: usize = 64;
const EVENTS_TO_RECOVER: u64 = 10_000;
const SNAPSHOT_BEFORE_END: u64 = 100;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn fence() -> Fence {
    Fence { type_key: "bench".into(), shard: ShardId(0), epoch: Epoch { term: 1, seq: 1 } }
}

fn event(amount: u64) -> EventRecord {
    EventRecord { type_name: "bench.deposited".into(), schema_version: 1, payload: amount.to_le_bytes().to_vec() }
}

/// The rows the writers of a run append, (persistence id, sequence number, payload), in the order
/// they produce them: each writer's next event after every writer's previous one. So a floor
/// transaction of 64 rows holds one event per entity, as the journal's batches do. (Ordered by
/// entity instead, a transaction would hold 64 events of one entity, all on one B-tree leaf: a
/// workload that no group of concurrent writers produces, which made the floor 7 times faster.)
fn rows(run: usize, per_writer: u64) -> Vec<(String, u64, Vec<u8>)> {
    (1..=per_writer)
        .flat_map(|seq| (0..WRITERS).map(move |w| (format!("bench|r{run}-w{w}"), seq, event(seq - 1).payload)))
        .collect()
}

/// 64 writers, each appending one event at a time to its own entity. Returns appends/s.
async fn appends(journal: &Arc<dyn Journal>, run: usize, per_writer: u64) -> Result<f64, BoxError> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let journal = journal.clone();
        tasks.push(tokio::spawn(async move {
            let pid = format!("bench|r{run}-w{w}");
            for seq in 0..per_writer {
                let request = AppendRequest {
                    fence: fence(),
                    persistence_id: pid.clone(),
                    entity_id: format!("r{run}-w{w}"),
                    expected_seq: seq,
                    events: vec![event(seq)],
                    remember: false,
                    reply: None,
                    keep_replies: std::time::Duration::ZERO,
                };
                journal.append(request).await.map_err(|e| format!("{pid} append {seq}: {e}"))?;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok((WRITERS as u64 * per_writer) as f64 / start.elapsed().as_secs_f64())
}

/// The same rows, raw, in batches of `WRITERS` rows per transaction.
async fn floor(spec: &StoreSpec, schema: &str, rows: Vec<(String, u64, Vec<u8>)>) -> Result<f64, BoxError> {
    let n = rows.len() as f64;
    let took = match spec {
        StoreSpec::Sqlite { path, synchronous } => {
            let (path, synchronous) = (std::path::PathBuf::from(path), *synchronous);
            tokio::task::spawn_blocking(move || shardline_sqlite::floor_insert(&path, &rows, WRITERS, synchronous))
                .await??
        }
        StoreSpec::Postgres(url) => postgres_floor(url, schema, &rows).await?,
        StoreSpec::Memory => return Err("the journal bench needs sqlite:// or postgres://".into()),
    };
    Ok(n / took.as_secs_f64())
}

#[cfg(feature = "postgres")]
async fn postgres_floor(url: &str, schema: &str, rows: &[(String, u64, Vec<u8>)]) -> Result<Duration, BoxError> {
    let config = shardline_postgres::PostgresConfig::new(url).schema(schema);
    Ok(shardline_postgres::floor_insert(&config, rows, WRITERS).await?)
}

#[cfg(not(feature = "postgres"))]
async fn postgres_floor(url: &str, _schema: &str, _rows: &[(String, u64, Vec<u8>)]) -> Result<Duration, BoxError> {
    Err(format!("--store {url} needs the `postgres` feature").into())
}

/// When a commit is on disk, for the JSON: SQLite's `synchronous` setting (the floor's too), or the
/// PostgreSQL server's `fsync` and `synchronous_commit`, read from the server.
async fn durability(spec: &StoreSpec, schema: &str) -> Result<String, BoxError> {
    Ok(match spec {
        StoreSpec::Sqlite { synchronous, .. } => format!("synchronous={}", synchronous.as_str()),
        StoreSpec::Postgres(url) => postgres_durability(url, schema).await?,
        StoreSpec::Memory => "memory".into(),
    })
}

#[cfg(feature = "postgres")]
async fn postgres_durability(url: &str, schema: &str) -> Result<String, BoxError> {
    let config = shardline_postgres::PostgresConfig::new(url).schema(schema);
    Ok(shardline_postgres::durability(&config).await?)
}

#[cfg(not(feature = "postgres"))]
async fn postgres_durability(url: &str, _schema: &str) -> Result<String, BoxError> {
    Err(format!("--store {url} needs the `postgres` feature").into())
}

/// Removes what the run wrote: the SQLite file's directory, or the PostgreSQL schema.
async fn cleanup(spec: &StoreSpec, schema: &str) {
    match spec {
        StoreSpec::Sqlite { path, .. } => {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{path}{suffix}"));
            }
        }
        StoreSpec::Postgres(url) => drop_postgres_schema(url, schema).await,
        StoreSpec::Memory => {}
    }
}

#[cfg(feature = "postgres")]
async fn drop_postgres_schema(url: &str, schema: &str) {
    let config = shardline_postgres::PostgresConfig::new(url).schema(schema);
    if let Err(e) = shardline_postgres::drop_schema(&config).await {
        eprintln!("the bench schema {schema} was not dropped: {e}");
    }
}

#[cfg(not(feature = "postgres"))]
async fn drop_postgres_schema(_url: &str, _schema: &str) {}

/// Recovery as an entity does it: the latest snapshot, then every event after it, decoded and
/// folded. Returns milliseconds.
async fn recover(journal: &Arc<dyn Journal>, pid: &str) -> Result<f64, BoxError> {
    let start = Instant::now();
    let (mut balance, from) = match journal.load_snapshot(pid).await? {
        Some(s) => (u64::from_le_bytes(s.payload.as_slice().try_into()?), s.seq + 1),
        None => (0, 1),
    };
    for e in journal.read(pid, from).await? {
        balance = balance.wrapping_add(u64::from_le_bytes(e.event.payload.as_slice().try_into()?));
    }
    std::hint::black_box(balance);
    Ok(start.elapsed().as_secs_f64() * 1000.0)
}

/// An entity with 10,000 events (and one with the same events and a snapshot 100 before the end).
async fn recovery(journal: &Arc<dyn Journal>, run: usize) -> Result<(f64, f64), BoxError> {
    let (plain, snapped) = (format!("bench|recover-{run}"), format!("bench|recover-snap-{run}"));
    for pid in [&plain, &snapped] {
        for batch in 0..EVENTS_TO_RECOVER / 100 {
            let request = AppendRequest {
                fence: fence(),
                persistence_id: pid.clone(),
                entity_id: pid.clone(),
                expected_seq: batch * 100,
                events: (0..100).map(|i| event(batch * 100 + i)).collect(),
                remember: false,
                reply: None,
                keep_replies: std::time::Duration::ZERO,
            };
            journal.append(request).await?;
        }
    }
    let at = EVENTS_TO_RECOVER - SNAPSHOT_BEFORE_END;
    let balance: u64 = (0..at).sum();
    let snapshot = Snapshot { seq: at, schema_version: 1, payload: balance.to_le_bytes().to_vec() };
    journal.save_snapshot(&fence(), &snapped, snapshot).await?;
    Ok((recover(journal, &plain).await?, recover(journal, &snapped).await?))
}

pub async fn journal(args: &BenchArgs) -> Result<serde_json::Value, BoxError> {
    let spec = match &args.store {
        Some(s) => s.clone(),
        None => StoreSpec::Sqlite {
            path: work_dir("journal-bench")?.join("journal.db").display().to_string(),
            synchronous: Default::default(),
        },
    };
    let schema = format!("shardline_bench_{}", std::process::id());
    let journal = store::open(&spec, &schema).await?;
    journal.raise_fence(&fence()).await?;
    let per_writer = args.entities.unwrap_or(1_000).max(1);
    let (mut ours, mut floors, mut rec, mut rec_snap) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..args.runs.clamp(1, 100) as usize {
        // Alternate which goes first, so that neither always meets a warmer cache.
        let (ops, floor_ops) = if run % 2 == 0 {
            let ops = appends(&journal, run, per_writer).await?;
            (ops, floor(&spec, &schema, rows(run, per_writer)).await?)
        } else {
            let floor_ops = floor(&spec, &schema, rows(run, per_writer)).await?;
            (appends(&journal, run, per_writer).await?, floor_ops)
        };
        ours.push(ops);
        floors.push(floor_ops);
        let (r, s) = recovery(&journal, run).await?;
        rec.push(r);
        rec_snap.push(s);
    }
    drop(journal);
    let durability = durability(&spec, &schema).await?;
    cleanup(&spec, &schema).await;
    let (ops, base) = (median(ours.clone()), median(floors.clone()));
    Ok(json!({
        "scenario": "journal",
        "store": spec.kind(),
        "durability": durability,
        "writers": WRITERS,
        "appends_per_writer": per_writer,
        "appends_per_s": ops,
        "baseline_appends_per_s": base,
        "baseline": format!("the same rows inserted raw in the order the writers produce them, {WRITERS} per transaction"),
        "ratio": if base > 0.0 { ops / base } else { 0.0 },
        "recovery_events": EVENTS_TO_RECOVER,
        "recovery_ms": median(rec.clone()),
        "recovery_snapshot_ms": median(rec_snap.clone()),
        "runs": { "appends_per_s": ours, "baseline_appends_per_s": floors, "recovery_ms": rec, "recovery_snapshot_ms": rec_snap },
    }))
}
