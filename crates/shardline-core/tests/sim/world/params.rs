//! The shape of one schedule, drawn from its seed.

use super::super::rng::Rng;

/// The shape of one schedule.
#[derive(Clone, Debug)]
pub struct Params {
    pub seed: u64,
    pub nodes: usize,
    pub shards: u32,
    pub entities: u32,
    pub clients: u32,
    pub active_ms: u64,
    pub quiet_ms: u64,
    pub faults: usize,
    pub drop_rate: f64,
    pub with_store: bool,
    pub strategy: usize,
    pub broken_hand_off: bool,
    /// A coordinator that plans as if every member were reachable.
    pub broken_reachability: bool,
    /// A leader that loses leadership keeps coordinating until its lease deadline or until a
    /// shard map write of its is refused for a newer term (schedules with a store only).
    pub stale_leaders: bool,
    /// The type is journaled and remembers its entities: each started shard is claimed, its
    /// entities read and woken at a pace, from a journal that sometimes cannot answer.
    pub remember: bool,
}

impl Params {
    pub fn random(seed: u64) -> Self {
        let mut r = Rng::new(seed ^ 0x5EED);
        Params {
            seed,
            nodes: r.range(2, 6) as usize,
            shards: r.range(4, 33) as u32,
            entities: r.range(10, 60) as u32,
            clients: r.range(1, 3) as u32,
            active_ms: r.range(1_000, 3_000),
            quiet_ms: 8_000,
            faults: r.range(0, 7) as usize,
            drop_rate: if r.chance(0.5) { 0.0 } else { 0.01 },
            with_store: r.chance(0.5),
            strategy: r.range(0, 4) as usize,
            broken_hand_off: false,
            broken_reachability: false,
            stale_leaders: false,
            remember: false,
        }
        .with_stale_leaders(&mut r)
        .with_remember(&mut r)
    }

    fn with_stale_leaders(mut self, r: &mut Rng) -> Self {
        // Drawn last, so that the draws above (and older seeds' schedules) stay as they were.
        self.stale_leaders = self.with_store && r.chance(0.5);
        self
    }

    fn with_remember(mut self, r: &mut Rng) -> Self {
        // Drawn after the stale leaders, for the same reason.
        self.remember = r.chance(0.5);
        self
    }
}
