//! The world's membership: the lease store's view, the leader it elects, and nodes that leave.

use super::*;

impl World {
    /// The lease store's view changed: elect, tell the coordinator and every region.
    pub(super) fn membership_changed(&mut self) {
        let want = self.view.oldest_up().map(|m| m.node.clone());
        if want != self.leader {
            if let Some(old) = self.leader.take() {
                let stale = self.p.stale_leaders && self.nodes.get(&old).is_some_and(|n| n.alive && !n.fenced);
                if stale {
                    // It has not noticed yet: it coordinates on until its lease deadline, or
                    // until a map write of its is refused.
                    let term = self.term;
                    self.log(|| format!("{old} keeps coordinating term {term} (stale)"));
                    let at = self.now + STALE_LEADER_MS;
                    self.schedule(at, Ev::LeaderDeadline { node: old.clone(), term });
                } else if let Some(n) = self.nodes.get_mut(&old) {
                    if let Some(c) = n.coordinator.as_mut() {
                        c.handle_leadership_lost(self.now);
                    }
                    n.coordinator = None;
                }
            }
            if let Some(l) = want.clone() {
                self.term += 1;
                let _ = self.view.set_leader(Some(l.clone()));
                let mut cc = CoordinatorConfig::new(self.p.shards);
                cc.hand_off_timeout_ms = 1_000;
                cc.resend_interval_ms = 200;
                cc.rebalance_interval_ms = 1_000;
                #[cfg(feature = "fault-injection")]
                {
                    cc.fault_skip_wait_for_shard_stopped = self.p.broken_hand_off;
                    cc.fault_ignore_reachability = self.p.broken_reachability;
                }
                let strategy = self.strategy();
                let c = CoordinatorEngine::new(
                    cc,
                    l.clone(),
                    self.term,
                    strategy,
                    self.view.clone(),
                    self.store.clone(),
                    self.now,
                );
                if let (Ok(c), Some(n)) = (c, self.nodes.get_mut(&l)) {
                    n.coordinator = Some(c);
                }
                self.leader = Some(l.clone());
                self.log(|| format!("leader {l} term {}", self.term));
                let ids: Vec<NodeId> = self.alive_ids();
                for id in ids {
                    let now = self.now;
                    if let Some(n) = self.nodes.get_mut(&id) {
                        n.region.handle_coordinator_changed(now, l.clone(), self.term);
                    }
                    self.pump(&id);
                }
            }
        } else if let Some(l) = self.leader.clone() {
            let (now, view) = (self.now, self.view.clone());
            if let Some(c) = self.nodes.get_mut(&l).and_then(|n| n.coordinator.as_mut()) {
                c.handle_membership(now, &view);
            }
            self.pump(&l);
        }
        // Stale leaders still follow the membership, as a provider that has not told them they
        // lost leadership would: they allocate shards of failed nodes, and write the map.
        let stale: Vec<NodeId> = self
            .nodes
            .values()
            .filter(|n| n.alive && !n.fenced && Some(&n.id) != self.leader.as_ref() && n.coordinator.is_some())
            .map(|n| n.id.clone())
            .collect();
        for id in stale {
            let (now, view) = (self.now, self.view.clone());
            if let Some(c) = self.nodes.get_mut(&id).and_then(|n| n.coordinator.as_mut()) {
                c.handle_membership(now, &view);
            }
            self.pump(&id);
        }
    }

    /// Leaving nodes exit once they host nothing, hold nothing and nothing they sent is in flight.
    pub(super) fn check_leavers(&mut self) {
        let leader_map = self
            .leader
            .as_ref()
            .and_then(|l| self.nodes.get(l))
            .and_then(|n| n.coordinator.as_ref())
            .map(|c| c.shard_map().clone());
        let leavers: Vec<NodeId> =
            self.nodes.values().filter(|n| n.alive && !n.fenced && n.leaving).map(|n| n.id.clone()).collect();
        for id in leavers {
            let owns = leader_map.as_ref().is_none_or(|m| m.shards_of(&id).next().is_some());
            let n = self.nodes.get_mut(&id).expect("node exists");
            if owns || !n.region.hosted().is_empty() || !n.region.is_quiet() || !n.entities.is_empty() {
                continue;
            }
            if !n.settling {
                n.settling = true;
                n.region.flush_all(self.now);
                self.pump(&id);
                continue;
            }
            if n.region.is_settled() {
                let _ = self.view.set_status(&id, MemberStatus::Exiting);
                let _ = self.view.set_status(&id, MemberStatus::Removed);
                self.kill(&id, true);
                self.membership_changed();
            }
        }
    }
}
