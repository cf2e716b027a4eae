//! # shardline-core
//!
//! The protocol core of Shardline, a cluster-sharding runtime: every decision about where
//! entities live and how they move, as deterministic state machines with no I/O.
//!
//! Nothing in this crate opens a socket, reads a clock, spawns a task or draws an unseeded random
//! number. Time is an argument (`now`, in milliseconds); inputs are `handle_*` calls; outputs are
//! commands the caller polls and carries out. That is what lets the simulation in `tests/sim`
//! run thousands of seeded schedules of crashes, partitions and hand-offs and check the
//! invariants after every step, and it is how the `shardline` runtime drives the same engines
//! over TCP.
//!
//! | concept | type |
//! |---|---|
//! | how a driver runs an engine: commands out, one timer in | [`Engine`] |
//! | names and the entity → shard hash | [`TypeKey`], [`EntityId`], [`ShardId`], [`NodeId`], [`shard_of`] |
//! | membership | [`MembershipView`], [`Member`], [`MemberStatus`], [`RebalanceHold`] |
//! | where shards live | [`ShardMap`], [`ShardHome`], [`Epoch`] |
//! | where shards should live | [`AllocationStrategy`]: [`LeastShards`], [`VersionAware`], [`ConsistentHash`], [`Ranges`], [`External`] |
//! | a hosted shard's entities: running, idle, stopping, handed over | [`host::HostEngine`] |
//! | moving shards | [`CoordinatorEngine`] (on the leader), [`RegionEngine`] (on every node), [`Departure`] (a graceful leave) |
//! | who is alive | [`lease::LeaseEngine`] (membership on a coordination store), [`gossip::GossipEngine`] (SWIM) |
//! | who survives a partition | [`SplitBrainPolicy`] |
//! | durable reminders: which to read, which are due | [`reminder::ReminderSchedule`] |
//! | what happened | [`DomainEvent`], [`ClusterReadModel`] |
//!
//! ## Invariants the engines keep (checked by the simulation)
//! - **I1** at most one node hosts a shard at its newest epoch; no entity is live twice.
//! - **I2** with a healthy node, every shard gets a home after failure detection + one round.
//! - **I3** a message is processed at most once (a bounce means "not processed").
//! - **I4** nothing sent during a planned move is lost, and per-sender order holds.
//! - **I5** every buffer is bounded; overflow is an error to the sender.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod allocation;
pub mod coordinator;
pub mod departure;
pub mod engine;
pub mod events;
pub mod gossip;
pub mod host;
pub mod id;
pub mod lease;
pub mod membership;
pub mod protocol;
pub mod read_models;
pub mod region;
pub mod reminder;
pub mod shard_map;
pub mod split_brain;

pub use allocation::{
    AllocationStrategy, ConsistentHash, External, LeastShards, Move, Plan, PlanProblem, Ranges, RoundLimit,
    VersionAware,
};
pub use coordinator::{
    AssignError, CoordinatorCommand, CoordinatorConfig, CoordinatorEngine, MapLoadError, MapWriteError,
};
pub use departure::{Closing, Departure, DepartureStep, StopReason};
pub use engine::Engine;
pub use events::{DomainEvent, RebalanceReason};
pub use id::{shard_of, EntityId, NodeId, ShardId, TypeKey};
pub use membership::{AppVersion, Member, MemberStatus, MembershipError, MembershipView, RebalanceHold, PROXY_ROLE};
pub use protocol::{BounceReason, RegionMessage, ToCoordinator, ToRegion};
pub use read_models::{ClusterReadModel, NodeHealth, RebalancingStatus};
pub use region::{
    ClaimOutcome, RegionCommand, RegionConfig, RegionEngine, RejectReason, RememberPace, Route, SendFailure,
};
pub use shard_map::{Epoch, MapError, ShardHome, ShardMap, ShardSlot, Term};
pub use split_brain::{SplitBrainDecision, SplitBrainPolicy};
