//! [`Simulation`]: the user's entity type on a simulated cluster, schedule after schedule, and
//! the [`Report`] of what the checks found.

use std::fmt;
use std::sync::Arc;

use super::checks::one_live_instance;
use super::linearizable::{check, Verdict};
use super::model::{Model, ModelWorkload};
use super::observed::take_panics;
use super::runner::{fresh_base, on_own_thread, run_seeds};
use super::schedule::{FaultMix, Mode, Schedule, ANSWER_WITHIN};
use super::world;

/// Runs a [`Model`]'s entity type on a simulated cluster of three nodes and a client node, on
/// schedules of faults drawn from fresh seeds, and checks each one:
///
/// - **(a)** no two instances of one entity decide commands at once;
/// - **(b)** no request was refused by the journal as applied already behind its instance's back
///   (its state was not the journal's);
/// - **(c)** what the clients saw of each entity is linearizable against the model;
/// - **(d)** every entity answers within 40 s of the heal (with leases; with gossip it is a
///   finding, not a violation).
///
/// A schedule is 24 s of simulated time with faults (crashes and restarts, pauses past failure
/// detection, partitions, lost and reset connections, journal outages, slow commits and
/// commits whose answer is lost, a coordination-store outage, nodes that leave and join), then
/// a heal. It runs in about a second, all on one thread: the nodes are the real runtime on a
/// simulated network and clock.
///
/// ```no_run
/// use shardline_testkit::{Model, Simulation};
///
/// fn check_my_entity(model: impl Model) {
///     let report = Simulation::new(model).schedules(20).run();
///     assert!(report.holds(), "{report}");
/// }
/// ```
pub struct Simulation<M: Model> {
    model: Arc<M>,
    schedules: u64,
    base: Option<u64>,
    faults: FaultMix,
    membership: Mode,
    entities: usize,
    clients: usize,
    budget: u64,
}

impl<M: Model> Simulation<M> {
    /// Ten schedules of every fault, on leases, with three entities and four clients.
    pub fn new(model: M) -> Self {
        Simulation {
            model: Arc::new(model),
            schedules: 10,
            base: None,
            faults: FaultMix::ALL,
            membership: Mode::Leases,
            entities: 3,
            clients: 4,
            budget: 2_000_000,
        }
    }

    /// How many schedules to run (at least one).
    pub fn schedules(mut self, n: u64) -> Self {
        self.schedules = n.max(1);
        self
    }

    /// Runs the seeds from `base` instead of a fresh base: the same schedules again.
    pub fn base_seed(mut self, base: u64) -> Self {
        self.base = Some(base);
        self
    }

    /// The faults a schedule may draw.
    pub fn faults(mut self, mix: FaultMix) -> Self {
        self.faults = mix;
        self
    }

    /// The membership the nodes run on.
    pub fn membership(mut self, mode: Mode) -> Self {
        self.membership = mode;
        self
    }

    /// How many entities the clients ask (at least one).
    pub fn entities(mut self, n: usize) -> Self {
        self.entities = n.max(1);
        self
    }

    /// How many clients ask at once (at least one).
    pub fn clients(mut self, n: usize) -> Self {
        self.clients = n.max(1);
        self
    }

    /// The most states the linearizability search explores per entity before it calls the
    /// history undecided (a violation: a check that cannot decide proves nothing).
    pub fn search_budget(mut self, states: u64) -> Self {
        self.budget = states;
        self
    }

    /// Runs the schedules and checks each one.
    pub fn run(&self) -> Report {
        let base = self.base.unwrap_or_else(fresh_base);
        let replay = |seed| format!("Simulation::replay({seed})");
        let schedules =
            run_seeds(self.schedules, base, |seed| self.one(seed, false), replay).into_iter().map(|(_, r)| r).collect();
        Report { base_seed: base, schedules }
    }

    /// Runs the schedule of `seed` again, with the world's trace (faults and restores) and the
    /// nodes' logs under the host that wrote them (install a `tracing` subscriber to see them).
    pub fn replay(&self, seed: u64) -> ScheduleReport {
        self.one(seed, true)
    }

