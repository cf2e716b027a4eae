//! The invariants checked after every step (I1) and after the quiet period (I2).

use super::*;

impl World {
    /// I1 for shards: at most one live node hosts each shard.
    pub(super) fn check_single_owner(&mut self) {
        for s in 0..self.p.shards {
            let shard = ShardId(s);
            let mut hosts = self.nodes.values().filter(|n| n.alive && !n.fenced && n.region.hosts(shard));
            if let (Some(a), Some(b)) = (hosts.next(), hosts.next()) {
                let msg = format!("t={} I1: {shard} hosted by {} and {}", self.now, a.id, b.id);
                self.ledger.violations.push(msg);
            }
        }
    }

    /// I2: after the quiet period every shard has a live, active home and no region holds anything.
    pub(super) fn check_homed(&mut self) {
        let Some(c) = self.leader.as_ref().and_then(|l| self.nodes.get(l)).and_then(|n| n.coordinator.as_ref()) else {
            self.ledger.violations.push("I2: no coordinator after the quiet period".into());
            return;
        };
        if c.is_recovering() {
            self.ledger.violations.push("I2: coordinator still recovering after the quiet period".into());
        }
        let map = c.shard_map().clone();
        for (shard, slot) in map.iter() {
            let ok = slot
                .owner
                .as_ref()
                .and_then(|o| self.nodes.get(o))
                .is_some_and(|n| n.alive && n.region.is_active(shard));
            if !ok {
                self.ledger.violations.push(format!("I2: {shard} not homed ({:?})", slot.owner));
            }
        }
        for n in self.nodes.values().filter(|n| n.alive && !n.fenced) {
            if n.region.buffered() > 0 {
                self.ledger.violations.push(format!("I2: {} still buffers {} messages", n.id, n.region.buffered()));
            }
        }
    }
}
