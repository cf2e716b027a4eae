//! What the engine keeps in the store: member records, the leader record, the term counter, slot
//! holders and the split-brain key, as typed values. The runtime encodes and decodes them; a
//! value it cannot decode reaches the engine as an error, never as a default.

use serde::{Deserialize, Serialize};

use crate::id::NodeId;
use crate::membership::MemberStatus;
use crate::shard_map::Term;

/// A key's revision in the store: grows at every write.
pub type Revision = u64;

/// A member's key: who it is, where it listens, and what the view says of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// The node.
    pub node: NodeId,
    /// Its listen address, as text.
    pub addr: String,
    /// Its status as it reports it (`Up`, `Leaving`, …).
    pub status: MemberStatus,
    /// Its application version.
    pub app_version: String,
    /// Its roles.
    pub roles: Vec<String>,
    /// Its weight.
    pub weight: u32,
    /// Its membership slot (numbered slots).
    pub slot: Option<u32>,
    /// Members this node's side downed as the winner of a split-brain race: the flag every
    /// member reads in its listings. A member named here stops its shards and rejoins as a new
    /// incarnation.
    pub downed: Vec<NodeId>,
}

impl MemberRecord {
    /// The record of a member that is `Up`, with no roles, weight 1, no slot and nobody downed.
    ///
    /// ```
    /// use shardline_core::lease::MemberRecord;
    /// use shardline_core::NodeId;
    ///
    /// let me = MemberRecord { weight: 2, ..MemberRecord::up(NodeId::new("n1", 1), "127.0.0.1:7001", "1") };
    /// assert!(me.downed.is_empty() && me.slot.is_none());
    /// ```
    pub fn up(node: NodeId, addr: impl Into<String>, app_version: impl Into<String>) -> Self {
        MemberRecord {
            node,
            addr: addr.into(),
            status: MemberStatus::Up,
            app_version: app_version.into(),
            roles: Vec::new(),
            weight: 1,
            slot: None,
            downed: Vec::new(),
        }
    }
}

/// The leader key: who leads, and in which term.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    /// The leader.
    pub node: NodeId,
    /// Its term, taken from the counter before the key was claimed.
    pub term: Term,
}

/// The split-brain key: the node that won the race, and the members its side downed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitBrainRecord {
    /// The winner.
    pub winner: NodeId,
    /// The members it could not reach when it won.
    pub downed: Vec<NodeId>,
}

/// A value written to or read from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreValue {
    /// A member key's value.
    Member(MemberRecord),
    /// The leader key's value.
    Leader(LeaderRecord),
    /// The term counter's value: the last term taken.
    Term(Term),
    /// A slot key's value: the node that holds the slot.
    SlotHolder(NodeId),
    /// The split-brain key's value.
    SplitBrain(SplitBrainRecord),
}

/// Which kind of value a read expects (the runtime decodes accordingly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// [`StoreValue::Member`].
    Member,
    /// [`StoreValue::Leader`].
    Leader,
    /// [`StoreValue::Term`].
    Term,
    /// [`StoreValue::SlotHolder`].
    SlotHolder,
    /// [`StoreValue::SplitBrain`].
    SplitBrain,
}

/// A key read from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEntry {
    /// The key.
    pub key: String,
    /// Its value, or why it could not be decoded (never replaced by a default).
    pub value: Result<StoreValue, String>,
    /// Its revision.
    pub revision: Revision,
}
