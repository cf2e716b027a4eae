//! Micro-benchmarks of the core: the entity → shard hash, and planning a full allocation of
//! 1,024 / 16,384 / 100,000 shards over 3 / 100 / 1,000 nodes with every strategy (every shard
//! unallocated, so every shard is placed: the most work a plan can be).
//!
//! Besides criterion's report, each benchmark's median goes as one JSON object per line to
//! `target/shardline-bench/core.jsonl` and to stdout: `{"bench": …, "median_ns": …}`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use shardline_core::{
    shard_of, AllocationStrategy, ConsistentHash, External, LeastShards, Member, MemberStatus, NodeId, Ranges, ShardId,
    ShardMap, VersionAware,
};

fn bench_shard_of(c: &mut Criterion) {
    let ids: Vec<String> = (0..1024).map(|i| format!("acct-{i:011}")).collect();
    assert!(ids.iter().all(|s| s.len() == 16));
    let mut g = c.benchmark_group("shard_of");
    g.throughput(Throughput::Elements(1));
    let mut i = 0;
    g.bench_function("16_byte_id", |b| {
        b.iter(|| {
            i = (i + 1) & 1023;
            shard_of(black_box(&ids[i]), black_box(1024))
        })
    });
    g.finish();
}

fn strategies(nodes: usize, shards: u32) -> Vec<(&'static str, Box<dyn AllocationStrategy>)> {
    let external = External::new((0..shards).map(|s| (ShardId(s), format!("node-{}", s as usize % nodes))));
    vec![
        ("least_shards", Box::new(LeastShards::default())),
        ("version_aware", Box::new(VersionAware::default())),
        ("consistent_hash", Box::new(ConsistentHash::default())),
        ("ranges", Box::new(Ranges::default())),
        ("external", Box::new(external)),
    ]
}

fn bench_plans(c: &mut Criterion) {
    for shards in [1_024u32, 16_384, 100_000] {
        for nodes in [3usize, 100, 1_000] {
            let hosts: Vec<Member> = (0..nodes)
                .map(|i| Member::new(NodeId::new(format!("node-{i}"), 1), i as u64).with_status(MemberStatus::Up))
                .collect();
            let map = ShardMap::new(shards).expect("shards > 0");
            let mut g = c.benchmark_group(format!("plan/{shards}_shards/{nodes}_nodes"));
            for (name, strategy) in strategies(nodes, shards) {
                let plan = strategy.plan(&hosts, &map);
                assert_eq!(plan.moves.len(), shards as usize, "{name} places every shard");
                g.bench_with_input(BenchmarkId::from_parameter(name), &(), |b, _| {
                    b.iter(|| strategy.plan(black_box(&hosts), black_box(&map)))
                });
            }
            g.finish();
        }
    }
}

fn target_dir() -> PathBuf {
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(t);
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().find(|p| p.join("Cargo.lock").exists()).unwrap_or(&manifest).join("target")
}

/// Reads criterion's estimates and writes one JSON line per benchmark with its median.
fn write_summary() {
    let root = target_dir().join("criterion");
    let mut lines = Vec::new();
    collect(&root, &mut lines);
    lines.sort();
    let out = target_dir().join("shardline-bench");
    if std::fs::create_dir_all(&out).is_ok() {
        let _ = std::fs::write(out.join("core.jsonl"), lines.join("\n") + "\n");
    }
    for l in &lines {
        println!("{l}");
    }
}

fn collect(dir: &Path, lines: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "new") {
                let bench = std::fs::read_to_string(p.join("benchmark.json")).ok();
                let est = std::fs::read_to_string(p.join("estimates.json")).ok();
                if let (Some(bench), Some(est)) = (bench, est) {
                    let id = field(&bench, "\"full_id\":\"").unwrap_or_default();
                    let median = est.find("\"median\"").and_then(|i| field(&est[i..], "\"point_estimate\":"));
                    if let Some(m) = median {
                        lines.push(format!("{{\"bench\":\"{id}\",\"median_ns\":{m}}}"));
                    }
                }
            } else {
                collect(&p, lines);
            }
        }
    }
}

/// The text after `key` up to the next `"`, `,` or `}`.
fn field(s: &str, key: &str) -> Option<String> {
    let start = s.find(key)? + key.len();
    let rest = &s[start..];
    let end = rest.find(['"', ',', '}'])?;
    Some(rest[..end].to_string())
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    bench_shard_of(&mut c);
    bench_plans(&mut c);
    c.final_summary();
    write_summary();
}
