//! Frames on the wire: a 4-byte big-endian length, then a postcard-encoded [`Wire`]: the
//! handshake, then the messages of the layer above, which the transport does not look into.
//!
//! Since protocol 5 a message's frame may end in a trailer after the message: its
//! [`TraceContext`], when the message has one ([`Payload::trace`]). Nodes of versions 3 and 4
//! read the message and ignore the rest of the frame, so a trailer would cost them nothing; it
//! is written only on connections that agreed on 5 all the same, so that what an older node
//! reads is exactly what it wrote.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};
use shardline_core::NodeId;

use crate::error::TransportError;
use crate::trace::TraceContext;

/// The newest version of the wire protocol this build speaks.
///
/// - 3: the layout of every frame and message as kept in `golden/wire/v3`.
/// - 4: the same frames, and the handshake agrees on a version: `Hello` and `HelloOk` carry an
///   extension after their fields (see [`Wire::Hello`]), which a node of version 3 skips.
/// - 5: the same frames, and a message's frame may end in a trailer: the [`TraceContext`] of
///   the ask or tell it carries (see the module's docs).
pub const PROTOCOL_VERSION: u32 = 5;

/// The first version whose message frames may carry a trailer.
pub const TRAILER_PROTOCOL: u32 = 5;

/// The oldest version this build speaks: a connection to a node of version 3 speaks 3, so that
/// a cluster is updated one node at a time.
pub const OLDEST_PROTOCOL: u32 = 3;

/// Default largest frame (8 MiB).
pub const DEFAULT_MAX_FRAME: usize = 8 * 1024 * 1024;

/// What a message type needs to travel: the transport encodes and decodes it, and carries its
/// trace context in the frame's trailer; nothing more.
pub trait Payload: Serialize + DeserializeOwned + Send + 'static {
    /// The trace context this message carries, written in its frame's trailer on connections
    /// of protocol 5 and later. None (the default): no trailer.
    fn trace(&self) -> Option<TraceContext> {
        None
    }

    /// Takes the trace context that arrived in the frame's trailer. The default drops it: a
    /// message type with nowhere to keep one never sends one either.
    fn set_trace(&mut self, _trace: TraceContext) {}
}

// Plain payloads carry no trace: the transport's own tests, and any layer that sends bytes.
impl Payload for () {}
impl Payload for String {}
impl Payload for Vec<u8> {}

/// One frame: the handshake's three kinds, then messages of the layer above.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Wire<M> {
    /// First frame of a connection, from the dialer.
    ///
    /// Version 3 of the protocol took only its own version; since 4, `protocol` is the oldest the
    /// dialer speaks and `newest` follows the fields, where a node of version 3 does not look
    /// (it reads the fields it knows and ignores the rest of the frame).
    Hello {
        /// The oldest wire protocol version the dialer speaks.
        protocol: u32,
        /// Cluster name.
        cluster: String,
        /// The dialer.
        from: NodeId,
        /// Where the dialer listens: the acceptor answers asks on a connection of its own to
        /// it, and may get an ask before membership has told it where the asker is.
        listen: std::net::SocketAddr,
        /// The node the dialer wants (None when dialing an address, e.g. a seed).
        to: Option<NodeId>,
        /// The newest version the dialer speaks, after the fields; `protocol` when the frame
        /// ends there (a node of version 3).
        #[serde(skip)]
        newest: u32,
    },
    /// The handshake is accepted.
    HelloOk {
        /// The accepting node.
        node: NodeId,
        /// The version the connection speaks, after the fields; the dialer's oldest when the
        /// frame ends there (a node of version 3 accepts only its own).
        #[serde(skip)]
        protocol: Option<u32>,
    },
    /// The handshake is refused; the connection closes.
    Refuse {
        /// Why.
        reason: String,
    },
    /// A message of the layer above.
    Message(M),
}

/// Index of [`Wire::Message`] among the variants (postcard writes it before the content).
const MESSAGE_VARIANT: u32 = 3;

