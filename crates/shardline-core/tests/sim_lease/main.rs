//! Deterministic simulation of lease membership: the real [`LeaseEngine`]s of up to five nodes
//! over a simulated coordination store with latency, outages, lost answers, a store some nodes
//! cannot reach, pauses (a process stopped past its lease), crashes, restarts as new
//! incarnations, and graceful leaves — all from one seeded generator.
//!
//! After every step it checks L1 (one leader per term), L2 (a node that may host holds a live
//! member key) and L3 (no view declares down a member that may still host). At the end of each
//! partition of the schedules that have only partitions it checks L4 (the nodes that may host
//! reach each other), once the split had time to be resolved: from the partition's start, or
//! from the last moment the store held no member key, when the cluster started again (see
//! `check_resolved`). After a quiet period it checks that every node is up, hosting, and agrees
//! on one leader.
//!
//! Every run covers 10,000 schedules or more from a fresh base seed; `sim_lease_replay`
//! replays one with its trace (see `../sim/harness.rs` for the variables).
//!
//! [`LeaseEngine`]: shardline_core::lease::LeaseEngine

#[path = "../sim/harness.rs"]
mod harness;
#[path = "../sim/queue.rs"]
mod queue;
#[allow(dead_code)] // shared with the sharding simulation, which uses all of it
#[path = "../sim/rng.rs"]
mod rng;
mod store;
mod world;

use std::hash::Hasher;

use world::{Params, World};

/// This world, for the commands the harness prints.
const WORLD: harness::World =
    harness::World { bin: "sim_lease", schedules: "sim_lease_schedules", replay: "sim_lease_replay" };

/// Violations, trace hash, steps, and the counters: self-fencings, partition ends where L4 was
/// checked, those of them whose split began at a moment without member keys, and those where both
/// sides hosted but were not checked, the split having begun at such a moment too recently.
fn run_one(p: Params, verbose: bool) -> (Vec<String>, u64, u64, Counters) {
    let mut w = World::new(p);
    w.verbose = verbose;
    let (v, w) = w.run();
    (v, w.trace.finish(), w.steps, (w.fenced, w.l4_checked, w.l4_after_keyless, w.l4_late_splits))
}

type Counters = (u64, u64, u64, u64);

fn add(t: &mut Counters, c: Counters) {
    t.0 += c.0;
    t.1 += c.1;
    t.2 += c.2;
    t.3 += c.3;
}

/// One schedule of `seed`, its parameters changed by `tweak`: violations and counters.
fn schedule(seed: u64, tweak: fn(&mut Params)) -> (Vec<String>, Counters) {
    let mut p = Params::random(seed);
    tweak(&mut p);
    let (v, _, _, counters) = run_one(p, false);
    (v, counters)
}

/// Runs `count` schedules from `first_seed` on two threads: failures (seed, first violation) and
/// self-fencings.
fn run_many(first_seed: u64, count: u64, tweak: fn(&mut Params)) -> (Vec<(u64, String)>, Counters) {
    harness::run_seeds(first_seed, count, |seed| schedule(seed, tweak), add)
}

#[test]
fn sim_lease_schedules_keep_invariants() {
    let run = harness::Run::from_env(WORLD);
    let (failures, (fenced, l4, keyless, late), _) = run.run(|seed| schedule(seed, |_| {}), add);
    let n = run.count;
    println!("simulated {n} lease schedules, {} violations ({fenced} self-fencings)", failures.len());
    println!(
        "L4 checked at {l4} partition ends ({keyless} of them dated from a moment without member keys); \
         not at {late} where both sides hosted after such a moment, too recent to be resolved"
    );
    run.report(&failures);
    assert!(failures.is_empty(), "{} of {n} lease schedules violated an invariant", failures.len());
    assert!(fenced > 0, "no node ever fenced itself: the fencing path is not exercised");
}

/// Replays the schedule of `SHARDLINE_SIM_SEED` with its trace; does nothing without it.
#[test]
fn sim_lease_replay() {
    let Some(seed) = harness::replay_seed() else { return };
    let p = Params::random(seed);
    eprintln!("replaying seed {seed}: {p:?}");
    let (v, ..) = run_one(p, true);
    assert!(v.is_empty(), "seed {seed}: {v:?}");
}

/// The checker can fail: an engine that counts its lease from the store's answer instead of its
/// request hosts past its key's expiry when an answer is late, and the simulation must see it.
#[test]
fn sim_lease_catches_a_lease_counted_from_the_answer() {
    let tweak: fn(&mut Params) = |p| {
        p.broken_lease_start = true;
        p.faults = p.faults.max(4);
    };
    let caught = |r: &(Vec<(u64, String)>, Counters)| r.0.iter().any(|(_, v)| v.contains("L2"));
    let batches = harness::until_found("lease from the answer", 300, 6_000, |b, n| run_many(b, n, tweak), caught);
    let (failures, _) = &batches[0];
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
    let tweak: fn(&mut Params) = |p| {
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
    };
    let caught = |r: &(Vec<(u64, String)>, Counters)| r.0.iter().any(|(_, v)| v.contains("L4"));
    let batches = harness::until_found("split brain never resolved", 100, 2_000, |b, n| run_many(b, n, tweak), caught);
    let (failures, _) = &batches[0];
    println!("split brain never resolved: {} of 100 schedules caught", failures.len());
    assert!(failures.iter().any(|(_, v)| v.contains("L4")), "the simulation did not notice two sides hosting");
}
