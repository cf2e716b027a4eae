//! What the engine asks of its runtime, and what the runtime answers.

use std::collections::BTreeMap;

use super::records::{Revision, StoreValue, StoredEntry, ValueKind};
use crate::id::NodeId;
use crate::membership::MembershipView;
use crate::shard_map::Term;

/// One operation on the coordination store. Ephemeral keys expire `ttl_ms` after their last
/// write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreOp {
    /// Create `key` only if absent. Answered with [`StoreAnswer::Written`] (`None`: it exists).
    CreateEphemeral {
        /// The key.
        key: String,
        /// Its value.
        value: StoreValue,
        /// Its time to live.
        ttl_ms: u64,
    },
    /// Rewrite an ephemeral key still at `revision`, pushing its expiry back.
    /// [`StoreAnswer::Written`] (`None`: another revision, or gone).
    Refresh {
        /// The key.
        key: String,
        /// Its value.
        value: StoreValue,
        /// The revision it must still have.
        revision: Revision,
        /// Its time to live.
        ttl_ms: u64,
    },
    /// Write a durable key at `revision` (0: it must be absent). [`StoreAnswer::Written`].
    CompareAndPut {
        /// The key.
        key: String,
        /// Its value.
        value: StoreValue,
        /// The revision it must have.
        revision: Revision,
    },
    /// Read a key. [`StoreAnswer::Entry`].
    Get {
        /// The key.
        key: String,
        /// What its value is.
        kind: ValueKind,
    },
    /// Read every key under a prefix. [`StoreAnswer::Entries`].
    List {
        /// The prefix.
        prefix: String,
        /// What the values are.
        kind: ValueKind,
    },
    /// Delete a key (only at `revision`, when given). [`StoreAnswer::Deleted`].
    Delete {
        /// The key.
        key: String,
        /// The revision it must have.
        revision: Option<Revision>,
    },
}

/// The store's answer to a [`StoreOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreAnswer {
    /// A write's new revision, or `None` when its condition did not hold.
    Written(Option<Revision>),
    /// A read key, or `None` when absent.
    Entry(Option<StoredEntry>),
    /// The keys under a prefix.
    Entries(Vec<StoredEntry>),
    /// A delete ran (whether or not something was deleted).
    Deleted,
    /// The store failed or could not be reached: the operation may or may not have happened.
    Failed(String),
}

/// Something the runtime should log (and count): the engine does no I/O, logging included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseEvent {
    /// This node stopped hosting: its lease could not be kept.
    Fenced {
        /// Why.
        reason: &'static str,
    },
    /// A member-key renewal failed.
    RenewalFailed {
        /// The store's error.
        error: String,
        /// Failures in a row.
        failures: u32,
    },
    /// A previous incarnation's key has not expired yet; this node waits for it.
    WaitingForPreviousIncarnation,
    /// This node took leadership.
    Leads {
        /// Its term.
        term: Term,
    },
    /// This node gave up leadership.
    LeadershipLost {
        /// Why.
        reason: &'static str,
    },
    /// A member's key is gone.
    MemberGone {
        /// The member.
        node: NodeId,
    },
    /// A stored value could not be read (or a counter is at its maximum); the step was skipped.
    BadValue {
        /// Where.
        key: String,
        /// Why.
        reason: String,
    },
    /// This node took a membership slot.
    SlotTaken {
        /// The slot.
        slot: u32,
    },
    /// This node's slot key was lost; it takes a new one.
    SlotLost {
        /// The slot.
        slot: u32,
    },
    /// No keep-alive from this member for the unreachable threshold.
    Unreachable {
        /// The member.
        node: NodeId,
    },
    /// A member marked unreachable was heard again.
    ReachableAgain {
        /// The member.
        node: NodeId,
    },
    /// The unreachable members stayed the same for the stable window: this node races for the
    /// split-brain key after `delay_ms`.
    SplitBrainRace {
        /// Members this node reaches, itself included.
        reachable: usize,
        /// Members it cannot reach.
        unreachable: usize,
        /// Its wait before trying.
        delay_ms: u64,
    },
    /// This node won the split-brain race: its side survives, and these members are downed.
    SplitBrainWon {
        /// The members downed.
        downed: Vec<NodeId>,
    },
    /// Another member holds the split-brain key: its side decided.
    SplitBrainLost,
    /// A member that won the split-brain race downed this node: it stops its shards, deletes its
    /// keys and rejoins as a new incarnation.
    DownedBySplitBrain {
        /// The winner.
        by: NodeId,
    },
    /// Members hold keys but none answered a keep-alive yet: this node does not join a cluster
    /// it cannot reach.
    WaitingToReachAMember,
}

/// The membership a lease engine publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    /// Members and their status; the leader is set in it too.
    pub view: MembershipView,
    /// Who leads, and in which term.
    pub leader: Option<(NodeId, Term)>,
    /// Members' listen addresses, as their records give them.
    pub addresses: BTreeMap<NodeId, String>,
}

/// What the engine asks its runtime to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseCommand {
    /// Run a store operation and answer with [`LeaseEngine::handle_answer`](super::LeaseEngine::handle_answer)
    /// and this `id`. It replaces any operation still running: that one's answer is no longer
    /// wanted (it may still take effect in the store).
    Store {
        /// The operation's id.
        id: u64,
        /// The operation.
        op: StoreOp,
    },
    /// This node may host shards until `until` (ms, the engine's clock), exclusive.
    ExtendHosting {
        /// The end.
        until: u64,
    },
    /// This node may host nothing any more.
    RevokeHosting,
    /// The membership changed.
    Publish(LeaseView),
    /// Send a keep-alive to each of these members (node, listen address); each answers, and
    /// the runtime reports what it hears with
    /// [`LeaseEngine::handle_heard`](super::LeaseEngine::handle_heard).
    KeepAlive {
        /// The members.
        to: Vec<(NodeId, String)>,
    },
    /// Log (and count) this.
    Log(LeaseEvent),
}
