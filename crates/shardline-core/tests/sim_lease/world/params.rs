//! The shape of one schedule, drawn from its seed.

use shardline_core::lease::PeerChecks;

use super::super::rng::Rng;

/// The shape of one schedule.
#[derive(Clone, Debug)]
pub struct Params {
    pub seed: u64,
    pub nodes: usize,
    pub ttl_ms: u64,
    pub margin_ms: u64,
    pub latency_ms: u64,
    pub lost_answers: f64,
    pub faults: usize,
    pub active_ms: u64,
    /// An engine that counts its lease from the answer instead of the request.
    pub broken_lease_start: bool,
    /// Keep-alives and the split-brain race.
    pub peer_checks: Option<PeerChecks>,
    /// Only partitions between nodes, each long enough to be resolved: L4 is checked at its end.
    pub partitions_only: bool,
    /// Breaks the engines: their stable window never ends, so nobody races.
    pub never_resolve: bool,
}

impl Params {
    pub fn random(seed: u64) -> Self {
        let mut r = Rng::new(seed ^ 0x1EA5E);
        let ttl_ms = r.range(600, 3_000);
        Params {
            seed,
            nodes: r.range(1, 6) as usize,
            ttl_ms,
            margin_ms: r.range(100, ttl_ms / 3),
            // Latency well below the TTL, as a store's is: a sixth of the TTL is what a write may take.
            latency_ms: r.range(1, (ttl_ms / 16).min(80)),
            lost_answers: if r.chance(0.5) { 0.0 } else { 0.03 },
            faults: r.range(0, 8) as usize,
            active_ms: r.range(3_000, 12_000),
            broken_lease_start: false,
            peer_checks: None,
            partitions_only: false,
            never_resolve: false,
        }
        .with_peer_checks(&mut r)
    }

    fn with_peer_checks(mut self, r: &mut Rng) -> Self {
        if r.chance(0.5) {
            let ttl = self.ttl_ms;
            let every_ms = r.range(ttl / 10, ttl / 4);
            self.peer_checks = Some(PeerChecks {
                every_ms,
                unreachable_after_ms: every_ms * r.range(3, 6),
                stable_after_ms: r.range(ttl / 3, 2 * ttl),
                acquire_delay_ms: r.range(ttl / 4, ttl),
            });
            self.partitions_only = r.chance(0.5);
            if self.partitions_only {
                self.nodes = self.nodes.max(2);
                self.faults = self.faults.clamp(1, 3);
                self.active_ms = self.active_ms.max(self.faults as u64 * self.resolve_within() * 2);
            }
        }
        self
    }

    /// How long a symmetric partition may take to resolve: silence noticed, the stable window,
    /// the slowest side's delay, the claim, the flag's renewal and listing, the downed side's
    /// exit and the winners' listing, with room for the store's latency.
    pub fn resolve_within(&self) -> u64 {
        let Some(c) = &self.peer_checks else { return 0 };
        c.unreachable_after_ms
            + c.every_ms
            + c.stable_after_ms
            + c.acquire_delay_ms * self.nodes as u64
            + 3 * self.ttl_ms
    }
}
