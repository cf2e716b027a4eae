//! What nodes say to each other over the transport: the sharding protocol's messages, the
//! answers to remote asks, and the membership provider's data (opaque bytes here).

use serde::{Deserialize, Serialize};
use shardline_core::{DomainEvent, EntityId, NodeId, RegionMessage, ToCoordinator, ToRegion, TypeKey};
use tracing::{debug, warn};

use crate::trace::TraceContext;
use crate::transport::{Payload, SendError, Transport};

/// Where the reply of a remote ask goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyAddr {
    /// The asking node.
    pub node: NodeId,
    /// Its request id.
    pub req_id: u64,
}

/// A message as it crosses the network.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireEnvelope {
    /// The target entity.
    pub entity: EntityId,
    /// The postcard-encoded message.
    pub payload: Vec<u8>,
    /// Where to reply (None for `tell`).
    pub reply: Option<ReplyAddr>,
    /// The caller's trace: not a field of the message, the trailer of its frame (protocol 5),
    /// so that nodes of versions 3 and 4 read the envelope they know.
    #[serde(skip)]
    pub trace: Option<TraceContext>,
}

/// Everything nodes say to each other once connected.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum PeerMessage {
    /// Data of the membership provider: gossip packets, or a lease provider's keep-alives.
    Membership(Vec<u8>),
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
    /// Domain events of the coordinator of a type, relayed by the node that leads to the others.
    Events {
        /// The entity type.
        type_key: TypeKey,
        /// The events, oldest first.
        events: Vec<DomainEvent>,
    },
    /// A question or request of the admin API, answered with a [`PeerMessage::Reply`]. Opaque
    /// here: the node layer above encodes the question and its answer.
    Admin {
        /// The asker's request id.
        req_id: u64,
        /// The encoded question.
        query: Vec<u8>,
    },
    /// The answer to a remote ask.
    Reply {
        /// The asker's request id.
        req_id: u64,
        /// The encoded reply, or the error.
        result: Result<Vec<u8>, crate::Error>,
    },
}

/// An ask or a tell, forwarded or sent back, carries its caller's trace in its frame's trailer.
impl Payload for PeerMessage {
    fn trace(&self) -> Option<TraceContext> {
        match self {
            PeerMessage::Region {
                msg: RegionMessage::Forward { msg, .. } | RegionMessage::Bounce { msg, .. }, ..
            } => msg.trace,
            _ => None,
        }
    }

    fn set_trace(&mut self, trace: TraceContext) {
        if let PeerMessage::Region {
            msg: RegionMessage::Forward { msg, .. } | RegionMessage::Bounce { msg, .. }, ..
        } = self
        {
            msg.trace = Some(trace);
        }
    }
}

/// The node's transport, carrying [`PeerMessage`]s.
pub(crate) type NodeTransport = Transport<PeerMessage>;

/// Sends the answer to a remote ask. One that cannot be queued is logged and counted, never
/// dropped unseen: with no route the asker is gone (its node left or died; nobody waits), with
/// a full queue the asker's deadline answers it `Timeout`, which says it may have been processed.
pub(crate) fn send_reply(transport: &NodeTransport, to: &NodeId, req_id: u64, result: Result<Vec<u8>, crate::Error>) {
    match transport.send(to, PeerMessage::Reply { req_id, result }) {
        Ok(()) => {}
        Err(SendError::NoRoute(_)) => {
            metrics::counter!("shardline_replies_unsent_total", "reason" => "no_route").increment(1);
            debug!(asker = %to, "reply not sent: the asker's node is gone");
        }
        Err(SendError::Full(_)) => {
            metrics::counter!("shardline_replies_unsent_total", "reason" => "queue_full").increment(1);
            warn!(asker = %to, "reply not sent: the queue to the asker's node is full");
        }
    }
}
