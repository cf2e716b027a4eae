//! Messages in flight inside the runtime: typed while local, bytes on the wire.

use serde::{Deserialize, Serialize};
use shardline_core::{EntityId, NodeId};
use tokio::sync::oneshot;

use super::entity::Entity;
use crate::error::Error;
use crate::transport::Owed;

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
}

pub(crate) type ReplySender<E> = oneshot::Sender<Result<<E as Entity>::Reply, Error>>;

/// A message inside a node.
pub(crate) enum Body<E: Entity> {
    Typed {
        msg: E::Message,
        reply: Option<ReplySender<E>>,
    },
    Wire {
        payload: Vec<u8>,
        reply: Option<ReplyAddr>,
        /// For an ask from another node: its reply is owed from arrival until it is queued
        /// (`Transport::owe`), so that the replies to one read's asks leave in one write.
        owed: Option<Owed>,
    },
    /// To an entity task from its shard: go idle if nothing else is waiting (or stop, when the
    /// shard is stopping). Never leaves the node.
    Retire,
    /// To an entity task from its region, once per linger period: go idle if no message came
    /// since the last nudge and nothing is waiting (stop instead, when the shard is stopping).
    /// Never leaves the node.
    Nudge,
    /// Starts the entity (its `started` hook runs) without a message: a remembered entity whose
    /// shard started here. Never leaves the node.
    Wake,
}

pub(crate) struct Envelope<E: Entity> {
    pub entity: EntityId,
    pub body: Body<E>,
}
