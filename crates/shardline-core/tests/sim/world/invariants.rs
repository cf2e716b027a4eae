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

impl World {
    /// No coordinator begins a hand-off towards or from a member its view holds unreachable.
    pub(super) fn check_hand_offs_reachable(&mut self) {
        let mut seen = BTreeMap::new();
        for n in self.nodes.values().filter(|n| n.alive) {
            let Some(c) = n.coordinator.as_ref() else { continue };
            let now: BTreeSet<(ShardId, NodeId, NodeId)> =
                c.hand_off_moves().map(|(s, f, t)| (s, f.clone(), t.clone())).collect();
            let before = self.hand_offs_seen.get(&n.id);
            for (shard, from, to) in &now {
                if before.is_some_and(|b| b.contains(&(*shard, from.clone(), to.clone()))) {
                    continue;
                }
                if !self.view.is_reachable(from) || !self.view.is_reachable(to) {
                    let msg = format!(
                        "t={} reach: {} began a hand-off of {shard} from {from} to {to} with an unreachable end",
                        self.now, n.id
                    );
                    self.ledger.violations.push(msg);
                }
            }
            seen.insert(n.id.clone(), now);
        }
        self.hand_offs_seen = seen;
    }
}
