//! Deterministic simulation of the sharding protocol: one coordinator engine (on the leader)
//! and N region engines on a simulated network with random delays, reordering across links,
//! broken links, crashes and restarts (new incarnations), partitions with self-fencing, graceful
//! leaves and joins — all from one seeded rng.
//!
//! After every step it checks I1 (a shard hosted by at most one live node; an entity live on
//! one node; processing only at the hosting epoch) and I3 (processed at most once) and the order
//! half of I4 (per sender and entity). After the quiet period it checks I2 (every shard homed,
//! nothing buffered) and the delivery half of I4 (every message not lost to a fault its sender
//! can see, and not refused with an error, was processed).
//!
//! Every run covers 10,000 schedules or more from a fresh base seed; `sim_replay` replays one
//! with its trace (see `harness.rs` for the variables).
//!
//! The network model is TCP's: messages between two nodes arrive in order or not at all; a
//! broken connection drops what was in flight and both ends learn of it; a message for a node
//! that cannot be reached is handed back to its sender unsent.

mod harness;
mod ledger;
mod queue;
mod rng;
mod world;

use world::{Params, World};

/// This world, for the commands the harness prints.
const WORLD: harness::World = harness::World { bin: "sim", schedules: "sim_schedules", replay: "sim_replay" };

/// Violations, trace hash, messages sent, steps, coordinators deposed by a refused write, and
/// members marked unreachable.
fn run_one(p: Params, verbose: bool) -> (Vec<String>, u64, usize, u64, u64, u64) {
    let mut w = World::new(p);
    w.verbose = verbose;
    let (v, w) = w.run();
    use std::hash::Hasher;
    (v, w.trace.finish(), w.ledger.total(), w.steps, w.deposed, w.unreachable_marks)
}

/// What a batch of schedules found.
struct Batch {
    failures: Vec<(u64, String)>,
    deposed: u64,
    unreachable: u64,
}

/// Adds one schedule's counters (messages, deposed, unreachable marks) to the totals.
fn add(t: &mut (usize, u64, u64), c: (usize, u64, u64)) {
    t.0 += c.0;
    t.1 += c.1;
    t.2 += c.2;
}

/// One schedule of `seed`, its parameters changed by `tweak`: violations and counters.
fn schedule(seed: u64, tweak: fn(&mut Params)) -> (Vec<String>, (usize, u64, u64)) {
    let mut p = Params::random(seed);
    tweak(&mut p);
    let (v, _, sent, _, d, u) = run_one(p, false);
    (v, (sent, d, u))
}

/// Runs `count` schedules from `first_seed` on two threads.
fn run_many(first_seed: u64, count: u64, tweak: fn(&mut Params)) -> Batch {
    let (failures, (_, deposed, unreachable)) =
        harness::run_seeds(first_seed, count, |seed| schedule(seed, tweak), add);
    Batch { failures, deposed, unreachable }
}

#[test]
fn sim_schedules_keep_invariants() {
    let run = harness::Run::from_env(WORLD);
    let (failures, (messages, deposed, unreachable), _) = run.run(|seed| schedule(seed, |_| {}), add);
    let n = run.count;
    println!("simulated {n} schedules, {} violations ({messages} messages)", failures.len());
    println!("stale coordinators deposed by a refused map write: {deposed}");
    println!("members marked unreachable: {unreachable}");
    run.report(&failures);
    assert!(failures.is_empty(), "{} of {n} schedules violated an invariant", failures.len());
}

/// Replays the schedule of `SHARDLINE_SIM_SEED` with its trace; does nothing without it.
#[test]
fn sim_replay() {
    let Some(seed) = harness::replay_seed() else { return };
    let p = Params::random(seed);
    eprintln!("replaying seed {seed}: {p:?}");
    let (v, ..) = run_one(p, true);
    assert!(v.is_empty(), "seed {seed}: {v:?}");
}

/// The checker can fail: a coordinator that moves a shard without waiting for `ShardStopped`
/// lets two nodes host it at once, and the simulation must see it.
#[test]
fn sim_catches_hand_off_without_shard_stopped() {
    let tweak: fn(&mut Params) = |p| {
        p.broken_hand_off = true;
        p.faults = 3;
        p.strategy = 0;
    };
    let batches =
        harness::until_found("broken protocol", 100, 1_000, |b, n| run_many(b, n, tweak), |b| !b.failures.is_empty());
    let failures = &batches[0].failures;
    println!("broken protocol: {} of 100 schedules caught", failures.len());
    for (seed, v) in failures.iter().take(3) {
        println!("  seed {seed}: {v}");
    }
    assert!(!failures.is_empty(), "the simulation did not notice a hand-off that skips ShardStopped");
}

/// The checker can fail: a coordinator that ignores reachability begins hand-offs towards or
/// from members it cannot reach, and the simulation must see it.
#[test]
fn sim_catches_hand_off_with_an_unreachable_member() {
    let tweak: fn(&mut Params) = |p| {
        p.broken_reachability = true;
        p.faults = p.faults.max(4);
    };
    let caught = |b: &Batch| b.failures.iter().any(|(_, v)| v.contains("reach:"));
    let batches = harness::until_found("unreachable", 200, 2_000, |b, n| run_many(b, n, tweak), caught);
    let Batch { failures, unreachable, .. } = &batches[0];
    println!("coordinator ignoring reachability: {} of 200 schedules caught ({unreachable} marks)", failures.len());
    for (seed, v) in failures.iter().take(3) {
        println!("  seed {seed}: {v}");
    }
    assert!(
        failures.iter().any(|(_, v)| v.contains("reach:")),
        "the simulation did not notice hand-offs with unreachable members"
    );
}

/// Stale leaders occur and are deposed: the refused-write path of the coordinator runs, and the
/// invariants hold with two coordinators of different terms at once.
#[test]
fn sim_deposes_stale_coordinators() {
    let tweak: fn(&mut Params) = |p| {
        p.with_store = true;
        p.stale_leaders = true;
        p.faults = p.faults.max(3);
    };
    let batches = harness::until_found("stale leaders", 200, 2_000, |b, n| run_many(b, n, tweak), |b| b.deposed > 0);
    let failures: Vec<&(u64, String)> = batches.iter().flat_map(|b| &b.failures).collect();
    let deposed: u64 = batches.iter().map(|b| b.deposed).sum();
    println!("stale leaders: {} violations, {deposed} coordinators deposed", failures.len());
    for (seed, v) in failures.iter().take(5) {
        println!("  seed {seed}: {v}");
    }
    assert!(failures.is_empty(), "{} schedules with stale leaders violated an invariant", failures.len());
    assert!(deposed > 0, "no stale coordinator was ever deposed: the path is not exercised");
}

/// Same seed, same run: every event and its time hash to the same value.
#[test]
fn sim_is_deterministic() {
    for seed in [3, 77, 4242] {
        let a = run_one(Params::random(seed), false);
        let b = run_one(Params::random(seed), false);
        assert_eq!(a.1, b.1, "seed {seed} ran differently twice");
        assert_eq!(a.3, b.3);
        assert!(a.3 > 100, "seed {seed} ran only {} steps", a.3);
    }
}
