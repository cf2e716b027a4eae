//! The real runtime in a deterministic simulation: nodes built with the public builder, with
//! their real drivers, shard hosts, entity tasks and membership providers (leases over a shared
//! in-memory store with the split-brain race, or gossip with the keep-majority resolver), on a
//! simulated network and clock, all on one thread per schedule.
//!
//! Faults: crashes and restarts as new incarnations, symmetric and one-way partitions, loss (as
//! TCP makes it: delays), reset connections, a node paused past failure detection, journal
//! outages, slow commits and commits whose answer is lost, coordination-store outages, graceful
//! leaves and joins. After every schedule: (a) no two instances of one account decide commands
//! at once, on either membership and under every fault (gossip hosts only while a majority
//! answers it, as a lease provider hosts only while its lease lasts); (b) every acknowledged write is in the journal exactly
//! once and nothing answered "not applied" is, and no entity had a request refused by the
//! journal as applied already behind its instance's back; (c) reads are linearizable per account (the
//! history checker of `shardline check`); (d) every account answers within 40 s of the heal.
//!
//! Seeds are drawn fresh on every run and printed. `SHARDLINE_SIM_RUNTIME_SCHEDULES` raises the
//! count above its floor of 1,000, never below; `SHARDLINE_SIM_SEED=S cargo test --release
//! --all-features -p shardline-cli --test sim_runtime sim_runtime_replay -- --nocapture` replays
//! one schedule with its trace.

//! The world, its network, journal faults, schedules and runner are the test kit's
//! (`shardline-testkit`), which runs users' entity types the same way.

mod checks;
mod clients;

use std::time::Instant;

use shardline::sabotage::Sabotage;
use shardline_testkit::runner::{fresh_base, on_own_thread, run_seeds};
use shardline_testkit::schedule::{FaultMix, Mode, Schedule};
use shardline_testkit::{observed, world};

const FLOOR: u64 = 1_000;

fn schedules() -> u64 {
    let asked = std::env::var("SHARDLINE_SIM_RUNTIME_SCHEDULES").ok().and_then(|s| s.parse().ok()).unwrap_or(FLOOR);
    asked.max(FLOOR)
}

fn replay_line(seed: u64) -> String {
    format!("SHARDLINE_SIM_SEED={seed} cargo test --release --all-features -p shardline-cli --test sim_runtime sim_runtime_replay -- --nocapture")
}

/// Runs one schedule on a thread of its own (the world's thread-locals start empty) and
/// returns its violations, a panic among them.
fn run_one(sched: Schedule, sab: Sabotage, tracing: bool) -> (u64, Vec<String>, Vec<String>, u64) {
    let seed = sched.seed;
    let ran = on_own_thread(seed, move || {
        shardline::sabotage::set(sab);
        let accounts = clients::Accounts::default();
        let o = world::run(sched.clone(), &accounts, tracing);
        shardline::sabotage::set(Sabotage::None);
        let run = checks::Outcome {
            history: accounts.history(o.end_ms),
            decided: o.decided,
            journal_ops: clients::read_journal(&o.journal),
            unanswered: o.unanswered,
            unknown_duplicates: o.unknown_duplicates,
        };
        let (reads, mut v) = checks::all(&sched, &run);
        v.extend(observed::take_panics().into_iter().map(|p| format!("panicked: {p}")));
        (reads, v, o.trace, o.steps)
    });
    match ran {
        Ok(r) => r,
        Err(p) => (0, vec![format!("panicked: {p}")], Vec::new(), 0),
    }
}

#[test]
fn sim_runtime_schedules_keep_invariants() {
    let n = schedules();
    let base = std::env::var("SHARDLINE_SIM_BASE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(fresh_base);
    println!("base seed {base}");
    let started = Instant::now();
    let results: Vec<(u64, u64, Vec<String>)> = run_seeds(
        n,
        base,
        |seed| {
            let (reads, v, _, _) = run_one(Schedule::draw(seed, FaultMix::ALL, None), Sabotage::None, false);
            (reads, v)
        },
        replay_line,
    )
    .into_iter()
    .map(|(seed, (reads, v))| (seed, reads, v))
    .collect();
    let secs = started.elapsed().as_secs_f64();
    let reads: u64 = results.iter().map(|r| r.1).sum();
    // Gossip's liveness findings are printed and counted, and fail nothing (see `checks::all`).
    let slow: Vec<(u64, usize)> = results
        .iter()
        .map(|(seed, _, v)| (*seed, v.iter().filter(|x| x.starts_with(checks::LIVENESS)).count()))
        .filter(|(_, n)| *n > 0)
        .collect();
    for (seed, n) in &slow {
        println!(
            "  seed {seed}: gossip, {n} accounts did not answer within 40 s of the heal (a finding, not a failure)"
        );
    }
    let results: Vec<(u64, u64, Vec<String>)> = results
        .into_iter()
        .map(|(seed, reads, v)| (seed, reads, v.into_iter().filter(|x| !x.starts_with(checks::LIVENESS)).collect()))
        .collect();
    let failed: Vec<(u64, u64, Vec<String>)> = results.iter().filter(|r| !r.2.is_empty()).cloned().collect();
    for (seed, _, v) in &failed {
        println!("  seed {seed}: {}", v.join("; "));
        println!("    replay: {}", replay_line(*seed));
    }
    let violations: usize = failed.iter().map(|r| r.2.len()).sum();
    println!(
        "simulated {} runtime schedules, {violations} violations ({reads} reads checked, {:.1} schedules/s; {} gossip schedules slow to serve after the heal)",
        results.len(),
        results.len() as f64 / secs,
        slow.len()
    );
    assert_eq!(results.len() as u64, n, "every schedule ran");
    assert!(reads > 0, "no read was checked");
    assert!(failed.is_empty(), "{} schedules broke an invariant", failed.len());
}

/// Replays the schedule of `SHARDLINE_SIM_SEED` with its trace; does nothing without it. With
/// `SHARDLINE_SIM_CATCH=<name>` (a case of [`CATCHES`]), it replays a schedule of that case:
/// its broken runtime, its faults and its membership.
#[test]
fn sim_runtime_replay() {
    let Some(seed) = std::env::var("SHARDLINE_SIM_SEED").ok().and_then(|s| s.parse().ok()) else { return };
    // The nodes' own logs, each line under its host's span: SHARDLINE_SIM_LOG=debug for more.
    let filter = std::env::var("SHARDLINE_SIM_LOG").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).without_time().with_test_writer().try_init();
    let catch = std::env::var("SHARDLINE_SIM_CATCH").ok();
    let (sched, sab) = match catch.as_deref() {
        None => (Schedule::draw(seed, FaultMix::ALL, None), Sabotage::None),
        Some(name) => match CATCHES.iter().find(|c| c.name == name) {
            Some(c) => (Schedule::draw(seed, c.mix, Some(c.mode)), c.sabotage),
            None => panic!("SHARDLINE_SIM_CATCH={name}: no such case ({:?})", CATCHES.map(|c| c.name)),
        },
    };
    println!("seed {seed}: {:?}, {} nodes, runtime broken as {sab:?}", sched.mode, sched.nodes);
    let (reads, v, trace, steps) = run_one(sched, sab, true);
    for l in trace {
        println!("{l}");
    }
    println!("{steps} steps, {reads} reads checked");
    for x in &v {
        println!("VIOLATION {x}");
    }
    assert!(v.is_empty());
}

