//! The kit on the example's counters: the correct one holds over many schedules, and the one
//! that keeps its total outside its journal is caught.

#[allow(dead_code)] // Its `main` is the example's.
#[path = "../../../examples/testkit.rs"]
mod example;

use std::marker::PhantomData;

use example::{CachingCounter, Counter, CounterModel};
use shardline_testkit::{Mode, Simulation};

/// Also the check of `EventSourcedHandle::ask_retrying`'s verdict, which the kit's clients use:
/// when it reported the last attempt's "not processed" after an earlier attempt had timed out,
/// about one schedule in six of these failed (a write counted as not applied showed in reads).
#[test]
fn a_counter_that_keeps_its_total_in_its_events_holds() {
    let report = Simulation::new(CounterModel::<Counter>(PhantomData)).schedules(60).run();
    println!("{report}");
    assert!(report.holds(), "{report}");
    assert!(report.operations() > 60 * 100, "the clients asked too little to prove anything");
}

#[test]
fn a_counter_that_keeps_its_total_outside_its_journal_is_caught() {
    let report = Simulation::new(CounterModel::<CachingCounter>(PhantomData)).schedules(8).run();
    println!("{report}");
    let caught = report.failed().flat_map(|s| &s.violations).any(|v| v.starts_with("(c)"));
    assert!(caught, "{report}");
}

/// On gossip membership (the keep-majority resolver): the same checks; an entity slow to answer
/// after the heal is a finding, not a violation (see `Simulation`).
#[test]
fn a_counter_on_gossip_holds() {
    let report = Simulation::new(CounterModel::<Counter>(PhantomData)).membership(Mode::Gossip).schedules(30).run();
    println!("{report}");
    assert!(report.holds(), "{report}");
    assert!(report.schedules.iter().all(|s| s.mode == Mode::Gossip));
}

/// A schedule replays: the same seed gives the same operations and the same findings.
#[test]
fn a_seed_replays_its_schedule() {
    let sim = Simulation::new(CounterModel::<CachingCounter>(PhantomData));
    let seed = shardline_testkit::runner::fresh_base();
    let first = sim.replay(seed);
    let again = sim.replay(seed);
    assert!(!first.violations.is_empty(), "the caching counter is caught");
    assert_eq!((first.operations, &first.violations), (again.operations, &again.violations), "seed {seed}");
}
