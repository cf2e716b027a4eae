//! Domain events: facts the coordinator and membership publish (Aether's vocabulary), for logs,
//! metrics, the admin API and the read models in [`crate::read_models`].

use serde::{Deserialize, Serialize};

use crate::id::{NodeId, ShardId};
use crate::shard_map::{Epoch, ShardHome, Term};

/// Why a rebalance started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RebalanceReason {
    /// Membership changed (join, leave, failure).
    Membership,
    /// The periodic check found an imbalance.
    Periodic,
    /// The strategy was replaced (e.g. new external assignments).
    Strategy,
    /// An operator asked for it (the admin API's rebalance).
    Requested,
}

/// Something that happened in the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DomainEvent {
    /// A node became a member that may host shards.
    NodeJoined {
        /// The node.
        node: NodeId,
    },
    /// A node left gracefully (leaving, exiting or removed).
    NodeLeft {
        /// The node.
        node: NodeId,
    },
    /// A node was declared down (lease expired, downed).
    NodeFailed {
        /// The node.
        node: NodeId,
    },
    /// This node's coordinator took over with a new term.
    LeaderElected {
        /// The leader.
        node: NodeId,
        /// Its term.
        term: Term,
    },
    /// This node's coordinator lost its leadership and stopped.
    LeadershipLost {
        /// The former leader.
        node: NodeId,
        /// The term it held.
        term: Term,
    },
    /// This node's coordinator found the stored shard map written by a newer term: another
    /// coordinator runs, so this one stopped.
    Deposed {
        /// The deposed leader.
        node: NodeId,
        /// The term it held.
        term: Term,
        /// The newer term that wrote the map.
        by: Term,
    },
    /// A shard without a live owner was allocated.
    ShardAssigned {
        /// The shard.
        shard: ShardId,
        /// Its home.
        home: ShardHome,
    },
    /// A shard moved from one live node to another by hand-off.
    ShardMigrated {
        /// The shard.
        shard: ShardId,
        /// The previous owner.
        from: NodeId,
        /// The new home.
        to: ShardHome,
    },
    /// A hand-off waited longer than the hand-off timeout.
    HandOffTimedOut {
        /// The shard.
        shard: ShardId,
        /// The owner that has not answered.
        owner: NodeId,
        /// Whether the hand-off was abandoned (regions had not all acknowledged) or keeps
        /// waiting for the owner to stop or be fenced.
        abandoned: bool,
    },
    /// A rebalance round started.
    RebalancingTriggered {
        /// Coordinator term.
        term: Term,
        /// Why.
        reason: RebalanceReason,
        /// Hand-offs started.
        planned: usize,
    },
    /// A rebalance round ended (all its hand-offs finished or were abandoned).
    RebalancingCompleted {
        /// Coordinator term.
        term: Term,
        /// Shards that moved.
        moved: usize,
    },
    /// A region reported a shard at an epoch older than the map's: it was told to stop it.
    StaleShardStopped {
        /// The shard.
        shard: ShardId,
        /// The stale host.
        node: NodeId,
        /// The stale epoch.
        epoch: Epoch,
    },
}
