//! Who a member is, as SWIM knows it: its address (unique in the cluster), and the node
//! incarnation with the metadata that never changes while it runs.

use serde::{Deserialize, Serialize};

use crate::id::NodeId;

/// A member's identity in gossip.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GossipId {
    /// Its listen address: one member per address.
    pub addr: String,
    /// The node incarnation (None: a seed known only by its address, until it answers).
    pub node: Option<NodeId>,
    /// Its application version.
    pub app_version: String,
    /// Its roles.
    pub roles: Vec<String>,
    /// Its weight.
    pub weight: u32,
}

impl GossipId {
    /// A seed known only by its address: it loses to the real member at that address.
    pub fn seed(addr: impl Into<String>) -> Self {
        GossipId { addr: addr.into(), node: None, app_version: String::new(), roles: Vec::new(), weight: 1 }
    }
}

impl foca::Identity for GossipId {
    type Addr = String;

    /// Never: a node declared down stops its shards and comes back as a new incarnation, which
    /// its runtime starts.
    fn renew(&self) -> Option<Self> {
        None
    }

    fn addr(&self) -> String {
        self.addr.clone()
    }

    /// The newer incarnation at an address wins; a seed placeholder loses to any.
    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.node.as_ref().map(|n| n.incarnation) > adversary.node.as_ref().map(|n| n.incarnation)
    }
}
