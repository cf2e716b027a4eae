//! What a region asks its driver to do.

use crate::id::{EntityId, NodeId, ShardId};
use crate::protocol::{RegionMessage, ToCoordinator};
use crate::shard_map::Epoch;

/// Why a message was refused. The sender is always told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, thiserror::Error)]
pub enum RejectReason {
    /// The region's buffers are full.
    #[error("overloaded: the region's buffers are full")]
    Overloaded,
    /// This node was fenced, or the message cannot be routed at all.
    #[error("unavailable: this node cannot route the message")]
    Unavailable,
    /// This node left the cluster with the message still waiting for its shard's home.
    #[error("unavailable: this node left the cluster before the message could be routed")]
    Left,
}

/// Why the driver could not send a [`RegionCommand::SendToRegion`]; the message was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendFailure {
    /// The queue towards the peer is full.
    QueueFull,
    /// There is no connection to the peer.
    NoConnection,
}

/// An effect for the driver to carry out, in the order polled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegionCommand<M> {
    /// Hand the message to the local entity (starting it if needed) of a shard hosted here at
    /// `epoch`.
    Deliver {
        /// The shard.
        shard: ShardId,
        /// The epoch it is hosted at.
        epoch: Epoch,
        /// The message.
        msg: M,
    },
    /// Send to another region. When that fails, the driver says so at once with
    /// [`RegionEngine::handle_send_failed`](crate::RegionEngine::handle_send_failed), before it
    /// carries out the next command.
    SendToRegion {
        /// The node.
        to: NodeId,
        /// The message.
        msg: RegionMessage<M>,
    },
    /// Send to another region once the queue towards it has room: a drain marker, its answer
    /// or a bounce, none of which may be lost or taken back. Sent after what is queued already.
    SendToRegionWhenReady {
        /// The node.
        to: NodeId,
        /// The message.
        msg: RegionMessage<M>,
    },
    /// Send to the coordinator.
    SendToCoordinator {
        /// The coordinator's node.
        to: NodeId,
        /// The message.
        msg: ToCoordinator,
    },
    /// This node now hosts `shard` at `epoch` (entities start on demand, from the handed-over
    /// state when there is one).
    StartShard {
        /// The shard.
        shard: ShardId,
        /// Its epoch.
        epoch: Epoch,
        /// State handed over by the previous owner.
        handover: Option<Vec<u8>>,
    },
    /// `shard` stays hosted here, at the newer epoch `to` (a newer coordinator allocated it
    /// here again). From now on its entities carry `to` as their fencing token.
    RaiseEpoch {
        /// The shard.
        shard: ShardId,
        /// The epoch it was hosted at.
        from: Epoch,
        /// The epoch it is hosted at now.
        to: Epoch,
    },
    /// Stop every entity of `shard`, then call
    /// [`RegionEngine::handle_shard_stopped`](crate::RegionEngine::handle_shard_stopped).
    /// Without `fenced`, messages already delivered are processed first; with it, the node lost
    /// its right to the shard and must stop at once (the engine already considers it stopped).
    StopShard {
        /// The shard.
        shard: ShardId,
        /// The epoch it was hosted at.
        epoch: Epoch,
        /// Stop at once.
        fenced: bool,
    },
    /// Nudge the running entities of every hosted shard
    /// ([`HostEngine::nudge`](crate::host::HostEngine::nudge)): those that got no message since
    /// the last nudge go back to being state in their shard's map. Every
    /// [`linger_sweep_ms`](crate::RegionConfig::linger_sweep_ms).
    SweepLingering,
    /// Stop the entities of every hosted shard idle for `after_ms` or more
    /// ([`HostEngine::passivate_idle`](crate::host::HostEngine::passivate_idle)). Every half of
    /// [`passivate_after_ms`](crate::RegionConfig::passivate_after_ms), 500 ms at the least.
    PassivateIdle {
        /// How long an entity must have been idle.
        after_ms: u64,
    },
    /// Claim `shard` at `epoch` in the type's journal (it fences older owners' writes), then
    /// call [`RegionEngine::handle_claimed`](crate::RegionEngine::handle_claimed).
    ClaimShard {
        /// The shard.
        shard: ShardId,
        /// The epoch it is hosted at.
        epoch: Epoch,
    },
    /// Read the remembered entities of `shard`, then call
    /// [`RegionEngine::handle_remembered`](crate::RegionEngine::handle_remembered).
    ReadRemembered {
        /// The shard.
        shard: ShardId,
        /// The epoch it is hosted at.
        epoch: Epoch,
    },
    /// Start entity `id` of `shard` without a message (its recovery runs), unless it is in memory
    /// already; then, once it recovered or will not, call
    /// [`RegionEngine::handle_woken`](crate::RegionEngine::handle_woken).
    WakeEntity {
        /// The shard.
        shard: ShardId,
        /// The epoch it is hosted at.
        epoch: Epoch,
        /// The entity.
        id: EntityId,
    },
    /// Tell the sender its message was refused.
    Reject {
        /// The shard.
        shard: ShardId,
        /// The message.
        msg: M,
        /// Why.
        reason: RejectReason,
    },
}
