//! The real runtime in a deterministic simulation: nodes built with the public builder, with
//! their real drivers, shard hosts, entity tasks and membership providers (leases over a shared
//! in-memory store with the split-brain race, or gossip with the keep-majority resolver), on a
//! simulated network and clock, all on one thread per schedule.
//!
//! Faults: crashes and restarts as new incarnations, symmetric and one-way partitions, loss (as
//! TCP makes it: delays), reset connections, a node paused past failure detection, journal
//! outages, slow commits and commits whose answer is lost, coordination-store outages, graceful
//! leaves and joins. After every schedule: (a) no two instances of one account decide commands
//! at once, on the memberships that promise it (leases always; gossip without pauses and one-way
//! cuts, as the README's table says); (b) every acknowledged write is in the journal exactly
//! once and nothing answered "not applied" is; (c) reads are linearizable per account (the
//! history checker of `shardline check`); (d) every account answers within 40 s of the heal.
//!
//! Seeds are drawn fresh on every run and printed. `SHARDLINE_SIM_RUNTIME_SCHEDULES` raises the
//! count above its floor of 1,000, never below; `SHARDLINE_SIM_SEED=S cargo test --release
//! --all-features -p shardline-cli --test sim_runtime sim_runtime_replay -- --nocapture` replays
//! one schedule with its trace.

mod checks;
mod faulty;
mod net;
mod rng;
mod world;

use std::time::Instant;

use shardline::sabotage::Sabotage;
use world::{FaultMix, Mode, Schedule};

const FLOOR: u64 = 1_000;

fn schedules() -> u64 {
    let asked = std::env::var("SHARDLINE_SIM_RUNTIME_SCHEDULES").ok().and_then(|s| s.parse().ok()).unwrap_or(FLOOR);
    asked.max(FLOOR)
}

fn fresh_base() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    h.finish()
}

/// Runs one schedule on a thread of its own (the world's thread-locals start empty) and
/// returns its violations, a panic among them.
fn run_one(sched: Schedule, sab: Sabotage, tracing: bool) -> (u64, Vec<String>, Vec<String>, u64) {
    let seed = sched.seed;
    let joined = std::thread::Builder::new()
        .name(format!("sim-{seed}"))
        .stack_size(16 << 20)
        .spawn(move || {
            let o = world::run(sched.clone(), sab, tracing);
            let (reads, mut v) = checks::all(&sched, &o);
            v.extend(world::take_panics().into_iter().map(|p| format!("panicked: {p}")));
            (reads, v, o.trace, o.steps)
        })
        .map_err(|e| e.to_string())
        .and_then(|t| t.join().map_err(|p| panic_text(&p)));
    match joined {
        Ok(r) => r,
        Err(p) => (0, vec![format!("panicked: {p}")], Vec::new(), 0),
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

#[test]
fn sim_runtime_schedules_keep_invariants() {
    let n = schedules();
    let base = std::env::var("SHARDLINE_SIM_BASE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(fresh_base);
    println!("base seed {base}");
    let started = Instant::now();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).min(4) as u64;
    let results: Vec<(u64, u64, Vec<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    let mut i = w;
                    while i < n {
                        let seed = base.wrapping_add(i);
                        let sched = Schedule::draw(seed, FaultMix::ALL, None);
                        let (reads, v, _, _) = run_one(sched, Sabotage::None, false);
                        out.push((seed, reads, v));
                        i += workers;
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    let secs = started.elapsed().as_secs_f64();
    let reads: u64 = results.iter().map(|r| r.1).sum();
    let failed: Vec<_> = results.iter().filter(|r| !r.2.is_empty()).collect();
    for (seed, _, v) in &failed {
        println!("  seed {seed}: {}", v.join("; "));
        println!("    replay: SHARDLINE_SIM_SEED={seed} cargo test --release --all-features -p shardline-cli --test sim_runtime sim_runtime_replay -- --nocapture");
    }
    let violations: usize = failed.iter().map(|r| r.2.len()).sum();
    println!(
        "simulated {} runtime schedules, {violations} violations ({reads} reads checked, {:.1} schedules/s)",
        results.len(),
        results.len() as f64 / secs
    );
    assert_eq!(results.len() as u64, n, "every schedule ran");
    assert!(reads > 0, "no read was checked");
    assert!(failed.is_empty(), "{} schedules broke an invariant", failed.len());
}

#[test]
fn sim_runtime_replay() {
    let Some(seed) = std::env::var("SHARDLINE_SIM_SEED").ok().and_then(|s| s.parse().ok()) else { return };
    // The nodes' own logs, each line under its host's span: SHARDLINE_SIM_LOG=debug for more.
    let filter = std::env::var("SHARDLINE_SIM_LOG").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).without_time().with_test_writer().try_init();
    let sched = Schedule::draw(seed, FaultMix::ALL, None);
    println!(
        "seed {seed}: {:?}, {} nodes, one owner promised: {}",
        sched.mode,
        sched.nodes,
        sched.promises_one_owner()
    );
    let (reads, v, trace, steps) = run_one(sched, Sabotage::None, true);
    for l in trace {
        println!("{l}");
    }
    println!("{steps} steps, {reads} reads checked");
    for x in &v {
        println!("VIOLATION {x}");
    }
    assert!(v.is_empty());
}

/// Runs schedules of `mix` on a runtime broken as `sab` until one breaks an invariant that
/// `expect` names; fails when none does in `tries` schedules.
fn caught(sab: Sabotage, mix: FaultMix, mode: Mode, expect: &str, tries: u64) {
    let base = fresh_base();
    for i in 0..tries {
        let seed = base.wrapping_add(i);
        let (_, v, _, _) = run_one(Schedule::draw(seed, mix, Some(mode)), sab, false);
        if v.iter().any(|x| x.starts_with(expect)) {
            println!("{sab:?} caught by seed {seed} (try {}): {}", i + 1, v[0]);
            return;
        }
    }
    panic!("{sab:?} was not caught by {tries} schedules from base seed {base}");
}

const QUIET: FaultMix = FaultMix {
    crashes: false,
    pauses: false,
    partitions: false,
    network: false,
    journal: false,
    store: false,
    membership_changes: false,
};

#[test]
fn sim_runtime_catches_a_runtime_that_ignores_its_lease() {
    caught(Sabotage::IgnoreLease, FaultMix { pauses: true, ..QUIET }, Mode::Leases, "(", 20);
}

#[test]
fn sim_runtime_catches_a_runtime_that_skips_the_request_id_lookup() {
    caught(Sabotage::SkipRequestIdLookup, FaultMix { journal: true, ..QUIET }, Mode::Leases, "(b)", 20);
}

#[test]
fn sim_runtime_catches_a_runtime_that_acknowledges_before_the_commit() {
    caught(Sabotage::AckBeforeCommit, FaultMix { journal: true, ..QUIET }, Mode::Leases, "(b)", 20);
}
