//! Frames on the wire: a 4-byte big-endian length, then a postcard-encoded [`Frame`].

use serde::{Deserialize, Serialize};
use shardline_core::{NodeId, RegionMessage, ToCoordinator, ToRegion, TypeKey};

use crate::error::TransportError;
use crate::membership::seeds::Gossip;
use crate::sharding::envelope::WireEnvelope;

/// Version of the wire protocol; peers with another version are refused.
pub const PROTOCOL_VERSION: u32 = 1;

/// Default largest frame (8 MiB).
pub const DEFAULT_MAX_FRAME: usize = 8 * 1024 * 1024;

/// Everything nodes say to each other.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Frame {
    /// First frame of a connection, from the dialer.
    Hello {
        /// Wire protocol version.
        protocol: u32,
        /// Cluster name.
        cluster: String,
        /// The dialer.
        from: NodeId,
        /// The node the dialer wants (None when dialing an address, e.g. a seed).
        to: Option<NodeId>,
    },
    /// The handshake is accepted.
    HelloOk {
        /// The accepting node.
        node: NodeId,
    },
    /// The handshake is refused; the connection closes.
    Refuse {
        /// Why.
        reason: String,
    },
    /// Membership traffic of the seed-node provider.
    Gossip(Gossip),
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

impl Frame {
    /// Appends the length-prefixed encoding of the frame to `buf`.
    pub fn encode_into(&self, buf: &mut Vec<u8>) -> Result<(), TransportError> {
        let start = buf.len();
        buf.extend_from_slice(&[0; 4]);
        let mut body = std::mem::take(buf);
        body = postcard::to_extend(self, body).map_err(|e| TransportError::Decode(e.to_string()))?;
        *buf = body;
        let len = (buf.len() - start - 4) as u32;
        buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
        Ok(())
    }

    /// Decodes a frame body (without its length prefix).
    pub fn decode(body: &[u8]) -> Result<Frame, TransportError> {
        postcard::from_bytes(body).map_err(|e| TransportError::Decode(e.to_string()))
    }
}
