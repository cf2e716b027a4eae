//! Deterministic simulation of gossip membership: the real [`GossipEngine`]s of two to six
//! nodes on a simulated network with latency, loss, crashes, leaves and restarts as new
//! incarnations — all from one seeded generator. Half the schedules run engines with the
//! split-brain resolver (`KeepMajority`), and add partitions (some as long as 30 s), one-way
//! links, pauses and stalled messages.
//!
//! After every step it checks G1 (one leader per term) and G3 (a member that a leader shows down,
//! so that its shards would be taken over, has stopped: crashed, declared itself down, or may not
//! host now because no majority answered it within the window, which is how a paused or cut-off
//! member stops; a first seed restarted before any term was taken is left out, since it cannot
//! tell that from a first boot). After
//! the faults it checks G2: every live member sees every other one `Up` and reachable, and all
//! name the same leader.
//!
//! Members that do not answer have their address checked: refused where a process crashed and
//! its host answers, the incarnation listening there, or nothing across a cut or from a paused
//! process; only the first two prove a member gone.
//!
//! Every run covers 10,000 schedules or more from a fresh base seed; `sim_gossip_replay`
//! replays one with its trace (see `../sim/harness.rs` for the variables).
//!
//! [`GossipEngine`]: shardline_core::gossip::GossipEngine

#[path = "../sim/harness.rs"]
mod harness;
#[path = "../sim/queue.rs"]
mod queue;
#[allow(dead_code)] // shared with the sharding simulation, which uses all of it
#[path = "../sim/rng.rs"]
mod rng;
mod world;

use std::hash::Hasher;

use world::{Params, World};

/// This world, for the commands the harness prints.
const WORLD: harness::World =
    harness::World { bin: "sim_gossip", schedules: "sim_gossip_schedules", replay: "sim_gossip_replay" };

/// Violations, trace hash, steps, nodes declared down.
fn run_one(p: Params, verbose: bool) -> (Vec<String>, u64, u64, u64) {
    let mut w = World::new(p);
    w.verbose = verbose;
    let (v, w) = w.run();
    (v, w.trace.finish(), w.steps, w.downed)
}

/// One schedule of `seed`, its parameters changed by `tweak`: violations and nodes declared down.
fn schedule(seed: u64, tweak: fn(&mut Params)) -> (Vec<String>, u64) {
    let mut p = Params::random(seed);
    tweak(&mut p);
    let (v, _, _, downed) = run_one(p, false);
    (v, downed)
}

fn run_many(first_seed: u64, count: u64, tweak: fn(&mut Params)) -> (Vec<(u64, String)>, u64) {
    harness::run_seeds(first_seed, count, |seed| schedule(seed, tweak), |t: &mut u64, c| *t += c)
}

#[test]
fn sim_gossip_schedules_keep_invariants() {
    let run = harness::Run::from_env(WORLD);
    let (failures, downed, _) = run.run(|seed| schedule(seed, |_| {}), |t: &mut u64, c| *t += c);
    let n = run.count;
    println!("simulated {n} gossip schedules, {} violations ({downed} nodes declared down)", failures.len());
    run.report(&failures);
    assert!(failures.is_empty(), "{} of {n} gossip schedules violated an invariant", failures.len());
}

/// Replays the schedule of `SHARDLINE_SIM_SEED` with its trace; does nothing without it.
#[test]
fn sim_gossip_replay() {
    let Some(seed) = harness::replay_seed() else { return };
    let p = Params::random(seed);
    eprintln!("replaying seed {seed}: {p:?}");
    let (v, ..) = run_one(p, true);
    assert!(v.is_empty(), "seed {seed}: {v:?}");
}

/// Runs batches of `batch` schedules, their parameters changed by `tweak`, until one breaks
/// `invariant` (at most `cap`), prints what the first batch caught and asserts that it did.
fn assert_caught(what: &str, batch: u64, cap: u64, tweak: fn(&mut Params), invariant: &str, unnoticed: &str) {
    let caught = |r: &(Vec<(u64, String)>, u64)| r.0.iter().any(|(_, v)| v.contains(invariant));
    let batches = harness::until_found(what, batch, cap, |b, n| run_many(b, n, tweak), caught);
    let (failures, _) = &batches[0];
    println!("{what}: {} of {batch} schedules caught", failures.len());
    for (seed, v) in failures.iter().take(3) {
        println!("  seed {seed}: {v}");
    }
    assert!(failures.iter().any(|(_, v)| v.contains(invariant)), "the simulation did not notice {unnoticed}");
}

/// The checker can fail: engines that count a downed member as down at once take over the shards
/// of a side that has not stopped yet.
#[test]
fn sim_gossip_catches_a_missing_down_margin() {
    let tweak: fn(&mut Params) = |p| {
        p.resolver = true;
        p.broken_margin = true;
        p.faults = p.faults.max(3);
    };
    assert_caught("no down margin", 300, 6_000, tweak, "G3", "a side taken over too early");
}

/// The checker can fail: engines that take a silent address for proof that its member is gone
/// down paused and partitioned members at once, while they run.
#[test]
fn sim_gossip_catches_silence_taken_for_death() {
    let tweak: fn(&mut Params) = |p| {
        p.resolver = true;
        p.broken_proof = true;
        p.faults = p.faults.max(3);
    };
    assert_caught("silence taken for death", 300, 3_000, tweak, "G3", "a silent member taken for gone");
}

/// The checker can fail: engines that host without a majority's answers run on while paused or
/// cut off, after the others took their shards over.
#[test]
fn sim_gossip_catches_a_member_that_hosts_without_a_majority() {
    let tweak: fn(&mut Params) = |p| {
        p.resolver = true;
        p.broken_hosting = true;
        p.faults = p.faults.max(3);
    };
    assert_caught("hosting without a majority", 300, 3_000, tweak, "G3", "a paused or cut-off member running on");
}

/// The checker can fail: engines that never repeat their status leave members that joined later
/// without it (they stay `Joining` there), and the simulation must see it.
#[test]
fn sim_gossip_catches_a_status_told_only_once() {
    let tweak: fn(&mut Params) = |p| {
        p.broken_status = true;
        p.faults = p.faults.max(3);
    };
    assert_caught("status told only once", 200, 2_000, tweak, "G2", "members left joining");
}

/// Same seed, same run.
#[test]
fn sim_gossip_is_deterministic() {
    for seed in [7, 123, 4711] {
        let a = run_one(Params::random(seed), false);
        let b = run_one(Params::random(seed), false);
        assert_eq!(a.1, b.1, "seed {seed} ran differently twice");
        assert!(a.2 > 100, "seed {seed} ran only {} steps", a.2);
    }
}
