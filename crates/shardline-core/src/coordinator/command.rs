//! What the coordinator asks its driver to do.

use crate::events::DomainEvent;
use crate::id::{NodeId, ShardId};
use crate::protocol::ToRegion;
use crate::shard_map::{Epoch, ShardHome, ShardMap, ShardSlot, Term};

/// An effect for the driver to carry out, in the order polled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorCommand {
    /// Answer one region's `GetShardHome`.
    SendShardHome {
        /// The region's node.
        to: NodeId,
        /// The shard.
        shard: ShardId,
        /// Its home.
        home: ShardHome,
    },
    /// Tell regions about new homes (after allocations and hand-offs, or to abandon a hand-off).
    AnnounceShardHomes {
        /// Every registered region.
        to: Vec<NodeId>,
        /// The homes.
        homes: Vec<(ShardId, ShardHome)>,
    },
    /// Answer a region's `Register` with every home the coordinator knows.
    SendWelcome {
        /// The region's node.
        to: NodeId,
        /// Known homes (shards being handed off are left out).
        homes: Vec<(ShardId, ShardHome)>,
    },
    /// Ask regions to (re-)register with this coordinator and report their shards.
    RequestRegistration {
        /// The nodes asked.
        to: Vec<NodeId>,
    },
    /// Ask regions to stop routing `shard` and acknowledge.
    SendBeginHandOff {
        /// Regions that have not acknowledged yet.
        to: Vec<NodeId>,
        /// The shard.
        shard: ShardId,
    },
    /// Ask the owner to stop `shard`.
    SendHandOff {
        /// The owner.
        to: NodeId,
        /// The shard.
        shard: ShardId,
        /// The epoch it hosts the shard at.
        epoch: Epoch,
    },
    /// Give the new owner the state its previous owner handed over (sent before the
    /// announcement, on the same link, so it arrives first).
    SendHandedState {
        /// The new owner.
        to: NodeId,
        /// The shard.
        shard: ShardId,
        /// The new epoch.
        epoch: Epoch,
        /// The state.
        data: Vec<u8>,
    },
    /// Read the stored shard map and give it to
    /// [`handle_map_loaded`](crate::CoordinatorEngine::handle_map_loaded).
    LoadShardMap,
    /// Store the map (compare-and-set on what this coordinator last wrote), and give the outcome
    /// to [`handle_map_stored`](crate::CoordinatorEngine::handle_map_stored). A driver may skip
    /// a write that a newer one supersedes: each carries the whole map.
    PersistShardMap {
        /// Map version after these changes.
        version: u64,
        /// The entries changed since the last write (empty when the whole map is written again),
        /// for a store that writes entries.
        changes: Vec<(ShardId, ShardSlot)>,
        /// The whole map, for a store that writes it whole.
        map: ShardMap,
    },
    /// Publish a domain event.
    Emit(DomainEvent),
}

impl CoordinatorCommand {
    /// The network messages this command stands for, stamped with `term` (empty for
    /// the store's commands and `Emit`).
    pub fn messages(&self, term: Term) -> Vec<(NodeId, ToRegion)> {
        match self {
            CoordinatorCommand::SendShardHome { to, shard, home } => {
                vec![(to.clone(), ToRegion::ShardHomes { term, homes: vec![(*shard, home.clone())] })]
            }
            CoordinatorCommand::AnnounceShardHomes { to, homes } => {
                to.iter().map(|n| (n.clone(), ToRegion::ShardHomes { term, homes: homes.clone() })).collect()
            }
            CoordinatorCommand::SendWelcome { to, homes } => {
                vec![(to.clone(), ToRegion::Welcome { term, homes: homes.clone() })]
            }
            CoordinatorCommand::RequestRegistration { to } => {
                to.iter().map(|n| (n.clone(), ToRegion::CoordinatorStarted { term })).collect()
            }
            CoordinatorCommand::SendBeginHandOff { to, shard } => {
                to.iter().map(|n| (n.clone(), ToRegion::BeginHandOff { term, shard: *shard })).collect()
            }
            CoordinatorCommand::SendHandedState { to, shard, epoch, data } => {
                vec![(to.clone(), ToRegion::HandedState { term, shard: *shard, epoch: *epoch, data: data.clone() })]
            }
            CoordinatorCommand::SendHandOff { to, shard, epoch } => {
                vec![(to.clone(), ToRegion::HandOff { term, shard: *shard, epoch: *epoch })]
            }
            CoordinatorCommand::LoadShardMap
            | CoordinatorCommand::PersistShardMap { .. }
            | CoordinatorCommand::Emit(_) => Vec::new(),
        }
    }
}
