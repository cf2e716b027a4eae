//! What a schedule is: the membership it runs on and the faults it injects, drawn from its seed.

use super::rng::Rng;

/// Faults happen from this time (ms) until a second before the heal.
const FAULTS_FROM: u64 = 3_000;
/// Every fault is undone, every host resumed or restarted, at this time (ms).
pub const HEAL_AT: u64 = 24_000;
/// Every account answers within this long after the heal.
pub const ANSWER_WITHIN: u64 = 40_000;

/// The membership a schedule runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Leases over an in-memory store shared by the hosts, with the split-brain race.
    Leases,
    /// Gossip with the keep-majority resolver.
    Gossip,
}
/// What a fault did, for the trace and the report.
#[derive(Clone, Debug)]
///
/// Hosts are numbered from 0; `for_ms` is how long the fault lasts (at most until the heal).
#[allow(missing_docs)] // The fields are named for what they are.
pub enum Fault {
    /// The host's process dies (its runtime is dropped) and starts again as a new incarnation.
    Crash { host: usize, for_ms: u64 },
    /// The host stops running, then wakes with its clock jumped and its timers all due.
    Pause { host: usize, for_ms: u64 },
    /// The hosts in `side` are cut off from the others, both ways.
    Partition { side: Vec<usize>, for_ms: u64 },
    /// Bytes from `from` to `to` are held (TCP retransmits them) until it heals.
    OneWay { from: usize, to: usize, for_ms: u64 },
    /// Every chunk on the wire takes up to `ms` longer.
    Jitter { ms: u64, for_ms: u64 },
    /// The connections between two hosts are reset.
    Reset { a: usize, b: usize },
    /// The journal refuses every call.
    JournalDown { for_ms: u64 },
    /// Every append takes `ms` before it commits.
    SlowCommits { ms: u64, for_ms: u64 },
    /// `pct` percent of the appends commit and answer `CommitUnknown`.
    CommitUnknown { pct: u64, for_ms: u64 },
    /// The coordination store (leases) refuses every call.
    StoreDown { for_ms: u64 },
    /// The host's node leaves gracefully; its process restarts afterwards.
    Leave { host: usize, for_ms: u64 },
    /// A new host starts and joins.
    Join { host: usize },
}

/// Which faults a schedule may draw.
#[derive(Clone, Copy, Debug)]
pub struct FaultMix {
    /// [`Fault::Crash`].
    pub crashes: bool,
    /// [`Fault::Pause`].
    pub pauses: bool,
    /// [`Fault::Partition`] and [`Fault::OneWay`].
    pub partitions: bool,
    /// [`Fault::Jitter`] and [`Fault::Reset`].
    pub network: bool,
    /// [`Fault::JournalDown`], [`Fault::SlowCommits`] and [`Fault::CommitUnknown`].
    pub journal: bool,
    /// [`Fault::StoreDown`] (with leases).
    pub store: bool,
    /// [`Fault::Leave`] and [`Fault::Join`].
    pub membership_changes: bool,
}

impl FaultMix {
    /// Every fault.
    pub const ALL: FaultMix = FaultMix {
        crashes: true,
        pauses: true,
        partitions: true,
        network: true,
        journal: true,
        store: true,
        membership_changes: true,
    };
}

/// What a schedule is.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// What it was drawn from.
    pub seed: u64,
    /// Its membership.
    pub mode: Mode,
    /// (at ms, fault), in time order.
    pub faults: Vec<(u64, Fault)>,
    /// Nodes started at time 0 (a `Join` starts one more).
    pub nodes: usize,
}

impl Schedule {
    /// The schedule of `seed`, with faults of `mix`, on `mode` (or one drawn from the seed).
    pub fn draw(seed: u64, mix: FaultMix, mode: Option<Mode>) -> Schedule {
        let mut rng = Rng::new(seed);
        let mode = mode.unwrap_or(if rng.chance(50) { Mode::Leases } else { Mode::Gossip });
        let nodes = 3;
        let mut kinds: Vec<u64> = Vec::new();
        let mut allow = |on: bool, ks: &[u64]| {
            if on {
                kinds.extend_from_slice(ks)
            }
        };
        allow(mix.crashes, &[0]);
        allow(mix.pauses, &[1]);
        allow(mix.partitions, &[2, 3]);
        allow(mix.network, &[4, 5]);
        allow(mix.journal, &[6, 7, 8]);
        allow(mix.store && mode == Mode::Leases, &[9]);
        allow(mix.membership_changes, &[10, 11]);
        let mut faults = Vec::new();
        let mut at = FAULTS_FROM;
        let mut joined = false;
        while !kinds.is_empty() {
            at += 500 + rng.below(4_000);
            if at >= HEAL_AT - 1_000 {
                break;
            }
            let for_ms = 500 + rng.below(7_500);
            let host = rng.below(nodes as u64) as usize;
            let other = (host + 1 + rng.below(nodes as u64 - 1) as usize) % nodes;
            let fault = match kinds[rng.below(kinds.len() as u64) as usize] {
                0 => Fault::Crash { host, for_ms },
                // Half the pauses outlast the others' takeover (about 15 s with gossip at the
                // world's 2 s window, 3 s with leases): the paused host wakes up with queued work
                // and shards owned elsewhere (unless the heal at 24 s wakes it first).
                1 if rng.chance(50) => Fault::Pause { host, for_ms: 15_000 + rng.below(6_000) },
                1 => Fault::Pause { host, for_ms },
                2 => Fault::Partition { side: vec![host], for_ms },
                3 => Fault::OneWay { from: host, to: other, for_ms },
                4 => Fault::Jitter { ms: 20 + rng.below(300), for_ms },
                5 => Fault::Reset { a: host, b: other },
                6 => Fault::JournalDown { for_ms: for_ms.min(3_000) },
                7 => Fault::SlowCommits { ms: 50 + rng.below(1_500), for_ms },
                8 => Fault::CommitUnknown { pct: 10 + rng.below(40), for_ms },
                9 => Fault::StoreDown { for_ms: for_ms.min(2_500) },
                10 => Fault::Leave { host, for_ms },
                _ if !joined => {
                    joined = true;
                    Fault::Join { host: nodes }
                }
                // One join per schedule; a membership change after it is a leave.
                _ => Fault::Leave { host, for_ms },
            };
            faults.push((at, fault));
        }
        Schedule { seed, mode, faults, nodes }
    }
}
