//! What changes while a member runs — its status (`Up`, `Leaving`, …) and the term it leads in —
//! travels as foca's custom broadcasts: each member numbers its own updates, and a newer one
//! replaces an older one everywhere.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::identity::GossipId;
use crate::id::NodeId;
use crate::membership::MemberStatus;
use crate::shard_map::Term;

/// One member's latest update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct StatusItem {
    pub(super) node: NodeId,
    /// Grows with every update of this member.
    pub(super) version: u64,
    pub(super) status: MemberStatus,
    /// The term it leads in (0: it does not lead).
    pub(super) leader_term: Term,
    /// The largest term it has heard of: a successor must go above it even when the leader
    /// that held it has stepped down and cleared its own.
    pub(super) max_term: Term,
    /// Whether it is part of a formed cluster (it started one, or joined one that had a
    /// leader): a member that hears of one may lead.
    pub(super) formed: bool,
}

/// The latest update of every member, shared by the broadcast handler (inside foca) and the
/// engine.
pub(super) type Statuses = Arc<Mutex<BTreeMap<NodeId, StatusItem>>>;

/// A broadcast's key: a member's update replaces its older ones.
#[derive(Debug)]
pub(super) struct StatusKey {
    node: NodeId,
    version: u64,
}

impl foca::Invalidates for StatusKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.node == other.node && self.version >= other.version
    }
}

/// An update that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("unreadable status update: {0}")]
pub struct StatusError(String);

/// Keeps [`Statuses`] and tells foca which updates are new (to pass on).
pub(super) struct StatusBroadcasts(pub(super) Statuses);

impl foca::BroadcastHandler<GossipId> for StatusBroadcasts {
    type Key = StatusKey;
    type Error = StatusError;

    fn receive_item(&mut self, data: &[u8], _sender: Option<&GossipId>) -> Result<Option<StatusKey>, StatusError> {
        let item: StatusItem = postcard::from_bytes(data).map_err(|e| StatusError(e.to_string()))?;
        let mut table = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if table.get(&item.node).is_some_and(|known| known.version >= item.version) {
            return Ok(None);
        }
        let key = StatusKey { node: item.node.clone(), version: item.version };
        table.insert(item.node.clone(), item);
        Ok(Some(key))
    }
}