/// A runtime broken on purpose, the faults and membership under which the checks must catch it,
/// and the check that must.
struct Catch {
    name: &'static str,
    sabotage: Sabotage,
    mix: FaultMix,
    mode: Mode,
    /// The start of the violation it must cause: the check's label.
    expect: &'static str,
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

const CATCHES: [Catch; 5] = [
    Catch {
        name: "ignore_lease",
        sabotage: Sabotage::IgnoreLease,
        mix: FaultMix { pauses: true, ..QUIET },
        mode: Mode::Leases,
        expect: "(a)",
    },
    Catch {
        name: "gossip_ignores_its_majority",
        sabotage: Sabotage::IgnoreLease,
        mix: FaultMix { pauses: true, ..QUIET },
        mode: Mode::Gossip,
        expect: "(a)",
    },
    Catch {
        name: "skip_request_id_lookup",
        sabotage: Sabotage::SkipRequestIdLookup,
        mix: FaultMix { journal: true, ..QUIET },
        mode: Mode::Leases,
        expect: "(b)",
    },
    Catch {
        name: "ack_before_commit",
        sabotage: Sabotage::AckBeforeCommit,
        mix: FaultMix { journal: true, ..QUIET },
        mode: Mode::Leases,
        expect: "(b)",
    },
    Catch {
        name: "forget_replies",
        sabotage: Sabotage::ForgetReplies,
        mix: FaultMix { journal: true, ..QUIET },
        mode: Mode::Leases,
        expect: "(b) the journal refused",
    },
];

/// Runs schedules of the case `name` until one breaks the invariant it must; fails when none does
/// in `tries` schedules.
fn caught(name: &str, tries: u64) {
    let Some(c) = CATCHES.iter().find(|c| c.name == name) else { panic!("no case {name}") };
    let base = fresh_base();
    for i in 0..tries {
        let seed = base.wrapping_add(i);
        let (_, v, _, _) = run_one(Schedule::draw(seed, c.mix, Some(c.mode)), c.sabotage, false);
        if let Some(x) = v.iter().find(|x| x.starts_with(c.expect)) {
            println!("{:?} caught by seed {seed} (try {}): {x}", c.sabotage, i + 1);
            println!("  replay: SHARDLINE_SIM_CATCH={name} SHARDLINE_SIM_SEED={seed} cargo test --release --all-features -p shardline-cli --test sim_runtime sim_runtime_replay -- --nocapture");
            // The control: the same schedule on the runtime as shipped breaks nothing, so the
            // violation is the broken guard's.
            let (_, clean, _, _) = run_one(Schedule::draw(seed, c.mix, Some(c.mode)), Sabotage::None, false);
            assert!(clean.is_empty(), "seed {seed} breaks an invariant without {:?} too: {clean:?}", c.sabotage);
            return;
        }
    }
    panic!("{:?} was not caught by {tries} schedules from base seed {base}", c.sabotage);
}

#[test]
fn sim_runtime_catches_a_runtime_that_ignores_its_lease() {
    caught("ignore_lease", 20);
}

/// Gossip's bound: a paused node that processes what it finds when it wakes, whether or not a
/// majority answered it lately, decides commands beside the instance that took over.
#[test]
fn sim_runtime_catches_a_gossip_node_that_ignores_its_majority() {
    caught("gossip_ignores_its_majority", 300);
}

#[test]
fn sim_runtime_catches_a_runtime_that_skips_the_request_id_lookup() {
    caught("skip_request_id_lookup", 20);
}

#[test]
fn sim_runtime_catches_a_runtime_that_acknowledges_before_the_commit() {
    caught("ack_before_commit", 20);
}

/// The watch behind the journal's own refusal: an instance that does not know a request it
/// applied (its state is not the journal's) is counted, though nothing is applied twice.
#[test]
fn sim_runtime_catches_an_instance_that_does_not_know_its_replies() {
    caught("forget_replies", 20);
}
