//! Read models fed by [`DomainEvent`]s: topology, leader, shard map, node health, rebalancing
//! status. They answer the admin API's questions without touching the engines.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::events::{DomainEvent, RebalanceReason};
use crate::id::{NodeId, ShardId};
use crate::shard_map::{ShardHome, Term};

/// Health of a node as the events tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeHealth {
    /// Joined and not failed.
    Healthy,
    /// Left gracefully.
    Left,
    /// Declared down.
    Failed,
}

/// Rebalancing status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebalancingStatus {
    /// Whether a round is running.
    pub in_progress: bool,
    /// Why the running (or last) round started; `None` before the first.
    pub reason: Option<RebalanceReason>,
    /// Hand-offs planned by the running (or last) round.
    pub planned: usize,
    /// Shards the running (or last) round has moved so far.
    pub moved: usize,
    /// Shards moved by hand-off, all rounds together.
    pub total_moved: u64,
    /// Rounds completed.
    pub rounds: u64,
}

/// All read models together, updated by [`ClusterReadModel::apply`].
///
/// ```
/// use shardline_core::{ClusterReadModel, DomainEvent, NodeHealth, NodeId};
/// let mut rm = ClusterReadModel::default();
/// let n = NodeId::new("a", 1);
/// rm.apply(&DomainEvent::NodeJoined { node: n.clone() });
/// rm.apply(&DomainEvent::LeaderElected { node: n.clone(), term: 3 });
/// assert_eq!(rm.leader(), Some((&n, 3)));
/// assert_eq!(rm.health(&n), Some(NodeHealth::Healthy));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterReadModel {
    nodes: BTreeMap<NodeId, NodeHealth>,
    leader: Option<(NodeId, Term)>,
    shards: BTreeMap<ShardId, ShardHome>,
    rebalancing: RebalancingStatus,
}

impl ClusterReadModel {
    /// Folds one event in.
    pub fn apply(&mut self, event: &DomainEvent) {
        match event {
            DomainEvent::NodeJoined { node } => {
                self.nodes.insert(node.clone(), NodeHealth::Healthy);
            }
            DomainEvent::NodeLeft { node } => {
                self.nodes.insert(node.clone(), NodeHealth::Left);
            }
            DomainEvent::NodeFailed { node } => {
                self.nodes.insert(node.clone(), NodeHealth::Failed);
                self.shards.retain(|_, h| &h.owner != node);
            }
            DomainEvent::LeaderElected { node, term } => {
                if self.leader.as_ref().is_none_or(|(_, t)| t <= term) {
                    self.leader = Some((node.clone(), *term));
                }
            }
            DomainEvent::LeadershipLost { node, term } | DomainEvent::Deposed { node, term, .. } => {
                if self.leader.as_ref() == Some(&(node.clone(), *term)) {
                    self.leader = None;
                }
            }
            DomainEvent::ShardAssigned { shard, home } | DomainEvent::ShardMigrated { shard, to: home, .. } => {
                if self.shards.get(shard).is_none_or(|h| h.epoch <= home.epoch) {
                    self.shards.insert(*shard, home.clone());
                }
                if matches!(event, DomainEvent::ShardMigrated { .. }) {
                    self.rebalancing.total_moved += 1;
                    if self.rebalancing.in_progress {
                        self.rebalancing.moved += 1;
                    }
                }
            }
            DomainEvent::RebalancingTriggered { planned, reason, .. } => {
                self.rebalancing.in_progress = true;
                self.rebalancing.reason = Some(*reason);
                self.rebalancing.planned = *planned;
                self.rebalancing.moved = 0;
            }
            DomainEvent::RebalancingCompleted { .. } => {
                self.rebalancing.in_progress = false;
                self.rebalancing.rounds += 1;
            }
            DomainEvent::HandOffTimedOut { .. } | DomainEvent::StaleShardStopped { .. } => {}
        }
    }

    /// Known nodes and their health.
    pub fn topology(&self) -> &BTreeMap<NodeId, NodeHealth> {
        &self.nodes
    }

    /// Health of one node.
    pub fn health(&self, node: &NodeId) -> Option<NodeHealth> {
        self.nodes.get(node).copied()
    }

    /// The leader and its term.
    pub fn leader(&self) -> Option<(&NodeId, Term)> {
        self.leader.as_ref().map(|(n, t)| (n, *t))
    }

    /// Shard homes as the events tell them.
    pub fn shard_map(&self) -> &BTreeMap<ShardId, ShardHome> {
        &self.shards
    }

    /// Number of shards per node.
    pub fn shards_per_node(&self) -> BTreeMap<&NodeId, usize> {
        let mut m = BTreeMap::new();
        for h in self.shards.values() {
            *m.entry(&h.owner).or_insert(0) += 1;
        }
        m
    }

    /// Rebalancing status.
    pub fn rebalancing(&self) -> &RebalancingStatus {
        &self.rebalancing
    }
}