    fn one(&self, seed: u64, tracing: bool) -> ScheduleReport {
        let sched = Schedule::draw(seed, self.faults, Some(self.membership));
        let mode = sched.mode;
        let (model, entities, clients, budget) = (self.model.clone(), self.entities, self.clients, self.budget);
        let ran = on_own_thread(seed, move || {
            let workload = ModelWorkload::new(model.clone(), entities, clients);
            let o = world::run(sched, &workload, tracing);
            let mut violations: Vec<String> =
                one_live_instance(&o.decided).into_iter().map(|s| format!("(a) {s}")).collect();
            if o.unknown_duplicates > 0 {
                violations.push(format!(
                    "(b) the journal refused {} requests as applied already behind their instance's back",
                    o.unknown_duplicates
                ));
            }
            let mut operations = 0;
            for (entity, ops) in workload.history() {
                operations += ops.len();
                // An entity that never answered after the heal is checked too: its history
                // ends with operations of unknown outcome, which the search handles.
                match check(model.initial(), &ops, |s, c| model.step(s, c), budget) {
                    Verdict::Holds => {}
                    Verdict::Violated { placed, stuck } => violations.push(format!(
                        "(c) {entity}: not linearizable: no order places more than {placed} of its answered operations; then {stuck}"
                    )),
                    Verdict::Undecided(n) => violations.push(format!(
                        "(c) {entity}: undecided: the search gave up after {n} states ({} operations)",
                        ops.len()
                    )),
                }
            }
            let mut findings = Vec::new();
            for e in &o.unanswered {
                let s = format!("(d) {e} did not answer within {ANSWER_WITHIN} ms of the heal");
                if mode == Mode::Gossip {
                    findings.push(s)
                } else {
                    violations.push(s)
                }
            }
            violations.extend(take_panics().into_iter().map(|p| format!("panicked: {p}")));
            (violations, findings, operations, o.trace)
        });
        let (violations, findings, operations, trace) = match ran {
            Ok(r) => r,
            Err(p) => (vec![format!("panicked: {p}")], Vec::new(), 0, Vec::new()),
        };
        ScheduleReport { seed, mode, violations, findings, operations, trace }
    }
}

/// What one schedule found.
#[derive(Clone, Debug)]
pub struct ScheduleReport {
    /// Its seed: [`Simulation::replay`] runs it again.
    pub seed: u64,
    /// The membership it ran on.
    pub mode: Mode,
    /// What broke an invariant, each starting with its check's label.
    pub violations: Vec<String>,
    /// What is worth a look and fails nothing.
    pub findings: Vec<String>,
    /// Operations the clients asked.
    pub operations: usize,
    /// The world's trace, when replayed.
    pub trace: Vec<String>,
}

/// What a [`Simulation`] found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The first schedule's seed.
    pub base_seed: u64,
    /// Every schedule.
    pub schedules: Vec<ScheduleReport>,
}

impl Report {
    /// No schedule broke an invariant.
    pub fn holds(&self) -> bool {
        self.schedules.iter().all(|s| s.violations.is_empty())
    }

    /// The schedules that broke an invariant.
    pub fn failed(&self) -> impl Iterator<Item = &ScheduleReport> {
        self.schedules.iter().filter(|s| !s.violations.is_empty())
    }

    /// Operations asked in all.
    pub fn operations(&self) -> usize {
        self.schedules.iter().map(|s| s.operations).sum()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed = self.failed().count();
        writeln!(
            f,
            "{} schedules from base seed {}, {} operations checked, {failed} broke an invariant",
            self.schedules.len(),
            self.base_seed,
            self.operations()
        )?;
        for s in &self.schedules {
            for v in &s.violations {
                writeln!(f, "  seed {}: {v}", s.seed)?;
            }
            for x in &s.findings {
                writeln!(f, "  seed {} (finding): {x}", s.seed)?;
            }
            if !s.violations.is_empty() {
                writeln!(f, "    replay: Simulation::replay({})", s.seed)?;
            }
        }
        Ok(())
    }
}
