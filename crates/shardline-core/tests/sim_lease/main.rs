//! Deterministic simulation of lease membership: the real [`LeaseEngine`]s of up to five nodes
//! over a simulated coordination store with latency, outages, lost answers, a store some nodes
//! cannot reach, pauses (a process stopped past its lease), crashes, restarts as new
//! incarnations, and graceful leaves — all from one seeded generator.
//!
//! After every step it checks L1 (one leader per term), L2 (a node that may host holds a live
//! member key) and L3 (no view declares down a member that may still host). After a quiet period
//! it checks that every node is up, hosting, and agrees on one leader.
//!
//! `SHARDLINE_SIM_SCHEDULES=N` sets the number of schedules (default 300);
//! `SHARDLINE_SIM_SEED=S` replays one schedule with a trace.
//!
//! [`LeaseEngine`]: shardline_core::lease::LeaseEngine

#[path = "../sim/parallel.rs"]
mod parallel;
#[path = "../sim/queue.rs"]
mod queue;
#[allow(dead_code)] // shared with the sharding simulation, which uses all of it
#[path = "../sim/rng.rs"]
mod rng;
mod store;
mod world;

use std::hash::Hasher;

use world::{Params, World};

fn schedules() -> u64 {
    std::env::var("SHARDLINE_SIM_SCHEDULES").ok().and_then(|s| s.parse().ok()).unwrap_or(300)
}

/// Violations, trace hash, steps, self-fencings.
fn run_one(p: Params, verbose: bool) -> (Vec<String>, u64, u64, u64) {
    let mut w = World::new(p);
    w.verbose = verbose;
    let (v, w) = w.run();
    (v, w.trace.finish(), w.steps, w.fenced)
}

/// Runs `count` schedules from `first_seed` on two threads: failures (seed, first violation) and
/// self-fencings.
fn run_many(first_seed: u64, count: u64, tweak: fn(&mut Params)) -> (Vec<(u64, String)>, u64) {
    let run = |seed| {
        let mut p = Params::random(seed);
        tweak(&mut p);
        let (v, _, _, fenced) = run_one(p, false);
        (v, fenced)
    };
    parallel::run_seeds(first_seed, count, run, |t: &mut u64, c| *t += c)
}

#[test]
fn sim_lease_schedules_keep_invariants() {
    if let Some(seed) = std::env::var("SHARDLINE_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        let p = Params::random(seed);
        eprintln!("replaying seed {seed}: {p:?}");
        let (v, ..) = run_one(p, true);
        assert!(v.is_empty(), "seed {seed}: {v:?}");
        return;
    }
    let n = schedules();
    let (failures, fenced) = run_many(1, n, |_| {});
    println!("simulated {n} lease schedules, {} violations ({fenced} self-fencings)", failures.len());
    for (seed, v) in failures.iter().take(10) {
        println!("  seed {seed}: {v}  (replay: SHARDLINE_SIM_SEED={seed})");
    }
    assert!(failures.is_empty(), "{} of {n} lease schedules violated an invariant", failures.len());
    assert!(fenced > 0, "no node ever fenced itself: the fencing path is not exercised");
}

/// The checker can fail: an engine that counts its lease from the store's answer instead of its
/// request hosts past its key's expiry when an answer is late, and the simulation must see it.
#[test]
fn sim_lease_catches_a_lease_counted_from_the_answer() {
    let (failures, _) = run_many(1_000_000, 300, |p| {
        p.broken_lease_start = true;
        p.faults = p.faults.max(4);
    });
    println!("lease counted from the answer: {} of 300 schedules caught", failures.len());
    for (seed, v) in failures.iter().take(3) {
        println!("  seed {seed}: {v}");
    }
    assert!(failures.iter().any(|(_, v)| v.contains("L2")), "the simulation did not notice hosting past the lease");
}

/// Same seed, same run.
#[test]
fn sim_lease_is_deterministic() {
    for seed in [5, 99, 31337] {
        let a = run_one(Params::random(seed), false);
        let b = run_one(Params::random(seed), false);
        assert_eq!(a.1, b.1, "seed {seed} ran differently twice");
        assert!(a.2 > 100, "seed {seed} ran only {} steps", a.2);
    }
}

/// L4 can fail: with a stable window no partition outlasts, nobody races, both sides of every
/// partition keep hosting, and the check at each partition's end must see it.
#[test]
fn sim_lease_catches_a_split_brain_never_resolved() {
    let (failures, _) = run_many(2_000_000, 100, |p| {
        p.nodes = p.nodes.max(2);
        p.faults = p.faults.clamp(1, 3);
        p.partitions_only = true;
        let mut c = shardline_core::lease::PeerChecks { every_ms: p.ttl_ms / 5, ..Default::default() };
        c.unreachable_after_ms = 4 * c.every_ms;
        c.acquire_delay_ms = p.ttl_ms / 2;
        c.stable_after_ms = p.ttl_ms;
        p.peer_checks = Some(c);
        p.active_ms = p.active_ms.max(p.faults as u64 * p.resolve_within() * 2);
        p.never_resolve = true;
    });
    println!("split brain never resolved: {} of 100 schedules caught", failures.len());
    assert!(failures.iter().any(|(_, v)| v.contains("L4")), "the simulation did not notice two sides hosting");
}