impl<M: Payload> Wire<M> {
    /// Appends the length-prefixed encoding of the frame to `buf`, as this version writes it (a
    /// message with its trailer). On error `buf` is left as it was, so frames already in it (a
    /// coalesced batch) are kept.
    pub fn encode_into(&self, buf: &mut Vec<u8>) -> Result<(), TransportError> {
        match self {
            Wire::Hello { newest, .. } => append_framed(&(self, Some(*newest)), buf, usize::MAX),
            Wire::HelloOk { protocol, .. } => append_framed(&(self, *protocol), buf, usize::MAX),
            Wire::Message(m) => append_message(m, m.trace().as_ref(), buf, usize::MAX),
            Wire::Refuse { .. } => append_framed(self, buf, usize::MAX),
        }
    }

    /// Decodes a frame body (without its length prefix), with the handshake's extension.
    pub fn decode(body: &[u8]) -> Result<Wire<M>, TransportError> {
        let bad = |e: postcard::Error| TransportError::Decode(e.to_string());
        let (mut frame, rest) = postcard::take_from_bytes::<Wire<M>>(body).map_err(bad)?;
        if let Wire::Message(m) = &mut frame {
            // The trailer (protocol 5): a trace context, then whatever a later version adds,
            // which this one does not read. Cut short, it is an error, not a frame without one.
            if !rest.is_empty() {
                let (trace, _) = postcard::take_from_bytes::<TraceContext>(rest).map_err(bad)?;
                // W3C: an id of all zeros is no id. The message is the peer's and goes on; the
                // context it came with is dropped, said and counted (a collector would refuse it).
                if trace.trace_id == [0; 16] || trace.span_id == [0; 8] {
                    tracing::warn!(
                        "a frame's trace context has an all-zero id: the message is kept, the trace dropped"
                    );
                    metrics::counter!("shardline_transport_invalid_traces_total").increment(1);
                } else {
                    m.set_trace(trace);
                }
            }
            return Ok(frame);
        }
        // An extension is an `Option`: present, it must be all that follows.
        let extension = || -> Result<Option<u32>, TransportError> {
            match rest {
                [] => Ok(None),
                _ => crate::format::read_all::<Option<u32>>(rest).map_err(bad),
            }
        };
        match &mut frame {
            Wire::Hello { protocol, newest, .. } => *newest = extension()?.unwrap_or(*protocol),
            Wire::HelloOk { protocol, .. } => *protocol = extension()?,
            _ => {}
        }
        Ok(frame)
    }
}

impl<M> Wire<M> {
    /// The frame's kind, for logs (never its content).
    pub fn kind(&self) -> &'static str {
        match self {
            Wire::Hello { .. } => "Hello",
            Wire::HelloOk { .. } => "HelloOk",
            Wire::Refuse { .. } => "Refuse",
            Wire::Message(_) => "Message",
        }
    }
}

/// Encodes `msg` as a [`Wire::Message`] without moving it into one, with `trailer` after it when
/// there is one; refuses a body over `max` bytes (the peer would close the connection on it,
/// losing every frame behind it).
pub(crate) fn append_message<M: Serialize>(
    msg: &M,
    trailer: Option<&TraceContext>,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<(), TransportError> {
    match trailer {
        // Postcard writes a tuple as its fields one after the other: the message, then the
        // trailer.
        Some(t) => append_framed(&(MessageRef(msg), t), buf, max),
        None => append_framed(&MessageRef(msg), buf, max),
    }
}

/// Serializes exactly as `Wire::Message(m)` does, from a reference.
struct MessageRef<'a, M>(&'a M);

impl<M: Serialize> Serialize for MessageRef<'_, M> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_newtype_variant("Wire", MESSAGE_VARIANT, "Message", self.0)
    }
}

