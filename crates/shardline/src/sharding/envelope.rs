//! Messages in flight inside a node: typed while local, bytes once they came from the wire (whose
//! form, [`WireEnvelope`], is in [`message`](super::message) with the rest of the wire).

use shardline_core::EntityId;
use tokio::sync::oneshot;

use super::entity::Entity;
use super::message::ReplyAddr;
use crate::error::Error;
use crate::trace::TraceContext;
use crate::transport::Owed;

pub(crate) type ReplySender<E> = oneshot::Sender<Result<<E as Entity>::Reply, Error>>;

/// A message inside a node.
pub(crate) enum Body<E: Entity> {
    Typed {
        msg: E::Message,
        reply: Option<ReplySender<E>>,
        /// The caller's span ([`crate::trace`]). Boxed: a node that does not trace sends none,
        /// and a mailbox's every slot is as large as its largest body.
        trace: Option<Box<TraceContext>>,
    },
    Wire {
        payload: Vec<u8>,
        reply: Option<ReplyAddr>,
        /// The caller's span, from the frame's trailer (None from a node of version 3 or 4).
        trace: Option<Box<TraceContext>>,
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
    /// shard started here. It holds a place among the remembered entities starting at once,
    /// given back when it is dropped: once the entity has started, or when it never will. Never
    /// leaves the node.
    Wake { woken: Woken },
    /// A due reminder, from its shard's reminder task on this node. Never leaves the node.
    Reminder(super::reminder::Delivery),
}

/// Runs once, when dropped: tells the region that a woken entity recovered or will not, so that
/// its place goes to the next one. Dropped, not called, so that no path (a full mailbox, a
/// stopping shard, an aborted task) can keep a place for good.
pub(crate) struct Woken(Option<Box<dyn FnOnce() + Send>>);

impl Woken {
    pub fn new(done: impl FnOnce() + Send + 'static) -> Self {
        Woken(Some(Box::new(done)))
    }

    /// Drops it without telling: its holder tells the region itself.
    pub fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Woken {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done();
        }
    }
}

pub(crate) struct Envelope<E: Entity> {
    pub entity: EntityId,
    pub body: Body<E>,
}
