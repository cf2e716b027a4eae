//! `shardline demo`: a local cluster of separate processes under load, through scale-out,
//! graceful leave and `kill -9`, checked against the driver's own ledger.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardline::Cluster;

use crate::args::DemoArgs;
use crate::load::{
    percentiles, probe_ids, run_accounts, shards_per_node, AccountRange, HomeMonitor, Invariants, Ledger, Route,
};
use crate::procs::{free_port, work_dir, NodeProc, RunCerts};
use shardline_cli::history::{self, ownership, HistoryWriter};
use shardline_cli::membership::MembershipSpec;
use shardline_cli::store::StoreSpec;
use shardline_cli::{register_accounts, register_memory_accounts, Accounts};

mod in_memory;
mod progress;
mod report;

use progress::Progress;
pub use report::NodeReport;
use report::{DemoReport, InMemoryReport, InvariantReport, PhaseReport};

/// The steady load against the in-memory accounts (see [`in_memory`]).
async fn steady_in_memory(
    memory: &shardline::EntityHandle<shardline_cli::MemoryAccount>,
    args: &DemoArgs,
    progress: &Progress,
) -> InMemoryReport {
    let duration = Duration::from_secs(args.duration_secs);
    let load = in_memory::run(memory, AccountRange::first(args.entities), args.concurrency, duration, |acked, _, t| {
        progress
            .update(format!("steady, in memory: {:>8.0} ops/s ({t:.0?})", acked as f64 / t.as_secs_f64().max(0.001)))
    })
    .await;
    let mut lat = load.latencies;
    let report = InMemoryReport {
        acked: load.acked,
        failed: load.failed,
        ops_per_s: load.acked as f64 / load.elapsed.as_secs_f64().max(0.001),
        latency_us: percentiles(&mut lat),
        errors: load.errors,
    };
    progress.line(format!(
        "{:<18} {:>9.0} ops/s  p50 {:>7.0} µs  p99 {:>8.0} µs  (the same load on accounts kept in memory)  failed {:>6}",
        "steady, in memory", report.ops_per_s, report.latency_us.p50, report.latency_us.p99, report.failed
    ));
    report
}

