//! Every answer that tells a sender its message was not handled as asked, decided in one place:
//! for each reason the runtime turns a message away, which [`Error`] the sender gets, and so
//! whether it may safely send it again.
//!
//! | reason | error | processed? |
//! |---|---|---|
//! | the shard or entity is stopping, not hosted here, the node cannot route it | `Unavailable` | no: resend |
//! | a mailbox or the region's buffers are full | `Overloaded` | no: resend later |
//! | the node's lease is not granted or ran out; the message cannot be read, written or sent; its type is not registered there | `Rejected` | no |
//! | the entity stopped or panicked while handling it | `OutcomeUnknown` | maybe |
//! | the reply cannot be written or sent | `ReplyLost` | yes |

use shardline_core::{EntityId, Epoch, NodeId, RejectReason, ShardId, TypeKey};

use super::entity::Entity;
use super::envelope::Body;
use super::message::{send_reply, NodeTransport};
use crate::error::Error;

/// Why a message is turned away.
pub(crate) enum Refusal<'a> {
    /// Its shard is stopping here: its entities may have handed their state over already.
    ShardStopping(ShardId),
    /// Its entity's mailbox is full.
    MailboxFull(&'a EntityId),
    /// Its entity is stopping.
    EntityStopping(&'a EntityId),
    /// Delivered for an epoch this node does not host the shard at.
    NotHostedAt(ShardId, Epoch),
    /// Delivered for a shard this node has not started.
    NotStarted(ShardId),
    /// The region engine's reason.
    Region(RejectReason, &'a TypeKey),
    /// This node may not host now.
    Unleased(&'a NodeId),
    /// It cannot be read as its entity's message.
    Undecodable(&'a EntityId, String),
    /// It cannot be written for the wire.
    Unencodable(String),
    /// It cannot be sent to the node that hosts its entity.
    Unsendable(&'a EntityId, String),
    /// Its entity type is not registered on the node it reached.
    UnknownType(&'a TypeKey, &'a NodeId),
    /// Its entity stopped before handling it.
    StoppedBefore(&'a EntityId),
    /// Its entity panicked (or was stopped) while handling it.
    StoppedDuring(&'a EntityId, bool),
    /// The entity handled it, and its reply cannot be written.
    ReplyUnencodable(String),
    /// The entity handled it, and its reply cannot be sent.
    ReplyUnsendable(String),
}

impl Refusal<'_> {
    /// The error the sender gets.
    pub(crate) fn error(self) -> Error {
        match self {
            Refusal::ShardStopping(shard) => Error::Unavailable(format!("{shard} is stopping")),
            Refusal::MailboxFull(id) => Error::Overloaded(format!("mailbox of {id} is full")),
            Refusal::EntityStopping(id) => Error::Unavailable(format!("{id} is stopping")),
            Refusal::NotHostedAt(shard, epoch) => Error::Unavailable(format!("{shard} is not hosted at {epoch}")),
            Refusal::NotStarted(shard) => Error::Unavailable(format!("{shard} is not started")),
            Refusal::Region(RejectReason::Overloaded, type_key) => {
                Error::Overloaded(format!("{type_key} region buffers are full"))
            }
            Refusal::Region(RejectReason::Unavailable, _) => {
                Error::Unavailable("this node cannot route the message".into())
            }
            Refusal::Region(reason @ RejectReason::Left, _) => Error::Unavailable(reason.to_string()),
            Refusal::Unleased(node) => Error::Rejected(format!(
                "{node} may not host now: its lease ran out, or no majority of the cluster answered it"
            )),
            Refusal::Undecodable(id, e) => Error::Rejected(format!("cannot decode message for {id}: {e}")),
            Refusal::Unencodable(e) => Error::Rejected(format!("cannot encode message: {e}")),
            Refusal::Unsendable(id, e) => Error::Rejected(format!("message to {id} cannot be sent: {e}")),
            Refusal::UnknownType(type_key, node) => {
                Error::Rejected(format!("entity type {type_key} is not registered on {node}"))
            }
            Refusal::StoppedBefore(id) => Error::Unavailable(format!("{id} stopped before handling the message")),
            Refusal::StoppedDuring(id, panicked) => {
                let how = if panicked { "panicked" } else { "was stopped" };
                Error::OutcomeUnknown(format!("{id} {how} while handling the message"))
            }
            Refusal::ReplyUnencodable(e) => Error::ReplyLost(format!("cannot encode the reply: {e}")),
            Refusal::ReplyUnsendable(e) => Error::ReplyLost(format!("the reply cannot be sent: {e}")),
        }
    }
}

/// Tells the sender of `body` why it was turned away (a `tell` has nobody to tell).
pub(crate) fn refuse<E: Entity>(transport: &NodeTransport, body: Body<E>, why: Refusal<'_>) {
    match body {
        Body::Typed { reply: Some(tx), .. } => {
            let _ = tx.send(Err(why.error()));
        }
        Body::Wire { reply: Some(addr), .. } => {
            send_reply(transport, &addr.node, addr.req_id, Err(why.error()));
        }
        _ => {}
    }
}
