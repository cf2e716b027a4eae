//! Testing your own entity type under faults with `shardline-testkit`: a model of what a
//! counter must answer, the real counter run on a simulated cluster that crashes, pauses,
//! partitions and loses journal answers, and the linearizability check of what its clients saw.
//!
//! Two counters are checked. `Counter` keeps its total in its events: the kit finds nothing.
//! `CachingCounter` keeps the total in a field that `decide` updates and `apply` does not: every
//! answer is right until its entity recovers from its journal on another node (after a crash,
//! a move), and from then on it answers a total that lost what came before. The kit catches it
//! and prints the seed that replays it.
//!
//! ```sh
//! cargo run --release -p shardline-testkit --example testkit
//! ```

use std::cell::Cell;
use std::marker::PhantomData;

use serde::{Deserialize, Serialize};
use shardline::{EntityId, EntitySettings, EventSourced};
use shardline_testkit::{Model, Rng, Simulation};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum CounterCmd {
    Add(u64),
    Get,
}

#[derive(Serialize, Deserialize)]
pub struct Added(u64);

/// A counter whose total is the fold of its events.
#[derive(Serialize, Deserialize)]
pub struct Counter {
    total: u64,
}

impl EventSourced for Counter {
    type Command = CounterCmd;
    type Event = Added;
    type Reply = u64;
    const EVENT_TYPE: &'static str = "counter";

    fn empty(_: &EntityId) -> Self {
        Counter { total: 0 }
    }

    fn apply(&mut self, Added(n): &Added) {
        self.total += n;
    }

    fn decide(&self, command: CounterCmd) -> (Vec<Added>, u64) {
        match command {
            CounterCmd::Add(n) => (vec![Added(n)], self.total + n),
            CounterCmd::Get => (vec![], self.total),
        }
    }
}

/// The bug: the total lives in a cell that `decide` moves, and the events only record the adds.
/// Nothing rebuilds it from the journal.
#[derive(Serialize, Deserialize)]
pub struct CachingCounter {
    total: Cell<u64>,
}

impl EventSourced for CachingCounter {
    type Command = CounterCmd;
    type Event = Added;
    type Reply = u64;
    const EVENT_TYPE: &'static str = "counter";

    fn empty(_: &EntityId) -> Self {
        CachingCounter { total: Cell::new(0) }
    }

    fn apply(&mut self, _: &Added) {}

    fn decide(&self, command: CounterCmd) -> (Vec<Added>, u64) {
        match command {
            CounterCmd::Add(n) => {
                self.total.set(self.total.get() + n);
                (vec![Added(n)], self.total.get())
            }
            CounterCmd::Get => (vec![], self.total.get()),
        }
    }
}

/// What any counter must answer: the sum of the adds so far.
pub struct CounterModel<E>(pub PhantomData<fn() -> E>);

impl<E: EventSourced<Command = CounterCmd, Reply = u64>> Model for CounterModel<E> {
    type Entity = E;
    type State = u64;

    fn settings(&self) -> EntitySettings {
        EntitySettings::new("counter")
    }

    fn initial(&self) -> u64 {
        0
    }

    fn command(&self, rng: &mut Rng) -> CounterCmd {
        if rng.chance(60) {
            CounterCmd::Add(1 + rng.below(9))
        } else {
            CounterCmd::Get
        }
    }

    fn read(&self) -> CounterCmd {
        CounterCmd::Get
    }

    fn step(&self, total: &mut u64, command: &CounterCmd) -> u64 {
        if let CounterCmd::Add(n) = command {
            *total += n;
        }
        *total
    }
}

fn main() {
    let good = Simulation::new(CounterModel::<Counter>(PhantomData)).schedules(8).run();
    println!("Counter: {good}");
    let caching = Simulation::new(CounterModel::<CachingCounter>(PhantomData)).schedules(8).run();
    println!("CachingCounter: {caching}");
    if !good.holds() {
        eprintln!("the correct counter broke an invariant");
        std::process::exit(1);
    }
    if caching.holds() {
        eprintln!("the kit did not catch the counter that keeps its total outside its journal");
        std::process::exit(1);
    }
    println!("the kit caught the counter that keeps its total outside its journal");
}
