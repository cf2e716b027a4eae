//! Test your own entity types under faults, deterministically.
//!
//! The kit runs your event-sourced entity type on a simulated cluster: three real Shardline
//! nodes (the public builder, their drivers, shard hosts, entity tasks and membership) and a
//! client node, on a simulated network and a paused clock that a world moves, all on one
//! thread. Each schedule, drawn from a seed, crashes and restarts nodes, pauses them past
//! failure detection, cuts links, resets connections, takes the journal down, slows its commits
//! and loses their answers, takes the coordination store down, and has nodes leave and join;
//! then it heals everything. Your clients' commands come from your [`Model`], and what they saw
//! is checked against it (see [`Simulation`] for the checks).
//!
//! It is the simulation that proves the runtime itself (the repository's runtime simulation
//! runs the demo's accounts on this same world), so a bug it finds in your entity is one a real
//! cluster can hit: an entity that keeps state outside its journal, a reply that depends on
//! which node answers, a command that is not idempotent under its request id.
//!
//! Seeds are fresh on every run; a failure prints the seed, and [`Simulation::replay`] runs
//! that schedule again with its trace.
//!
//! ```no_run
//! use shardline_testkit::{Model, Simulation};
//!
//! fn check_my_entity(model: impl Model) {
//!     let report = Simulation::new(model).schedules(20).run();
//!     assert!(report.holds(), "{report}");
//! }
//! ```
//!
//! `examples/testkit.rs` models a counter, checks a correct one, and catches one that keeps
//! part of its state outside its journal.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod checks;
pub mod faulty;
pub mod linearizable;
mod model;
pub mod net;
pub mod observed;
mod rng;
pub mod runner;
pub mod schedule;
mod simulation;
pub mod world;

pub use checks::one_live_instance;
pub use model::{Asked, Command, Model, ModelOp, ModelWorkload, Reply};
pub use rng::Rng;
pub use schedule::{FaultMix, Mode};
pub use simulation::{Report, ScheduleReport, Simulation};
