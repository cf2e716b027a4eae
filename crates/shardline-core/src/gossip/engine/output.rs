//! What the engine hands its runtime: commands to carry out, events to log, and the view it
//! publishes. Apart from the engine because they are plain data the runtime matches on, with
//! no behaviour of their own.

use std::collections::{BTreeMap, BTreeSet};

use crate::gossip::identity::GossipId;
use crate::id::NodeId;
use crate::membership::MembershipView;
use crate::shard_map::Term;

/// The membership a gossip engine publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GossipView {
    /// Members, their status and reachability; the leader is set in it too.
    pub view: MembershipView,
    /// Who leads, and in which term.
    pub leader: Option<(NodeId, Term)>,
    /// Members' listen addresses.
    pub addresses: BTreeMap<NodeId, String>,
}

/// Something the runtime should log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GossipEvent {
    /// A member answered: this node is part of the cluster.
    Joined,
    /// This node leads, in `term`.
    Leads {
        /// The term.
        term: Term,
    },
    /// The split-brain resolver kept this side and downed the members it could not reach.
    DownedUnreachable {
        /// The members downed.
        nodes: BTreeSet<NodeId>,
    },
    /// A member was declared down.
    MemberDown {
        /// The member.
        node: NodeId,
    },
    /// A member's process is gone: its host refused a connection to its address, or another
    /// node answers there. It is down at once, with no margin (see
    /// [`AddressAnswer`](super::AddressAnswer)).
    MemberGone {
        /// The member.
        node: NodeId,
        /// What showed it.
        evidence: &'static str,
    },
    /// A member left after saying it was done (`Removed`).
    MemberLeft {
        /// The member.
        node: NodeId,
    },
    /// This node was declared down by the others: it must stop its shards and come back as a
    /// new incarnation.
    DeclaredDown,
    /// No majority answered this node within the window (paused, cut off, or sending into a
    /// void): it downs itself, as a node whose lease ran out does. [`DeclaredDown`](Self::DeclaredDown)
    /// follows.
    LostMajority {
        /// How long, in ms, no majority had answered.
        silent_ms: u64,
    },
    /// The resolver's set of unreachable members changed (empty: every member is reachable
    /// again). Decisions wait until it has stayed the same for `stable_after`.
    Unreachable {
        /// The members this node cannot reach.
        nodes: BTreeSet<NodeId>,
    },
    /// The unreachable set kept changing for too long to decide: this node downs itself (it
    /// stops its shards and rejoins as a new incarnation), whichever side it is on, so that
    /// the other side may take over once its margin ends. [`DeclaredDown`](Self::DeclaredDown)
    /// follows.
    DownedWhenUnstable {
        /// How long, in ms, members have been unreachable without a stable set.
        unstable_ms: u64,
    },
    /// The unreachable set was stable, but a member counted reachable had sent no status for
    /// a status period and a probe's wait: it may be cut off too, not yet probed. The decision
    /// waits, its window starting again.
    DecisionDeferred {
        /// The members counted reachable whose statuses are late.
        late: BTreeSet<NodeId>,
    },
    /// Data from the network that cannot be read (dropped; nothing else happens).
    BadData {
        /// Why.
        error: String,
    },
}

/// What the engine asks its runtime to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GossipCommand {
    /// Send `data` to the member `to` (at `to.addr`), to be handed to its engine's
    /// [`GossipEngine::handle_data`](super::GossipEngine::handle_data).
    Send {
        /// The member.
        to: GossipId,
        /// The message.
        data: Vec<u8>,
    },
    /// Connect to `member`'s address and say what answers there, to
    /// [`GossipEngine::handle_address`](super::GossipEngine::handle_address): asked of members
    /// that do not answer probes, since a host that refuses the connection proves what silence
    /// cannot, that the process is gone.
    CheckAddress {
        /// The member.
        member: GossipId,
    },
    /// The membership changed.
    Publish(GossipView),
    /// Log this.
    Log(GossipEvent),
}
