//! The split-brain resolver fed from what the engine knows: who is reachable, who is silent,
//! and what its decision means for this node; how long a downed member still counts as running.

use std::collections::{BTreeMap, BTreeSet};

use foca::Member;

use super::{connected, stale_after_ms, status_fresh, GossipConfig, GossipEngine, GossipEvent};
use crate::gossip::identity::GossipId;
use crate::gossip::split_brain_resolver::Resolution;
use crate::id::NodeId;
use crate::membership::{Member as ViewMember, MemberStatus};
use crate::split_brain::SplitBrainDecision;

impl GossipEngine {
    /// Feeds the resolver the members this node reaches and those it suspects, and carries out
    /// its decision: down the unreachable (through foca, which spreads it), or down this node.
    pub(super) fn resolve(&mut self, now: u64) {
        if self.declared_down || self.status == MemberStatus::Removed {
            return;
        }
        let Some(resolver) = self.resolver.as_mut() else { return };
        let member = |id: &GossipId| {
            id.node.as_ref().map(|n| {
                let mut m = ViewMember::new(n.clone(), n.incarnation).with_status(MemberStatus::Up);
                for r in &id.roles {
                    m = m.with_role(r.clone());
                }
                m
            })
        };
        let mut reachable: Vec<ViewMember> = member(&self.me).into_iter().collect();
        let mut unreachable = Vec::new();
        let mut suspects = Vec::new();
        // Probing finds unreachable members one per period; a node cut off from everyone would
        // take a period per member to find out, long after the others decided about it. Hearing
        // nothing at all for two periods says the same at once. So does hearing no answer to
        // anything it sent for a period per member and a probe's wait (every member is probed
        // in that time): a node whose own traffic is lost (a one-way cut) still hears the
        // others, whose statuses keep them "connected", while they find it silent and down it.
        // A node alone has nothing to be answered: the wait starts with its first member.
        if self.foca.num_members() == 0 {
            self.answered_at = now;
        }
        let members = self.foca.num_members() as u64 + 1;
        let round = members * self.config.probe_period_ms + self.config.probe_rtt_ms;
        let cut_off = now.saturating_sub(self.heard_at) >= 2 * self.config.probe_period_ms
            || now.saturating_sub(self.answered_at) >= round;
        for m in self.foca.iter_members() {
            if let Some(node) = &m.id().node {
                self.first_seen.entry(node.clone()).or_insert(now);
            }
            let connected =
                connected(&self.status_seen, &self.config, now, m) && !silent(&self.status_seen, &self.config, now, m);
            match m.state() {
                foca::State::Alive | foca::State::Suspect if !cut_off && connected => reachable.extend(member(m.id())),
                foca::State::Alive | foca::State::Suspect => {
                    unreachable.extend(member(m.id()));
                    suspects.push(m.id().clone());
                }
                foca::State::Down => {}
            }
        }
        // Every member is probed within one period per member: a shorter window could decide
        // before this node has even tried to reach some of the other side.
        let window = self.config.stable_after_ms.max(round);
        // A member that joined (or restarted) just before or during a partition may be known on
        // one side only: counted there as reachable, it could make both sides a majority (the
        // world found two sides that each kept themselves that way). Only members known for a
        // window before anyone became unreachable count on this node's side; unreachable ones
        // always count against it. That can only make a side lose, never both win.
        let since = resolver.first_unreachable().unwrap_or(now);
        let recent: BTreeSet<NodeId> = reachable
            .iter()
            .filter(|m| self.first_seen.get(&m.node).is_none_or(|at| at.saturating_add(window) > since))
            .map(|m| m.node.clone())
            .collect();
        let late = self.late_statuses(&reachable, now);
        let Some(resolver) = self.resolver.as_mut() else { return };
        let before = resolver.unreachable().cloned();
        let unstable = unstable_ms(&self.config);
        let resolution = resolver.observe(now, window, unstable, &reachable, &unreachable, &recent, cut_off);
        let after = resolver.unreachable().cloned();
        if before != after && after.is_some() {
            self.log(GossipEvent::Unreachable { nodes: after.unwrap_or_default() });
        } else if before.is_some() && after.is_none() && resolution.is_none() {
            self.log(GossipEvent::Unreachable { nodes: BTreeSet::new() });
        }
        match resolution {
            None => {}
            Some(Resolution::Unstable { unstable_ms }) => {
                self.declared_down = true;
                self.log(GossipEvent::DownedWhenUnstable { unstable_ms });
                self.log(GossipEvent::DeclaredDown);
            }
            // A member of no formed cluster yet (a restart that has not heard of a leader) has no
            // side to keep: the members it cannot reach may be the cluster, a leader among them
            // that hears nobody (a one-way cut) and never learns it was downed. It downs itself
            // instead, and its new incarnation tries again (nothing runs here yet).
            Some(Resolution::Decided(SplitBrainDecision::DownUnreachable)) if !self.formed => {
                self.declared_down = true;
                self.log(GossipEvent::DeclaredDown);
            }
            // A member counted reachable whose status is late may be on the other side of a
            // partition that SWIM has not found yet (one probe per period): the set is stable
            // but stale, and with that member counted here both sides can find themselves the
            // majority (the gossip world found a 3-against-1 decision made that way while the
            // other side saw 2 against 2 and kept the tie). The decision waits, its window
            // starting again, until every member counted reachable has sent a status within a
            // status period and a probe's wait, or has fallen silent and counts unreachable. The
            // time since anyone became unreachable keeps running, so a set that keeps being
            // deferred ends as an unstable one (this node downs itself) within the bound the
            // other side's margin covers.
            Some(Resolution::Decided(SplitBrainDecision::DownUnreachable)) if !late.is_empty() => {
                if let Some(resolver) = self.resolver.as_mut() {
                    resolver.defer(since);
                }
                self.log(GossipEvent::DecisionDeferred { late });
            }
            Some(Resolution::Decided(SplitBrainDecision::DownUnreachable)) => {
                let nodes: BTreeSet<NodeId> = suspects.iter().filter_map(|id| id.node.clone()).collect();
                self.log(GossipEvent::DownedUnreachable { nodes });
                let downs = suspects.into_iter().map(Member::down).collect::<Vec<_>>();
                if let Err(error) = self.foca.apply_many(downs.into_iter(), true, &mut self.runtime) {
                    self.log(GossipEvent::BadData { error: error.to_string() });
                }
            }
            // Gossip alone has no lease to acquire (refused at start): treated as losing.
            Some(Resolution::Decided(SplitBrainDecision::DownReachable | SplitBrainDecision::AcquireLease { .. })) => {
                self.declared_down = true;
                self.log(GossipEvent::DeclaredDown);
            }
        }
    }

