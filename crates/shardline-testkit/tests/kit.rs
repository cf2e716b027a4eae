//! The kit on the example's counters: the correct one holds over many schedules, and the one
//! that keeps its total outside its journal is caught.

#[allow(dead_code)] // Its `main` is the example's.
#[path = "../../../examples/testkit.rs"]
mod example;

use std::marker::PhantomData;

use example::{CachingCounter, Counter, CounterModel};
use shardline_testkit::Simulation;

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
