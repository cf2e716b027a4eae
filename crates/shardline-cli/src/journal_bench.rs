//! `shardline bench --scenario journal --store URL`: appends per second of 64 concurrent writers
//! through the journal (fence check, sequence check, group commit), against the same rows
//! inserted raw, in the order the writers produce them, in batches of as many rows as there are
//! writers, in the same run; and how long an
//! entity with 10,000 events takes to recover, from its events alone and from a snapshot 100
//! events before its end. Medians of `--runs` runs (default 5).

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
                    reminders: Vec::new(),
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
        StoreSpec::Postgres(url) => postgres_floor(url, schema, &rows, WRITERS).await?,
        StoreSpec::PostgresSplit(urls) => {
            // Each database's rows (as the journal splits them) into it, all at once, in
            // transactions of its share of the writers.
            let mut parts: Vec<Vec<(String, u64, Vec<u8>)>> = vec![Vec::new(); urls.len()];
            for row in rows {
                parts[shardline::journal::part_of(&row.0, urls.len())].push(row);
            }
            let per_transaction = WRITERS.div_ceil(urls.len());
            let mut floors = Vec::new();
            for (url, rows) in urls.iter().zip(parts) {
                let (url, schema) = (url.clone(), schema.to_string());
                floors.push(tokio::spawn(async move { postgres_floor(&url, &schema, &rows, per_transaction).await }));
            }
            let mut slowest = Duration::ZERO;
            for f in floors {
                slowest = slowest.max(f.await??);
            }
            slowest
        }
        StoreSpec::Memory => return Err("the journal bench needs sqlite:// or postgres://".into()),
    };
    Ok(n / took.as_secs_f64())
}

#[cfg(feature = "postgres")]
async fn postgres_floor(
    url: &str,
    schema: &str,
    rows: &[(String, u64, Vec<u8>)],
    per_transaction: usize,
) -> Result<Duration, BoxError> {
    let config = shardline_postgres::PostgresConfig::new(url).schema(schema);
    Ok(shardline_postgres::floor_insert(&config, rows, per_transaction).await?)
}

#[cfg(not(feature = "postgres"))]
async fn postgres_floor(url: &str, _: &str, _: &[(String, u64, Vec<u8>)], _: usize) -> Result<Duration, BoxError> {
    Err(format!("--store {url} needs the `postgres` feature").into())
}

/// When a commit is on disk, for the JSON: SQLite's `synchronous` setting (the floor's too), or the
/// PostgreSQL server's `fsync` and `synchronous_commit`, read from the server.
pub(crate) async fn durability(spec: &StoreSpec, schema: &str) -> Result<String, BoxError> {
    Ok(match spec {
        StoreSpec::Sqlite { synchronous, .. } => format!("synchronous={}", synchronous.as_str()),
        StoreSpec::Postgres(url) => postgres_durability(url, schema).await?,
        StoreSpec::PostgresSplit(urls) => {
            let mut each = Vec::new();
            for url in urls {
                each.push(postgres_durability(url, schema).await?);
            }
            each.join("; ")
        }
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
pub(crate) async fn cleanup(spec: &StoreSpec, schema: &str) {
    match spec {
        StoreSpec::Sqlite { path, .. } => {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{path}{suffix}"));
            }
        }
        StoreSpec::Postgres(url) => drop_postgres_schema(url, schema).await,
        StoreSpec::PostgresSplit(urls) => {
            for url in urls {
                drop_postgres_schema(url, schema).await;
            }
        }
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
                reminders: Vec::new(),
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

/// One store's figures: medians and every run's.
struct Measured {
    appends: Vec<f64>,
    floors: Vec<f64>,
    recovery: Vec<f64>,
    recovery_snapshot: Vec<f64>,
}

/// `--runs` runs of appends against their floor on `spec`, with a recovery after each.
async fn measure(spec: &StoreSpec, schema: &str, args: &BenchArgs) -> Result<Measured, BoxError> {
    let journal = store::open(spec, schema).await?;
    journal.raise_fence(&fence()).await?;
    let per_writer = args.entities.unwrap_or(1_000).max(1);
    let mut m =
        Measured { appends: Vec::new(), floors: Vec::new(), recovery: Vec::new(), recovery_snapshot: Vec::new() };
    for run in 0..args.runs.clamp(1, 100) as usize {
        // Alternate which goes first, so that neither always meets a warmer cache.
        let (ops, floor_ops) = if run % 2 == 0 {
            let ops = appends(&journal, run, per_writer).await?;
            (ops, floor(spec, schema, rows(run, per_writer)).await?)
        } else {
            let floor_ops = floor(spec, schema, rows(run, per_writer)).await?;
            (appends(&journal, run, per_writer).await?, floor_ops)
        };
        m.appends.push(ops);
        m.floors.push(floor_ops);
        let (r, s) = recovery(&journal, run).await?;
        m.recovery.push(r);
        m.recovery_snapshot.push(s);
    }
    Ok(m)
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
    // A journal split over several databases is measured on its first database alone too, each
    // against as many raw floors as it has databases.
    let mut stores = Vec::new();
    if let StoreSpec::PostgresSplit(urls) = &spec {
        stores.extend(urls.first().map(|u| StoreSpec::Postgres(u.clone())));
    }
    stores.push(spec.clone());
    let mut by_databases = Vec::new();
    let mut last = None;
    for store in &stores {
        let schema = format!("{schema}_{}", databases(store));
        let measured = measure(store, &schema, args).await;
        let durability = durability(store, &schema).await;
        cleanup(store, &schema).await;
        let (m, durability) = (measured?, durability?);
        let (ops, base) = (median(m.appends.clone()), median(m.floors.clone()));
        by_databases.push(json!({
            "databases": databases(store),
            "durability": durability,
            "appends_per_s": ops,
            "baseline_appends_per_s": base,
            "ratio": if base > 0.0 { ops / base } else { 0.0 },
        }));
        last = Some((m, durability));
    }
    let (m, durability) = last.ok_or("no store measured")?;
    let (ops, base) = (median(m.appends.clone()), median(m.floors.clone()));
    Ok(json!({
        "scenario": "journal",
        "store": spec.kind(),
        "databases": databases(&spec),
        "durability": durability,
        "writers": WRITERS,
        "appends_per_writer": args.entities.unwrap_or(1_000).max(1),
        "appends_per_s": ops,
        "baseline_appends_per_s": base,
        "baseline": format!(
            "the same rows inserted raw in the order the writers produce them, {WRITERS} per transaction, \
             each database's rows into it at once"
        ),
        "ratio": if base > 0.0 { ops / base } else { 0.0 },
        "by_databases": by_databases,
        "recovery_events": EVENTS_TO_RECOVER,
        "recovery_ms": median(m.recovery.clone()),
        "recovery_snapshot_ms": median(m.recovery_snapshot.clone()),
        "runs": {
            "appends_per_s": m.appends,
            "baseline_appends_per_s": m.floors,
            "recovery_ms": m.recovery,
            "recovery_snapshot_ms": m.recovery_snapshot,
        },
    }))
}

/// How many databases a store spans.
fn databases(spec: &StoreSpec) -> usize {
    match spec {
        StoreSpec::PostgresSplit(urls) => urls.len(),
        _ => 1,
    }
}