    /// The members of `reachable` (other than this node) whose status has not advanced within
    /// a status period and a probe's wait (see the deferred decision in `resolve`).
    fn late_statuses(&self, reachable: &[ViewMember], now: u64) -> BTreeSet<NodeId> {
        let late_after = self.config.status_every_ms + self.config.probe_rtt_ms;
        reachable
            .iter()
            .filter(|m| self.me.node.as_ref() != Some(&m.node))
            // None (no status yet) is not late, as it is not silent: a member whose statuses
            // never arrive would otherwise hold every decision.
            .filter(|m| self.status_seen.get(&m.node).is_some_and(|(_, at)| now.saturating_sub(*at) > late_after))
            .map(|m| m.node.clone())
            .collect()
    }

    /// Whether the downed `node`, down since `since`, still counts as possibly running at `now`:
    /// with a resolver, for the margin, unless it was proven gone (see `proof`).
    pub(super) fn held_for_margin(&self, node: &NodeId, since: u64, now: u64) -> bool {
        self.resolver.is_some() && !self.gone.contains(node) && now < since + self.down_margin_ms()
    }

    /// How long a downed member still counts as possibly running. The two sides of a partition
    /// do not decide at the same moment: each finds the other side unreachable by probing one
    /// member per period, so a side may take up to a period per member longer to see a stable
    /// set than the other; and a side whose set never settles downs itself only once it has
    /// been unstable for the window and a bound more (the time the whole other side takes to
    /// fall silent, and three quarters of `stable_after`). The margin covers both, on top of the
    /// configured one.
    pub fn down_margin_ms(&self) -> u64 {
        #[cfg(feature = "fault-injection")]
        if self.config.fault_no_down_margin {
            return 0;
        }
        let members = self.foca.num_members() as u64 + self.down.len() as u64;
        self.config.down_margin_ms + members * self.config.probe_period_ms + unstable_ms(&self.config)
    }
}

/// How long past its window a resolver's unreachable set may keep changing before the node
/// downs itself: the time it takes every member of the other side to fall silent (statuses
/// stop arriving from the whole side at once, see [`silent`]), so that the surviving side never
/// downs itself while still discovering a clean partition, plus three quarters of
/// `stable_after`, as Akka's `down-all-when-unstable`. (Counting a probe period per member
/// instead, before members fell silent, made the margin outlast a 25 s cut.)
fn unstable_ms(config: &GossipConfig) -> u64 {
    stale_after_ms(config) + config.stable_after_ms / 4 * 3
}

/// For the resolver only: whether `m`'s statuses stopped arriving although it is not suspected
/// (yet). SWIM probes one member per period, so across a partition a member can stay unprobed,
/// and "alive", for longer than the resolver's window (the world found a side that counted the
/// other side's leader as its own that way); statuses stop arriving from the whole other side at
/// once. Only the resolver counts it unreachable: the view and the leader rule keep SWIM's word,
/// since a status that is merely late must not hold rebalancing or move leadership.
fn silent(
    status_seen: &BTreeMap<NodeId, (u64, u64)>,
    config: &GossipConfig,
    now: u64,
    m: &foca::Member<GossipId>,
) -> bool {
    m.state() == foca::State::Alive && status_fresh(status_seen, config, now, m) == Some(false)
}
