//! `shardline bench --scenario durable-ask --store URL`: the local-ask load against event-sourced
//! accounts on the journal, and in the same run, in alternating slices, against the same accounts
//! kept in memory (`MemoryAccount`: the same commands decided and applied the same way, nothing
//! written). The ratio is what durability costs: the journal's append, its group commit and sync,
//! and the recorded reply.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use shardline::entity::{EventSourcedHandle, EventSourcedSettings};
use shardline::{Cluster, EntityHandle, StrategyKind};
use shardline_cli::store::{self, StoreSpec};
use shardline_cli::{account_settings, register_memory_accounts, Account, AccountCmd, MemoryAccount};

use crate::args::BenchArgs;
use crate::journal_bench::{cleanup, durability};
use crate::paired::{Paired, SLICE};
use crate::procs::work_dir;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SHARDS: u32 = 1024;

/// One deposit to a random account of `n`; the operation id is the caller's random number.
fn deposit(rng: u64) -> AccountCmd {
    AccountCmd::Deposit { op: rng, amount: 1 }
}

pub async fn durable_ask(args: &BenchArgs) -> Result<serde_json::Value, BoxError> {
    let spec = match &args.store {
        Some(StoreSpec::Memory) => {
            return Err("durable-ask measures a journal: give sqlite://PATH or postgres://…".into())
        }
        Some(s) => s.clone(),
        None => StoreSpec::Sqlite {
            path: work_dir("durable-ask")?.join("journal.db").display().to_string(),
            synchronous: Default::default(),
        },
    };
    let schema = format!("shardline_durable_{}", std::process::id());
    let journal = store::open(&spec, &schema).await?;
    let n = args.entities.unwrap_or(1_000).max(1);
    let d = Duration::from_secs(args.duration_secs);
    let cluster = Cluster::builder().cluster_name("bench-durable").build().await?;
    let durable: EventSourcedHandle<Account> = cluster
        .register_event_sourced::<Account>(
            account_settings(SHARDS).journal(journal.clone()),
            EventSourcedSettings::default(),
        )
        .await?;
    let memory: EntityHandle<MemoryAccount> =
        register_memory_accounts(&cluster, SHARDS, &StrategyKind::LeastShards).await?;
    // Every account exists (and has recovered) before the first slice.
    for i in 0..n {
        durable.ask(format!("a{i}"), AccountCmd::Balance).await?;
        memory.entity_ref(format!("a{i}")).ask(AccountCmd::Balance).await?;
    }
    let ids: Arc<Vec<String>> = Arc::new((0..n).map(|i| format!("a{i}")).collect());
    let refs = Arc::new(ids.iter().map(|id| memory.entity_ref(id)).collect::<Vec<_>>());
    let p = Paired::run(
        args.concurrency,
        d,
        ((durable.clone(), ids), |(h, ids): (EventSourcedHandle<Account>, Arc<Vec<String>>), _, rng| async move {
            let ok = h.ask(&ids[(rng % ids.len() as u64) as usize], deposit(rng)).await.is_ok();
            ((h, ids), ok)
        }),
        (refs, |refs: Arc<Vec<shardline::EntityRef<MemoryAccount>>>, _, rng| async move {
            let ok = refs[(rng % refs.len() as u64) as usize].ask(deposit(rng)).await.is_ok();
            (refs, ok)
        }),
    )
    .await;
    let _ = cluster.leave().await;
    drop(durable);
    drop(journal);
    let durability = durability(&spec, &schema).await?;
    cleanup(&spec, &schema).await;
    Ok(json!({
        "scenario": "durable-ask",
        "store": spec.kind(),
        "durability": durability,
        "concurrency": args.concurrency,
        "entities": n,
        "ops_per_s": p.ops,
        "p50_us": p.lat.p50,
        "p99_us": p.lat.p99,
        "baseline": "the same accounts as in-memory entities, the same commands decided and applied, nothing written",
        "baseline_ops_per_s": p.floor_ops,
        "baseline_p50_us": p.floor_lat.p50,
        "baseline_p99_us": p.floor_lat.p99,
        "ratio": p.ratio,
        "slice_ms": SLICE.as_millis() as u64,
        "slice_ratios": p.ratios,
    }))
}
