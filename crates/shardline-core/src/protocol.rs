//! Messages between regions and the coordinator, and between regions.
//!
//! The transport carries them with the sending node's id, so none of them repeats it. Every
//! coordinator message carries the coordinator's term: a region ignores messages from a term
//! older than the newest it has seen, which fences a deposed coordinator.
//!
//! The protocol needs one thing from the transport: messages between two nodes arrive in the
//! order they were sent, or not at all (one TCP connection per pair). When a connection breaks,
//! the driver says so ([`RegionEngine::handle_link_down`](crate::RegionEngine::handle_link_down));
//! when a message cannot be written at all, it hands it back
//! ([`RegionEngine::handle_undeliverable`](crate::RegionEngine::handle_undeliverable)).

use serde::{Deserialize, Serialize};

use crate::id::ShardId;
use crate::shard_map::{Epoch, ShardHome, Term};

/// From a region to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToCoordinator {
    /// "I am here and host these shards." Sent on start, to every new coordinator, and after the
    /// link to the coordinator broke. The coordinator answers with [`ToRegion::Welcome`].
    Register {
        /// The coordinator term this registration is for.
        term: Term,
        /// Shards the region hosts, with their epochs.
        hosted: Vec<(ShardId, Epoch)>,
        /// False for a proxy region: it routes but never hosts.
        hosting: bool,
    },
    /// "Where does this shard live?"
    GetShardHome {
        /// The shard.
        shard: ShardId,
    },
    /// "I stopped routing this shard and everything I sent to its owner has arrived there."
    BeginHandOffAck {
        /// The term of the hand-off.
        term: Term,
        /// The shard.
        shard: ShardId,
    },
    /// "I stopped every entity of this shard."
    ShardStopped {
        /// The term of the hand-off.
        term: Term,
        /// The shard.
        shard: ShardId,
        /// The epoch at which it was hosted.
        epoch: Epoch,
        /// The entities' state for the next owner (opaque to the core), on a planned hand-off.
        handover: Option<Vec<u8>>,
    },
}

/// From the coordinator to a region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToRegion {
    /// A new coordinator took over: register with it.
    CoordinatorStarted {
        /// Its term.
        term: Term,
    },
    /// Answer to `Register`: the homes of all shards the coordinator knows and is not moving.
    Welcome {
        /// Coordinator term.
        term: Term,
        /// Known homes.
        homes: Vec<(ShardId, ShardHome)>,
    },
    /// Where shards live: an answer to `GetShardHome` or an announcement after a change.
    ShardHomes {
        /// Coordinator term.
        term: Term,
        /// The homes.
        homes: Vec<(ShardId, ShardHome)>,
    },
    /// Stop routing the shard (buffer instead), make sure everything sent to its owner arrived,
    /// then acknowledge.
    BeginHandOff {
        /// Coordinator term.
        term: Term,
        /// The shard.
        shard: ShardId,
    },
    /// To the new owner, just before the announcement of its new home: the state the previous
    /// owner handed over.
    HandedState {
        /// Coordinator term.
        term: Term,
        /// The shard.
        shard: ShardId,
        /// The epoch of the new allocation.
        epoch: Epoch,
        /// The state.
        data: Vec<u8>,
    },
    /// To the owner: stop the shard (let messages in progress finish), then say `ShardStopped`.
    HandOff {
        /// Coordinator term.
        term: Term,
        /// The shard.
        shard: ShardId,
        /// The epoch the owner hosts it at.
        epoch: Epoch,
    },
}

impl ToRegion {
    /// The coordinator term the message carries.
    pub fn term(&self) -> Term {
        match self {
            ToRegion::CoordinatorStarted { term }
            | ToRegion::Welcome { term, .. }
            | ToRegion::ShardHomes { term, .. }
            | ToRegion::BeginHandOff { term, .. }
            | ToRegion::HandedState { term, .. }
            | ToRegion::HandOff { term, .. } => *term,
        }
    }
}

/// Why a region sent a message back unprocessed. Either way it was **not processed**, so the
/// sender may resend it without risk of processing it twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BounceReason {
    /// The receiver does not host the shard.
    NotOwner,
    /// The receiver is handing the shard off.
    RebalanceInProgress,
}

/// From one region to another (same entity type). `M` is the application message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegionMessage<M> {
    /// A message for an entity of `shard`, routed to the region believed to host it.
    Forward {
        /// The shard.
        shard: ShardId,
        /// The epoch of the home the sender routed by.
        epoch: Epoch,
        /// Sender-local sequence number, kept if the message comes back.
        seq: u64,
        /// The sender's stream for this shard and destination: a new one starts after every
        /// drain or returned message.
        stream: u64,
        /// Position in the stream, from 1. A receiver only takes the next position, so once it
        /// sends one message back it sends back the rest of that stream too: a later message can
        /// never overtake an earlier one that is coming back to be resent.
        position: u64,
        /// The message.
        msg: M,
    },
    /// A forwarded message sent back unprocessed.
    Bounce {
        /// The shard.
        shard: ShardId,
        /// The sequence number of the forward.
        seq: u64,
        /// Why.
        reason: BounceReason,
        /// The message.
        msg: M,
    },
    /// A marker: answer `FlushAck` once every earlier message on this link has been handled.
    Flush {
        /// The shard being drained.
        shard: ShardId,
        /// Matches the answer to the request.
        token: u64,
    },
    /// Answer to `Flush`.
    FlushAck {
        /// The shard.
        shard: ShardId,
        /// The request's token.
        token: u64,
    },
}
