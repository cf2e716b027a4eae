//! Turning a strategy's plan into allocations and hand-offs.

use super::engine::CoordinatorEngine;
use crate::events::{DomainEvent, RebalanceReason};
use crate::membership::Member;

impl CoordinatorEngine {
    /// The members that may host: right status and role, and registered as hosting regions.
    pub fn hosts(&self) -> Vec<Member> {
        self.view.hosts(self.config.role.as_deref()).into_iter().filter(|m| self.hosting.contains(&m.node)).collect()
    }

    /// Asks the strategy for a plan and carries it out: shards without a live owner are
    /// allocated at once; others start a hand-off, one round at a time.
    ///
    /// Only reachable members are given shards, and no hand-off begins towards or from a member
    /// this node cannot reach (it could not complete). While the view is held
    /// ([`MembershipView::rebalance_hold`](crate::MembershipView::rebalance_hold): a member
    /// joining, or one unreachable), no shard moves away from a member that may still host it;
    /// unowned shards are placed and leaving members hand theirs over.
    pub(super) fn plan_and_apply(&mut self, now: u64) {
        self.rebalance_at = Some(now + self.config.rebalance_interval_ms);
        let reason = std::mem::replace(&mut self.rebalance_reason, RebalanceReason::Periodic);
        if self.stopped || self.recovery.is_some() {
            return;
        }
        #[cfg(feature = "fault-injection")]
        let ignore = self.config.fault_ignore_reachability;
        #[cfg(not(feature = "fault-injection"))]
        let ignore = false;
        let hosts: Vec<Member> =
            self.hosts().into_iter().filter(|m| ignore || self.view.is_reachable(&m.node)).collect();
        if hosts.is_empty() {
            return;
        }
        let role = self.config.role.clone();
        let held = !ignore && self.view.rebalance_hold(role.as_deref()).is_some();
        let plan = self.strategy.plan(&hosts, &self.map);
        let round_free = self.hand_offs.is_empty();
        let mut started = 0;
        for mv in plan.moves {
            if self.hand_offs.contains_key(&mv.shard) {
                continue;
            }
            match mv.from {
                Some(from) if !self.view.is_fenced(&from) => {
                    let ends_reachable = ignore || (self.view.is_reachable(&from) && self.view.is_reachable(&mv.to));
                    let rebalancing = self.view.get(&from).is_some_and(|m| m.may_host(role.as_deref()));
                    if round_free && ends_reachable && !(held && rebalancing) {
                        self.start_hand_off(now, mv.shard, from, mv.to);
                        started += 1;
                    }
                }
                _ => {
                    if let Some(home) = self.assign(mv.shard, mv.to) {
                        self.emit(DomainEvent::ShardAssigned { shard: mv.shard, home });
                    }
                }
            }
        }
        if started > 0 {
            self.round = Some(0);
            self.emit(DomainEvent::RebalancingTriggered { term: self.term, reason, planned: started });
        }
    }
}
