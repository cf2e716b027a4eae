//! The shape of one schedule, drawn from its seed.

use super::super::rng::Rng;

/// The shape of one schedule.
#[derive(Clone, Debug)]
pub struct Params {
    pub seed: u64,
    pub nodes: usize,
    pub latency_ms: u64,
    pub loss: f64,
    /// The share of messages held up for 0.2–1.5 s (a starved process) while faults happen.
    pub stalls: f64,
    pub faults: usize,
    pub active_ms: u64,
    /// Engines that never repeat their status (members that joined later never learn it).
    pub broken_status: bool,
    /// Engines resolve partitions (`KeepMajority`), and the world makes partitions, one-way
    /// cuts and pauses; without a resolver, crashes, leaves and loss only.
    pub resolver: bool,
    /// The resolver's stable-after (and down margin).
    pub stable_after_ms: u64,
    /// Engines that count a downed member as down at once, without the margin that lets its
    /// side stop first.
    pub broken_margin: bool,
    /// Engines that take a member whose address does not answer for gone.
    pub broken_proof: bool,
    /// Engines that host whether or not a majority answers them.
    pub broken_hosting: bool,
}

impl Params {
    pub fn random(seed: u64) -> Self {
        let mut r = Rng::new(seed ^ 0x9055);
        Params {
            seed,
            nodes: r.range(2, 7) as usize,
            latency_ms: r.range(1, 30),
            loss: if r.chance(0.5) { 0.0 } else { 0.02 },
            stalls: if r.chance(0.5) { 0.0 } else { 0.03 },
            faults: r.range(0, 6) as usize,
            active_ms: r.range(5_000, 20_000),
            broken_status: false,
            resolver: r.chance(0.5),
            stable_after_ms: r.range(1_000, 5_000),
            broken_margin: false,
            broken_proof: false,
            broken_hosting: false,
        }
    }
}
