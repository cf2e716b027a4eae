//! The membership view: which nodes are in the cluster, in what state, and who leads.
//!
//! Membership providers (seed nodes, gossip, etcd or NATS leases) all feed one
//! [`MembershipView`]; the coordinator reads it to decide who may host shards. A member's status
//! only moves along legal transitions ([`MemberStatus::can_become`]), so a `Down` node never
//! comes back `Up`: a restarted node is a new [`NodeId`] incarnation.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::id::NodeId;

/// Lifecycle of a member.
///
/// ```text
/// Joining ─► Up ─► Leaving ─► Exiting ─► Removed
///    │        │       │          │          ▲
///    └────────┴───────┴──────────┴─► Down ──┘
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemberStatus {
    /// Announced itself, not yet allowed to host shards.
    Joining,
    /// A full member; may host shards.
    Up,
    /// Leaving gracefully: its shards are being handed off.
    Leaving,
    /// Has handed everything off and is about to stop.
    Exiting,
    /// Gone for good.
    Removed,
    /// Declared dead (lease expired or downed by the split-brain resolver): fenced.
    Down,
}

impl MemberStatus {
    /// Whether a member in this status may move to `next`.
    pub fn can_become(self, next: MemberStatus) -> bool {
        use MemberStatus::*;
        matches!(
            (self, next),
            (Joining, Up | Leaving | Down)
                | (Up, Leaving | Down)
                | (Leaving, Exiting | Down)
                | (Exiting, Removed | Down)
                | (Down, Removed)
        )
    }

    /// Whether a member in this status may be given new shards.
    pub fn may_host(self) -> bool {
        self == MemberStatus::Up
    }

    /// Whether the member is known to be stopped (its shards may be moved without hand-off).
    pub fn is_fenced(self) -> bool {
        matches!(self, MemberStatus::Down | MemberStatus::Removed)
    }
}

/// An application version, compared numerically per dot-separated part (`"1.10" > "1.9"`);
/// non-numeric parts compare as text. Used by the `VersionAware` strategy.
#[derive(Clone, Debug, Default, Eq, Serialize, Deserialize)]
pub struct AppVersion(pub Arc<str>);

impl AppVersion {
    /// Creates a version from its text.
    pub fn new(v: impl AsRef<str>) -> Self {
        AppVersion(Arc::from(v.as_ref()))
    }
}

impl PartialEq for AppVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl PartialOrd for AppVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for AppVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        let mut a = self.0.split('.');
        let mut b = other.0.split('.');
        loop {
            match (a.next(), b.next()) {
                (None, None) => return Ordering::Equal,
                (None, Some(_)) => return Ordering::Less,
                (Some(_), None) => return Ordering::Greater,
                (Some(x), Some(y)) => {
                    let ord = match (x.parse::<u64>(), y.parse::<u64>()) {
                        (Ok(x), Ok(y)) => x.cmp(&y),
                        _ => x.cmp(y),
                    };
                    if ord != Ordering::Equal {
                        return ord;
                    }
                }
            }
        }
    }
}

impl fmt::Display for AppVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The role of a node that routes but never hosts (a load driver, a gateway).
pub const PROXY_ROLE: &str = "proxy";

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Who it is.
    pub node: NodeId,
    /// Where it is in its lifecycle.
    pub status: MemberStatus,
    /// The application version it runs (rolling updates).
    pub app_version: AppVersion,
    /// Relative capacity (consistent hashing gives it `150 × weight` virtual nodes). At least 1.
    pub weight: u32,
    /// Roles; a region for a type restricted to a role only runs on members with that role.
    pub roles: BTreeSet<String>,
    /// Numbered membership slot (lease providers), ordering members for the `Ranges` strategy.
    pub slot: Option<u32>,
    /// Order of joining: lower is older. The oldest `Up` member leads under seed membership.
    pub up_number: u64,
}

impl Member {
    /// A `Joining` member with weight 1, version `"0"`, no roles and no slot.
    pub fn new(node: NodeId, up_number: u64) -> Self {
        Member {
            node,
            status: MemberStatus::Joining,
            app_version: AppVersion::new("0"),
            weight: 1,
            roles: BTreeSet::new(),
            slot: None,
            up_number,
        }
    }

    /// Sets the application version.
    pub fn with_version(mut self, v: impl AsRef<str>) -> Self {
        self.app_version = AppVersion::new(v);
        self
    }

