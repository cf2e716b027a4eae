//! Frames on the wire: a 4-byte big-endian length, then a postcard-encoded [`Frame`].

use serde::{Deserialize, Serialize};
use shardline_core::{NodeId, RegionMessage, ToCoordinator, ToRegion, TypeKey};

use crate::error::TransportError;
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
    /// Data of the membership provider (gossip), opaque to the transport.
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

impl Frame {
    /// Appends the length-prefixed encoding of the frame to `buf`. On error `buf` is left as it
    /// was, so frames already in it (a coalesced batch) are kept.
    pub fn encode_into(&self, buf: &mut Vec<u8>) -> Result<(), TransportError> {
        self.encode_within(buf, usize::MAX)
    }

    /// [`encode_into`](Self::encode_into), refusing a frame whose body exceeds `max` bytes (the
    /// peer would close the connection on it, losing every frame behind it).
    pub fn encode_within(&self, buf: &mut Vec<u8>, max: usize) -> Result<(), TransportError> {
        append_framed(self, buf, max)
    }

    /// Decodes a frame body (without its length prefix).
    pub fn decode(body: &[u8]) -> Result<Frame, TransportError> {
        postcard::from_bytes(body).map_err(|e| TransportError::Decode(e.to_string()))
    }
}

/// Appends `value` with a 4-byte big-endian length prefix; on any error truncates `buf` back.
pub(crate) fn append_framed<T: Serialize>(value: &T, buf: &mut Vec<u8>, max: usize) -> Result<(), TransportError> {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    if let Err(e) = postcard::to_extend(value, Appender(buf)) {
        buf.truncate(start);
        return Err(TransportError::Encode(e.to_string()));
    }
    let len = buf.len() - start - 4;
    let Some(prefix) = u32::try_from(len).ok().filter(|_| len <= max) else {
        buf.truncate(start);
        return Err(TransportError::FrameTooLarge { len, max: max.min(u32::MAX as usize) });
    };
    buf[start..start + 4].copy_from_slice(&prefix.to_be_bytes());
    Ok(())
}

/// Lets postcard write into a borrowed buffer, which stays ours if encoding fails half-way.
struct Appender<'a>(&'a mut Vec<u8>);

impl Extend<u8> for Appender<'_> {
    fn extend<I: IntoIterator<Item = u8>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Unencodable;

    impl Serialize for Unencodable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("refused on purpose"))
        }
    }

    /// One bad frame in a coalesced batch costs that frame only.
    #[test]
    fn a_frame_that_fails_to_encode_leaves_the_batch_intact() {
        let mut buf = Vec::new();
        Frame::Refuse { reason: "first".into() }.encode_into(&mut buf).unwrap();
        let before = buf.clone();
        let err = append_framed(&Unencodable, &mut buf, usize::MAX).unwrap_err();
        assert!(matches!(err, TransportError::Encode(_)), "{err:?}");
        assert_eq!(buf, before);
        let err = Frame::Refuse { reason: "x".repeat(100) }.encode_within(&mut buf, 64).unwrap_err();
        assert!(matches!(err, TransportError::FrameTooLarge { max: 64, .. }), "{err:?}");
        assert_eq!(buf, before);
        Frame::Refuse { reason: "second".into() }.encode_within(&mut buf, 64).unwrap();
        let first_len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        match Frame::decode(&buf[4 + first_len + 4..]).unwrap() {
            Frame::Refuse { reason } => assert_eq!(reason, "second"),
            other => panic!("{other:?}"),
        }
    }
}