async fn wait_for(what: &str, limit: Duration, progress: &Progress, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > limit {
            progress.line(format!("gave up waiting for {what} after {limit:?}"));
            return false;
        }
        progress.update(format!("waiting for {what} ({:.0?})", start.elapsed()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

/// The history and ownership checks of a run so far.
#[derive(Default)]
struct HistoryCheck {
    findings: history::Findings,
    overlaps: u64,
    details: Vec<String>,
}

impl HistoryCheck {
    fn run(
        history_path: &std::path::Path,
        ownership_path: &std::path::Path,
        killed: &[(String, u128)],
    ) -> Result<HistoryCheck, Box<dyn std::error::Error>> {
        let ops = history::read_histories(&[history_path.to_path_buf()])?;
        let findings = history::check(&ops);
        let events = ownership::read_log(ownership_path)?;
        let overlaps = ownership::overlaps(&events, killed, history::now_ms());
        let mut details = findings.details.clone();
        details.extend(overlaps.iter().map(|o| o.to_string()));
        Ok(HistoryCheck { findings, overlaps: overlaps.len() as u64, details })
    }

    fn violations(&self) -> u64 {
        let f = &self.findings;
        f.lost_acked + f.double_applied + f.applied_not_applied + f.order_violations
    }
}

/// The application version of the nodes a rolling restart starts.
const NEW_VERSION: &str = "2";

/// Shards per hosting node, with each node's application version. An owner the driver's view
/// does not know yet is left out: it is a node that just (re)started, whose shards were announced
/// before its membership reached the driver. Counting it with an empty version made a restarted,
/// new-version node look like an old one that gained shards.
fn shards_by_version(driver: &Cluster, accounts: &Accounts) -> Vec<(shardline::NodeId, String, usize)> {
    let view = driver.view();
    let mut counts: BTreeMap<shardline::NodeId, usize> = BTreeMap::new();
    for owner in accounts.entity_handle().shard_homes().into_iter().flatten() {
        *counts.entry(owner).or_default() += 1;
    }
    counts
        .into_iter()
        .filter_map(|(n, c)| {
            let v = view.view.get(&n)?.app_version.to_string();
            Some((n, v, c))
        })
        .collect()
}

/// Watches a rolling restart phase: did any old-version node get more shards than it had?
/// Only once a new-version node serves: before, the old version is all there is.
fn watch_old_versions(driver: &Cluster, accounts: &Accounts) -> Option<tokio::task::JoinHandle<bool>> {
    let (driver, accounts) = (driver.clone(), accounts.clone());
    let new_up = driver.view().view.members().any(|m| {
        m.status == shardline_core::MemberStatus::Up && !m.is_proxy() && m.app_version.to_string() == NEW_VERSION
    });
    if !new_up {
        return None;
    }
    let start: BTreeMap<_, _> = shards_by_version(&driver, &accounts)
        .into_iter()
        .filter(|(_, v, _)| v != NEW_VERSION)
        .map(|(n, _, c)| (n, c))
        .collect();
    Some(tokio::spawn(async move {
        loop {
            for (n, v, c) in shards_by_version(&driver, &accounts) {
                if v != NEW_VERSION && c > start.get(&n).copied().unwrap_or(0) {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }))
}

fn hosts_up(driver: &Cluster) -> Vec<String> {
    let v = driver.view();
    v.view
        .members()
        .filter(|m| m.status == shardline_core::MemberStatus::Up && !m.is_proxy())
        .map(|m| m.node.name.to_string())
        .collect()
}

/// Runs the demo; returns the process exit code.
pub async fn run(args: DemoArgs) -> i32 {
    match run_inner(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("demo failed: {e}");
            1
        }
    }
}

async fn run_inner(args: DemoArgs) -> Result<i32, Box<dyn std::error::Error>> {
    let dir = work_dir("demo")?;
    let progress = Progress::new();
    let total_nodes = args.nodes + 1;
    let mut addrs = Vec::new();
    for i in 0..total_nodes {
        let port = match args.base_port {
            Some(p) => p.checked_add(i as u16).ok_or("base port out of range")?,
            None => free_port()?,
        };
        addrs.push(format!("127.0.0.1:{port}"));
    }
    // Every first node is a seed: a restarted first seed then finds the cluster through the
    // others instead of starting a second one.
    let seed_list: Vec<String> = addrs[..args.nodes as usize].to_vec();
    let seed = seed_list.join(",");
    // Every node appends to one journal; a fresh one per run, so the audit sees this run only.
    let store = args.store.clone().unwrap_or_else(|| StoreSpec::Sqlite {
        path: dir.join("journal.db").display().to_string(),
        synchronous: Default::default(),
    });
    // The witness the nodes already share: leases in the journal's SQLite file (a PostgreSQL
    // journal's schema changes every run, while its leases would live in the cluster's).
    let membership_spec = args.membership.clone().unwrap_or_else(|| match &store {
        StoreSpec::Sqlite { path, .. } => MembershipSpec::Sqlite(path.clone()),
        _ => MembershipSpec::Seeds,
    });
    let membership = membership_spec.to_string();
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let schema = format!("shardline_demo_{}_{stamp}", std::process::id());
    let store_desc = match &store {
        StoreSpec::Postgres(_) | StoreSpec::PostgresSplit(_) => format!("{store}, schema {schema}"),
        other => other.to_string(),
    };
    if matches!(store, StoreSpec::Memory) {
        return Err("--store memory keeps each node's journal in its own process: a moved account would lose \
                    its history. Use sqlite://PATH or postgres://…"
            .into());
    }
    println!(
        "Shardline demo: {} node processes ({membership}), {} shards, {} accounts, {} callers, {} s per phase\n  journal: {store_desc}\n  logs in {}",
        args.nodes,
        args.shards,
        args.entities,
        args.concurrency,
        args.duration_secs,
        dir.display()
    );
    let certs = if args.tls {
        let mut names: Vec<String> = (1..=total_nodes).map(|i| format!("n{i}")).collect();
        names.push("driver".into());
        let certs = RunCerts::make(&dir, &names)?;
        println!("  mutual TLS between every node and the driver (development CA in {}/certs)", dir.display());
        Some(certs)
    } else {
        None
    };
    let node_flags = |name: &str, version: &str| -> Vec<String> {
        let mut flags = vec!["--app-version".into(), version.into(), "--strategy".into(), args.strategy.to_string()];
        flags.extend(["--store".into(), store.to_string(), "--store-schema".into(), schema.clone()]);
        flags.extend(certs.as_ref().map(|c| c.flags(name)).unwrap_or_default());
        flags
    };
    // Node `n{i+1}` on the first version.
    let start_node = |i: usize| {
        let name = format!("n{}", i + 1);
        NodeProc::spawn(&name, &addrs[i], &seed, args.shards, &membership, &dir, &node_flags(&name, "1"))
    };
    let mut nodes: Vec<NodeProc> = Vec::new();
    for i in 0..args.nodes {
        nodes.push(start_node(i as usize)?);
        if i == 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let mut driver =
        Cluster::builder().cluster_name("shardline-demo").node_name("driver").proxy().membership_boxed(
            shardline_cli::membership::provider(&membership_spec, "shardline-demo", &seed_list).await?,
        );
    if let Some(c) = &certs {
        driver = driver.tls(c.config("driver")?);
    }
    let driver = driver.build().await?;
    let accounts: Accounts = register_accounts(&driver, args.shards, &args.strategy.0, None).await?;
    let memory = register_memory_accounts(&driver, args.shards, &args.strategy.0).await?;
    // The demo's driver runs in this process for the whole run: one incarnation, one route.
    let route = Route::new(accounts.clone());
    let want = args.nodes as usize;
    let d2 = driver.clone();
    if !wait_for("every node to join", Duration::from_secs(60), &progress, || hosts_up(&d2).len() >= want).await {
        return Ok(1);
    }
    let a2 = accounts.clone();
    if !wait_for("every shard to get a home", Duration::from_secs(60), &progress, || {
        a2.entity_handle().shard_homes().iter().chain(&memory.shard_homes()).all(Option::is_some)
    })
    .await
    {
        return Ok(1);
    }
    // Start measuring once the initial allocation has settled: every host holds its share.
    // LeastShards reaches max − min ≤ 1; the other strategies follow their own rules, so for
    // them "settled" means every host holds shards and nothing moved for two seconds.
    let a3 = accounts.clone();
    let least_shards = matches!(args.strategy.0, shardline::StrategyKind::LeastShards);
    let mut last = (shards_per_node(&a3.entity_handle().shard_homes()), Instant::now());
    let balanced = wait_for("the initial rebalance to settle", Duration::from_secs(60), &progress, || {
        let per = shards_per_node(&a3.entity_handle().shard_homes());
        if per != last.0 {
            last = (per.clone(), Instant::now());
        }
        let spread = per.values().max().unwrap_or(&0) - per.values().min().unwrap_or(&0);
        per.len() == want && (spread <= 1 || !least_shards && last.1.elapsed() >= Duration::from_secs(2))
    })
    .await;
    if !balanced {
        return Ok(1);
    }
    progress.line(format!("cluster up: {}", hosts_up(&driver).join(", ")));

    let probes = Arc::new(probe_ids(args.shards));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let history_path = dir.join("history.jsonl");
    let history_log = Arc::new(HistoryWriter::create(&history_path)?);
    let ownership_path = dir.join("ownership.log");
    let mut killed: Vec<(String, u128)> = Vec::new();
    let mut checked_history = HistoryCheck::default();
    let next_op = Arc::new(AtomicU64::new(1));
    let duration = Duration::from_secs(args.duration_secs);
    let rolling = args.scenario == "rolling-restart";
    let phases: Vec<String> = if rolling {
        std::iter::once("steady".to_string()).chain((1..=args.nodes).map(|i| format!("restart-n{i}"))).collect()
    } else {
        ["steady", "scale-out", "graceful-leave", "kill-9", "steady-after-kill"].map(String::from).to_vec()
    };
    let mut reports = Vec::new();
    let mut in_memory = None;
    let mut inv = Invariants::default();
    let mut checked = Vec::new();
    let mut leaver: Option<tokio::task::JoinHandle<Option<i32>>> = None;
    let mut restarted: Option<(String, tokio::task::JoinHandle<std::io::Result<NodeProc>>)> = None;
    for name in phases.iter().map(String::as_str) {
        let event = Instant::now();
        let watch = if rolling { watch_old_versions(&driver, &accounts) } else { None };
        match name {
            restart if restart.starts_with("restart-") => {
                let who = &restart["restart-".len()..];
                let idx = nodes.iter().position(|n| n.name == who).ok_or("no such node")?;
                let mut p = nodes.remove(idx);
                let i: usize = who[1..].parse::<usize>()? - 1;
                let (addr, seed, shards, membership, dir) =
                    (addrs[i].clone(), seed.clone(), args.shards, membership.clone(), dir.clone());
                let flags = node_flags(who, NEW_VERSION);
                let who = who.to_string();
                progress.line(format!("rolling restart: SIGTERM to {who}, then version {NEW_VERSION}"));
                let task = tokio::task::spawn_blocking(move || {
                    p.terminate();
                    NodeProc::spawn(&p.name, &addr, &seed, shards, &membership, &dir, &flags)
                });
                restarted = Some((who, task));
            }
            "scale-out" => {
                let i = args.nodes as usize;
                nodes.push(start_node(i)?);
                progress.line(format!("scale-out: started n{}", i + 1));
            }
            "graceful-leave" if nodes.len() > 1 => {
                let mut p = nodes.remove(1);
                progress.line(format!("graceful leave: SIGTERM to {}", p.name));
                leaver = Some(tokio::task::spawn_blocking(move || p.terminate()));
            }
            "kill-9" if nodes.len() > 1 => {
                let idx = nodes.len() - 1;
                progress.line(format!("kill -9 of {}", nodes[idx].name));
                nodes[idx].kill();
                killed.push((nodes[idx].name.clone(), history::now_ms()));
                nodes.remove(idx);
            }
            _ => {}
        }
        let monitor = HomeMonitor::start(&accounts, probes.clone(), event);
        let label = name.to_string();
        let load = run_accounts(
            &route,
            AccountRange::first(args.entities),
            args.concurrency,
            duration,
            &ledger,
            &next_op,
            Some(&history_log),
            |acked, failed, t| {
                progress.update(format!(
                    "{label}: {:>8.0} ops/s  acked {acked}  failed {failed}  ({:.0?})",
                    acked as f64 / t.as_secs_f64().max(0.001),
                    t
                ))
            },
        )
        .await;
        if let Some(l) = leaver.take() {
            let code = l.await.ok().flatten();
            progress.line(format!("graceful leave: node exited with {code:?}"));
        }
        if let Some((who, task)) = restarted.take() {
            nodes.push(task.await??);
            // The next node may only leave once this one serves: its shards must have a
            // new-version home to go to.
            let d = driver.clone();
            let up = wait_for(&format!("{who} to rejoin"), Duration::from_secs(60), &progress, || {
                d.view().view.members().any(|m| {
                    *m.node.name == *who
                        && m.status == shardline_core::MemberStatus::Up
                        && m.app_version.to_string() == NEW_VERSION
                })
            })
            .await;
            if !up {
                return Ok(1);
            }
        }
        let rehome = monitor.finish(Duration::from_secs(60)).await;
        let old_version_gained = match watch {
            Some(w) => {
                w.abort();
                Some(matches!(w.await, Ok(true)))
            }
            None => None,
        };
        let new_version_shards = rolling.then(|| {
            shards_by_version(&driver, &accounts).iter().filter(|(_, v, _)| v == NEW_VERSION).map(|(_, _, c)| c).sum()
        });
        // Every account, after every phase: the journal holds them through moves and crashes.
        progress.update(format!("{name}: auditing {} accounts", args.entities));
        let snapshot = std::mem::take(&mut *ledger.lock().unwrap_or_else(|e| e.into_inner()));
        let found = snapshot.audit(&route, AccountRange::first(args.entities), 64, Some(&history_log)).await;
        *ledger.lock().unwrap_or_else(|e| e.into_inner()) = snapshot;
        inv.lost_acked += found.lost_acked;
        inv.double_applied += found.double_applied;
        inv.ledger_mismatches += found.ledger_mismatches;
        checked.push(name.to_string());
        let ledger_checked = true;
        // The whole history so far and the ownership log, as `shardline check` reads them.
        progress.update(format!("{name}: checking the history"));
        history_log.flush()?;
        checked_history = HistoryCheck::run(&history_path, &ownership_path, &killed)?;
        for d in checked_history.details.iter() {
            progress.line(format!("  {name}: {d}"));
        }
        let mut lat = load.latencies;
        let (moved, served, rehome_error) = match &rehome {
            Ok(r) => (r.moved, r.served_after, None),
            Err(e) => (e.moved(), None, Some(e.to_string())),
        };
        let rehomed = rehome.is_ok() && (moved == 0 || served.is_some());
        let report = PhaseReport {
            name: name.to_string(),
            acked: load.acked,
            failed: load.failed,
            ops_per_s: load.acked as f64 / load.elapsed.as_secs_f64().max(0.001),
            latency_us: percentiles(&mut lat),
            shards_moved: moved,
            rehome_ms: served.map(|d| d.as_secs_f64() * 1000.0).unwrap_or(if rehomed { 0.0 } else { -1.0 }),
            rehomed,
            rehome_error,
            errors: load.errors,
            ledger_checked,
            new_version_shards,
            old_version_gained,
        };
        progress.line(format!(
            "{:<18} {:>9.0} ops/s  p50 {:>7.0} µs  p99 {:>8.0} µs  moved {:>5}  rehome {:>8}  failed {:>6} {}",
            report.name,
            report.ops_per_s,
            report.latency_us.p50,
            report.latency_us.p99,
            report.shards_moved,
            match (&report.rehome_error, report.rehomed) {
                (Some(e), _) => format!("never ({e})"),
                (None, true) => format!("{:.0} ms", report.rehome_ms),
                (None, false) => "never".into(),
            },
            report.failed,
            if report.errors.is_empty() { String::new() } else { format!("{:?}", report.errors) },
        ));
        reports.push(report);
        if name == "steady" {
            in_memory = Some(steady_in_memory(&memory, &args, &progress).await);
        }
    }
    let in_memory = in_memory.ok_or("the run had no steady phase")?;
    let durable_ratio = reports.first().map_or(0.0, |p| p.ops_per_s) / in_memory.ops_per_s.max(f64::MIN_POSITIVE);
    progress.finish();
    let per_node = shards_per_node(&accounts.entity_handle().shard_homes());
    let report = DemoReport {
        store: store.kind().to_string(),
        nodes_started: total_nodes,
        shards: args.shards,
        entities: args.entities,
        phases: reports,
        in_memory,
        durable_ratio,
        invariants: InvariantReport {
            lost_acked: inv.lost_acked,
            double_applied: inv.double_applied,
            ledger_mismatches: inv.ledger_mismatches,
            reads_checked: checked_history.findings.reads_checked,
            stale_reads: checked_history.findings.stale_reads,
            writes_checked: checked_history.findings.writes_checked,
            history_violations: checked_history.violations(),
            ownership_overlaps: checked_history.overlaps,
            checked_after: checked,
            note: format!(
                "every account audited after every phase{}: accounts are event-sourced in the {} journal, and \
                 callers resend an unanswered operation with its request id",
                if rolling { " (each restart a graceful leave)" } else { ", kill -9 included" },
                store.kind()
            ),
        },
        nodes: per_node.into_iter().map(|(name, shards)| NodeReport { name, shards }).collect(),
    };
    println!(
        "\nSteady: {:.0} ops/s on the {} journal, {:.0} ops/s on accounts kept in memory ({:.2}×)",
        report.phases.first().map_or(0.0, |p| p.ops_per_s),
        report.store,
        report.in_memory.ops_per_s,
        report.durable_ratio
    );
    println!("Invariants (after {}):", report.invariants.checked_after.join(", "));
    println!(
        "  lost acknowledged operations: {}\n  operations applied twice:     {}\n  ledger mismatches:            {}",
        report.invariants.lost_acked, report.invariants.double_applied, report.invariants.ledger_mismatches
    );
    println!(
        "  history: {} reads checked, {} stale; {} writes checked, {} other violations\n  shards on two nodes at once:  {}\n  (shardline check {} --ownership-log {}{})",
        report.invariants.reads_checked,
        report.invariants.stale_reads,
        report.invariants.writes_checked,
        report.invariants.history_violations,
        report.invariants.ownership_overlaps,
        history_path.display(),
        ownership_path.display(),
        killed.iter().map(|(n, t)| format!(" --killed {n}@{t}")).collect::<String>()
    );
    println!("Shards per node at the end:");
    for n in &report.nodes {
        println!("  {:<6} {}", n.name, n.shards);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        println!("report written to {path}");
    }
    for p in report.phases.iter().filter(|p| !p.rehomed) {
        eprintln!(
            "{}: the moved shards were not seen serving again{}",
            p.name,
            p.rehome_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
        );
    }
    let ok = report.invariants.lost_acked == 0
        && report.invariants.double_applied == 0
        && report.invariants.ledger_mismatches == 0
        && report.invariants.stale_reads == 0
        && report.invariants.history_violations == 0
        && report.invariants.ownership_overlaps == 0
        && report.phases.iter().all(|p| p.rehomed && p.old_version_gained != Some(true));
    drop(nodes);
    Ok(if ok { 0 } else { 1 })
}