    /// Sets the weight (0 is treated as 1).
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight.max(1);
        self
    }

    /// Sets the membership slot.
    pub fn with_slot(mut self, slot: u32) -> Self {
        self.slot = Some(slot);
        self
    }

    /// Adds a role.
    pub fn with_role(mut self, role: impl Into<String>) -> Self {
        self.roles.insert(role.into());
        self
    }

    /// Sets the status (no transition check: for building views).
    pub fn with_status(mut self, status: MemberStatus) -> Self {
        self.status = status;
        self
    }

    /// Whether this member is a proxy: it routes messages but never hosts a shard, so nobody
    /// waits for its report or hands it a shard.
    pub fn is_proxy(&self) -> bool {
        self.roles.contains(PROXY_ROLE)
    }

    /// Whether this member may host shards of a type restricted to `role` (None: any member).
    pub fn may_host(&self, role: Option<&str>) -> bool {
        self.status.may_host() && !self.is_proxy() && role.is_none_or(|r| self.roles.contains(r))
    }
}

/// A membership change that breaks the rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// The node is not a member.
    #[error("{0} is not a member")]
    UnknownMember(NodeId),
    /// The node is already a member.
    #[error("{0} is already a member")]
    AlreadyMember(NodeId),
    /// The status change is not allowed.
    #[error("{node} cannot go from {from:?} to {to:?}")]
    IllegalTransition {
        /// The member.
        node: NodeId,
        /// Its status.
        from: MemberStatus,
        /// The refused status.
        to: MemberStatus,
    },
    /// A leader must be a member that is not fenced.
    #[error("{0} cannot lead: not a live member")]
    IneligibleLeader(NodeId),
}

/// Why the coordinator may not rebalance now ([`MembershipView::rebalance_hold`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RebalanceHold {
    /// A member that may host is still joining: shards moved now would move again once it is Up.
    Joining(NodeId),
    /// A member cannot be reached: the view may be wrong about it (it may be down, or about to be
    /// downed), and a hand-off to or from it cannot complete.
    Unreachable(NodeId),
}

/// The cluster as one node sees it: members by id, which of them this node cannot reach, and the
/// current leader.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipView {
    members: BTreeMap<NodeId, Member>,
    leader: Option<NodeId>,
    /// Members the provider's failure detector cannot reach now. Not a status: reachability comes
    /// and goes, and only `Down` fences a member.
    unreachable: BTreeSet<NodeId>,
}

impl MembershipView {
    /// An empty view.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a member. It keeps the status it carries (providers may learn of members already `Up`).
    pub fn add(&mut self, member: Member) -> Result<(), MembershipError> {
        if self.members.contains_key(&member.node) {
            return Err(MembershipError::AlreadyMember(member.node));
        }
        self.members.insert(member.node.clone(), member);
        Ok(())
    }

    /// Moves a member to a new status along a legal transition. Setting the status it already has
    /// is a no-op.
    pub fn set_status(&mut self, node: &NodeId, to: MemberStatus) -> Result<(), MembershipError> {
        let m = self.members.get_mut(node).ok_or_else(|| MembershipError::UnknownMember(node.clone()))?;
        if m.status == to {
            return Ok(());
        }
        if !m.status.can_become(to) {
            return Err(MembershipError::IllegalTransition { node: node.clone(), from: m.status, to });
        }
        m.status = to;
        if to.is_fenced() && self.leader.as_ref() == Some(node) {
            self.leader = None;
        }
        Ok(())
    }

    /// Forgets `Removed` members.
    pub fn prune_removed(&mut self) {
        self.members.retain(|_, m| m.status != MemberStatus::Removed);
        let members = &self.members;
        self.unreachable.retain(|n| members.contains_key(n));
    }

    /// Marks a member unreachable, or reachable again, as the provider's failure detector sees it.
    pub fn set_reachable(&mut self, node: &NodeId, reachable: bool) -> Result<(), MembershipError> {
        if !self.members.contains_key(node) {
            return Err(MembershipError::UnknownMember(node.clone()));
        }
        if reachable {
            self.unreachable.remove(node);
        } else {
            self.unreachable.insert(node.clone());
        }
        Ok(())
    }

    /// Whether `node` is reachable (every member is, unless the provider said otherwise).
    pub fn is_reachable(&self, node: &NodeId) -> bool {
        !self.unreachable.contains(node)
    }

    /// Live members this node cannot reach, ordered by id (a fenced member's reachability no
    /// longer matters).
    pub fn unreachable(&self) -> impl Iterator<Item = &NodeId> {
        self.unreachable.iter().filter(|n| self.members.get(*n).is_some_and(|m| !m.status.is_fenced()))
    }

