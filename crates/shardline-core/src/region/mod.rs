//! The region: one per node and entity type. It routes messages by shard home, buffers them
//! (bounded, in order) while a shard's home is unknown or moving, and hosts local shards.
//!
//! ```text
//!   send(shard, msg) ───────┐                      ┌──► Deliver (local entity)
//!   from other regions ─────┼──►  RegionEngine  ───┼──► SendToRegion (Forward, Bounce, Flush…)
//!   from the coordinator ───┤   (per-shard route,  ├──► SendToCoordinator (Register, GetShardHome…)
//!   link down / undelivered ┤    buffers, timers)  ├──► StartShard / StopShard
//!   shard stopped, timer ───┤                      ├──► Reject (Overloaded, Unavailable)
//!   claimed, remembered,    │                      └──► ClaimShard / ReadRemembered /
//!   entity woken ───────────┘                           WakeEntity
//! ```
//!
//! # Order and loss
//! Messages to one shard leave a region in the order they were sent. Before a region sends a
//! shard's messages anywhere new, it *drains* the old destination: it sends a `Flush` marker on
//! the same link and waits for `FlushAck` (or for the link to break), so every earlier message
//! has arrived, or has come back as a `Bounce`, before a later one goes elsewhere. Bounced
//! messages go back into the buffer at their original place. That is what keeps per-sender order
//! through hand-offs (invariant I4) without acknowledging every message.
//!
//! # Fencing
//! A region never hosts a shard at an epoch it has already stopped, and ignores the coordinator
//! of an older term than the newest it has seen.

mod command;
mod engine;
mod shard_state;

pub use command::{RegionCommand, RejectReason, SendFailure};
pub use engine::{ClaimOutcome, RegionConfig, RegionEngine, RememberPace, Route};
