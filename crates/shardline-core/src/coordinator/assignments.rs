//! Operator input on where shards go: assignments given from outside (for the `External`
//! strategy), a replaced strategy, a rebalance asked for. Kept apart from the engine's
//! membership and region inputs because it is checked and refused on its own terms
//! ([`AssignError`]) and only ever ends in a plan.

use super::engine::CoordinatorEngine;
use crate::allocation::{AllocationStrategy, PlanProblem};
use crate::events::RebalanceReason;
use crate::id::ShardId;

/// Why assignments were not taken ([`CoordinatorEngine::handle_assignments`]); none was.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AssignError {
    /// One of them names a shard or a node that cannot take it.
    #[error("{shard}: {problem}")]
    Wrong {
        /// The shard.
        shard: ShardId,
        /// What is wrong.
        problem: PlanProblem,
    },
    /// The type's strategy does not follow assignments.
    #[error("the strategy {strategy} takes no assignments (only the External strategy does)")]
    NotExternal {
        /// The strategy's name.
        strategy: &'static str,
    },
    /// The coordinator has stopped.
    #[error("the coordinator has stopped")]
    Stopped,
    /// The coordinator is still reading its stored shard map.
    #[error("the coordinator is still reading its stored shard map; try again")]
    Loading,
}

impl CoordinatorEngine {
    /// Replaces the allocation strategy (e.g. new external assignments) and plans at once.
    pub fn replace_strategy(&mut self, now: u64, strategy: Box<dyn AllocationStrategy>) {
        self.strategy = strategy;
        self.schedule_rebalance(now, RebalanceReason::Strategy);
        self.after_input(now);
    }

    /// An operator asked for a rebalance: plans now instead of at the next periodic check. A
    /// round already running is not disturbed; the plan starts what the strategy asks for once it
    /// is free, as a periodic check would.
    pub fn handle_rebalance_request(&mut self, now: u64) {
        if self.is_idle() {
            return;
        }
        self.schedule_rebalance(now, RebalanceReason::Requested);
        self.after_input(now);
    }

    /// Assignments given from outside (shard → node name), on top of those given before, for a
    /// strategy that follows them ([`External`](crate::External)). All are checked before any is
    /// taken ([`check_assignments`](Self::check_assignments)); then the strategy plans at once,
    /// and shards move by the usual hand-off.
    pub fn handle_assignments(&mut self, now: u64, assignments: &[(ShardId, String)]) -> Result<(), AssignError> {
        if self.stopped {
            return Err(AssignError::Stopped);
        }
        if self.loading.is_some() {
            return Err(AssignError::Loading);
        }
        self.check_assignments(assignments).map_err(|(shard, problem)| AssignError::Wrong { shard, problem })?;
        for (shard, node) in assignments {
            if !self.strategy.assign(*shard, node) {
                return Err(AssignError::NotExternal { strategy: self.strategy.name() });
            }
        }
        self.schedule_rebalance(now, RebalanceReason::Strategy);
        self.after_input(now);
        Ok(())
    }

    /// Checks assignments given from outside (`External`) before any is taken: every shard in the
    /// map, every node a member that may host now (the same hosts a plan uses). The first wrong one
    /// is returned.
    pub fn check_assignments(&self, assignments: &[(ShardId, String)]) -> Result<(), (ShardId, PlanProblem)> {
        let hosts = self.hosts();
        for (shard, node) in assignments {
            if self.map.slot(*shard).is_none() {
                return Err((*shard, PlanProblem::OutOfRange));
            }
            if !hosts.iter().any(|m| &*m.node.name == node.as_str()) {
                return Err((*shard, PlanProblem::NotAHost { node: node.clone() }));
            }
        }
        Ok(())
    }
}