    /// Why shards of a type restricted to `role` may not be rebalanced now, if anything holds it
    /// (Akka's convergence): a member that may host it is `Joining`, or any live member is
    /// unreachable. Shards without a live owner are still placed meanwhile, and a leaving member
    /// still hands its shards over.
    ///
    /// ```
    /// use shardline_core::{Member, MemberStatus, MembershipView, NodeId, RebalanceHold};
    ///
    /// let (a, b) = (NodeId::new("a", 1), NodeId::new("b", 1));
    /// let mut view = MembershipView::new();
    /// view.add(Member::new(a.clone(), 1).with_status(MemberStatus::Up)).unwrap();
    /// view.add(Member::new(b.clone(), 2)).unwrap(); // Joining
    /// assert_eq!(view.rebalance_hold(None), Some(RebalanceHold::Joining(b.clone())));
    /// view.set_status(&b, MemberStatus::Up).unwrap();
    /// view.set_reachable(&b, false).unwrap();
    /// assert_eq!(view.rebalance_hold(None), Some(RebalanceHold::Unreachable(b.clone())));
    /// view.set_reachable(&b, true).unwrap();
    /// assert_eq!(view.rebalance_hold(None), None);
    /// ```
    pub fn rebalance_hold(&self, role: Option<&str>) -> Option<RebalanceHold> {
        if let Some(n) = self.unreachable().next() {
            return Some(RebalanceHold::Unreachable(n.clone()));
        }
        self.members
            .values()
            .find(|m| m.status == MemberStatus::Joining && !m.is_proxy() && role.is_none_or(|r| m.roles.contains(r)))
            .map(|m| RebalanceHold::Joining(m.node.clone()))
    }

    /// Sets the leader (None: no leader right now).
    pub fn set_leader(&mut self, leader: Option<NodeId>) -> Result<(), MembershipError> {
        if let Some(l) = &leader {
            match self.members.get(l) {
                Some(m) if !m.status.is_fenced() => {}
                _ => return Err(MembershipError::IneligibleLeader(l.clone())),
            }
        }
        self.leader = leader;
        Ok(())
    }

    /// The current leader.
    pub fn leader(&self) -> Option<&NodeId> {
        self.leader.as_ref()
    }

    /// A member by id.
    pub fn get(&self, node: &NodeId) -> Option<&Member> {
        self.members.get(node)
    }

    /// All members, ordered by id.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// Number of members (any status).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when there are no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Members that may host shards restricted to `role`, ordered by id.
    pub fn hosts(&self, role: Option<&str>) -> Vec<Member> {
        self.members.values().filter(|m| m.may_host(role)).cloned().collect()
    }

    /// Whether a member other than `me` may take over shards restricted to `role`. A leaving
    /// node with no such member has nowhere to hand its shards: it stops them itself instead of
    /// waiting for a hand-off nobody can take.
    ///
    /// ```
    /// use shardline_core::{Member, MemberStatus, MembershipView, NodeId};
    ///
    /// let (a, b) = (NodeId::new("a", 1), NodeId::new("b", 1));
    /// let mut view = MembershipView::new();
    /// view.add(Member::new(a.clone(), 1).with_status(MemberStatus::Leaving)).unwrap();
    /// view.add(Member::new(b.clone(), 2).with_status(MemberStatus::Up)).unwrap();
    /// assert!(view.has_successor(&a, None));
    /// view.set_status(&b, MemberStatus::Down).unwrap();
    /// assert!(!view.has_successor(&a, None));
    /// ```
    pub fn has_successor(&self, me: &NodeId, role: Option<&str>) -> bool {
        self.members.values().any(|m| &m.node != me && m.may_host(role))
    }

    /// The oldest `Up` member (lowest `up_number`, then id): the leader under seed membership.
    pub fn oldest_up(&self) -> Option<&Member> {
        self.members
            .values()
            .filter(|m| m.status == MemberStatus::Up)
            .min_by(|a, b| a.up_number.cmp(&b.up_number).then_with(|| a.node.cmp(&b.node)))
    }

    /// Whether `node` is known to be stopped: `Down`, `Removed`, or replaced by a newer
    /// incarnation of the same name.
    pub fn is_fenced(&self, node: &NodeId) -> bool {
        match self.members.get(node) {
            Some(m) => m.status.is_fenced(),
            None => self.members.keys().any(|n| n.same_name(node) && n.incarnation > node.incarnation),
        }
    }
}
