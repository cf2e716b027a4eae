//! What nodes say to each other over the transport: the sharding protocol's messages, the
//! answers to remote asks, and the membership provider's data (opaque bytes here).

use serde::{Deserialize, Serialize};
use shardline_core::{RegionMessage, ToCoordinator, ToRegion, TypeKey};

use super::envelope::WireEnvelope;
use crate::transport::Transport;

/// Everything nodes say to each other once connected.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum PeerMessage {
    /// Data of the membership provider (gossip).
    Gossip(Vec<u8>),
    /// To the coordinator of a type.
    ToCoordinator {
        /// The entity type.
        type_key: TypeKey,
        /// The message.
        msg: ToCoordinator,
    },
    /// From the coordinator of a type.
    ToRegion {
        /// The entity type.
        type_key: TypeKey,
        /// The message.
        msg: ToRegion,
    },
    /// Between regions of a type.
    Region {
        /// The entity type.
        type_key: TypeKey,
        /// The message.
        msg: RegionMessage<WireEnvelope>,
    },
    /// The answer to a remote ask.
    Reply {
        /// The asker's request id.
        req_id: u64,
        /// The encoded reply, or the error.
        result: Result<Vec<u8>, crate::Error>,
    },
}

/// The node's transport, carrying [`PeerMessage`]s.
pub(crate) type NodeTransport = Transport<PeerMessage>;
