//! The view an engine publishes: its members with status and reachability (a member downed by
//! the resolver stays unreachable, not down, for the margin), and the leader once its term is
//! known.

use std::collections::BTreeMap;

use super::{GossipEngine, GossipView};
use crate::gossip::identity::GossipId;
use crate::id::NodeId;
use crate::membership::{Member as ViewMember, MemberStatus, MembershipView, PROXY_ROLE};

impl GossipEngine {
    pub(super) fn view_without_leader(&self) -> (MembershipView, BTreeMap<NodeId, String>) {
        let statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
        let mut view = MembershipView::new();
        let mut addresses = BTreeMap::new();
        let mut add = |id: &GossipId, status: MemberStatus, reachable: bool| {
            let Some(node) = id.node.clone() else { return };
            let mut m = ViewMember::new(node.clone(), node.incarnation)
                .with_status(status)
                .with_version(&id.app_version)
                .with_weight(id.weight);
            for r in &id.roles {
                m = m.with_role(r.clone());
            }
            if view.add(m).is_ok() {
                addresses.insert(node.clone(), id.addr.clone());
                let _ = view.set_reachable(&node, reachable);
            }
        };
        let me = if self.declared_down { MemberStatus::Down } else { self.status };
        add(&self.me, me, true);
        for m in self.foca.iter_members() {
            let id = m.id();
            let Some(node) = &id.node else { continue };
            // Not heard of its status yet: joining.
            let status = statuses.get(node).map_or(MemberStatus::Joining, |s| s.status);
            add(id, status, super::connected(&self.status_seen, &self.config, self.now, m));
        }
        for (node, (id, since)) in &self.down {
            let status = id.node.as_ref().and_then(|n| statuses.get(n)).map(|s| s.status);
            if status == Some(MemberStatus::Removed) {
                add(id, MemberStatus::Removed, false);
            } else if self.held_for_margin(node, *since, self.now) {
                // Downed, but its side may still be stopping: unreachable, shards not taken over.
                add(id, status.unwrap_or(MemberStatus::Up), false);
            } else {
                add(id, MemberStatus::Down, false);
            }
        }
        (view, addresses)
    }

    /// The membership as this node sees it.
    pub fn view(&self) -> GossipView {
        let (mut view, addresses) = self.view_without_leader();
        let leader = oldest_reachable_up(&view);
        let term = match &leader {
            Some(l) if *l == self.node => Some(self.term),
            Some(l) => self.statuses.lock().unwrap_or_else(|e| e.into_inner()).get(l).map(|s| s.leader_term),
            None => None,
        };
        // A leader is published once its term is known (it announces it in its status).
        let leader = leader.zip(term).filter(|(_, t)| *t > 0);
        let _ = view.set_leader(leader.as_ref().map(|(l, _)| l.clone()));
        GossipView { view, leader, addresses }
    }
}

/// The oldest `Up` reachable member that may lead (proxies never do).
fn oldest_reachable_up(view: &MembershipView) -> Option<NodeId> {
    view.members()
        .filter(|m| m.status == MemberStatus::Up && !m.roles.contains(PROXY_ROLE) && view.is_reachable(&m.node))
        .min_by(|a, b| (a.node.incarnation, &a.node).cmp(&(b.node.incarnation, &b.node)))
        .map(|m| m.node.clone())
}