/// Appends `value` with a 4-byte big-endian length prefix; on any error truncates `buf` back.
fn append_framed<T: Serialize>(value: &T, buf: &mut Vec<u8>, max: usize) -> Result<(), TransportError> {
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

    impl Payload for (u64, String) {}

    /// A message that keeps the trace its trailer brought.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Traced(String, #[serde(skip)] Option<TraceContext>);

    impl Payload for Traced {
        fn trace(&self) -> Option<TraceContext> {
            self.1
        }

        fn set_trace(&mut self, trace: TraceContext) {
            self.1 = Some(trace);
        }
    }

    impl Serialize for Unencodable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("refused on purpose"))
        }
    }

    fn body(buf: &[u8]) -> (&[u8], &[u8]) {
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        (&buf[4..4 + len], &buf[4 + len..])
    }

    /// A message encoded by reference is the frame `Wire::Message` would be.
    #[test]
    fn a_message_by_reference_encodes_as_the_message_frame() {
        let msg = (7u64, "seven".to_string());
        let mut by_ref = Vec::new();
        append_message(&msg, None, &mut by_ref, usize::MAX).unwrap();
        let mut owned = Vec::new();
        Wire::Message(msg.clone()).encode_into(&mut owned).unwrap();
        assert_eq!(by_ref, owned);
        match Wire::<(u64, String)>::decode(body(&by_ref).0).unwrap() {
            Wire::Message(m) => assert_eq!(m, msg),
            other => panic!("{}", other.kind()),
        }
    }

    /// One bad frame in a coalesced batch costs that frame only.
    #[test]
    fn a_frame_that_fails_to_encode_leaves_the_batch_intact() {
        let mut buf = Vec::new();
        append_message(&"first".to_string(), None, &mut buf, usize::MAX).unwrap();
        let before = buf.clone();
        let err = append_message(&Unencodable, None, &mut buf, usize::MAX).unwrap_err();
        assert!(matches!(err, TransportError::Encode(_)), "{err:?}");
        assert_eq!(buf, before);
        let err = append_message(&"x".repeat(100), None, &mut buf, 64).unwrap_err();
        assert!(matches!(err, TransportError::FrameTooLarge { max: 64, .. }), "{err:?}");
        assert_eq!(buf, before);
        append_message(&"second".to_string(), None, &mut buf, 64).unwrap();
        match Wire::<String>::decode(body(body(&buf).1).0).unwrap() {
            Wire::Message(m) => assert_eq!(m, "second"),
            other => panic!("{}", other.kind()),
        }
    }

    /// A trailer reaches the message on this version, is ignored by the decoder of versions 3
    /// and 4 (the message and nothing else), and cut short it is an error.
    #[test]
    fn a_trace_travels_in_the_trailer_and_older_versions_skip_it() {
        let trace = TraceContext::root();
        let msg = Traced("hello".into(), Some(trace));
        let mut buf = Vec::new();
        append_message(&msg, msg.trace().as_ref(), &mut buf, usize::MAX).unwrap();
        let (frame, _) = body(&buf);
        match Wire::<Traced>::decode(frame).unwrap() {
            Wire::Message(m) => assert_eq!(m, msg),
            other => panic!("{}", other.kind()),
        }
        // What versions 3 and 4 did: take the frame, leave the rest.
        let (old, rest) = postcard::take_from_bytes::<Wire<Traced>>(frame).unwrap();
        assert!(matches!(old, Wire::Message(Traced(ref s, None)) if s == "hello"));
        assert_eq!(rest.len(), 25, "16 + 8 + 1 bytes");
        let mut untraced = Vec::new();
        append_message(&msg, None, &mut untraced, usize::MAX).unwrap();
        assert_eq!(&frame[..frame.len() - 25], body(&untraced).0);
        match Wire::<Traced>::decode(body(&untraced).0).unwrap() {
            Wire::Message(m) => assert_eq!(m.1, None),
            other => panic!("{}", other.kind()),
        }
        for cut in 1..25 {
            let err = Wire::<Traced>::decode(&frame[..frame.len() - cut]).unwrap_err();
            assert!(matches!(err, TransportError::Decode(_)), "{cut}: {err:?}");
        }
        // An all-zero id: the message arrives, without the trace.
        for zero in [TraceContext { trace_id: [0; 16], ..trace }, TraceContext { span_id: [0; 8], ..trace }] {
            let mut buf = Vec::new();
            append_message(&msg, Some(&zero), &mut buf, usize::MAX).unwrap();
            match Wire::<Traced>::decode(body(&buf).0).unwrap() {
                Wire::Message(m) => assert_eq!(m, Traced("hello".into(), None)),
                other => panic!("{}", other.kind()),
            }
        }
    }
}
