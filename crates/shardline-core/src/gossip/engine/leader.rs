//! Who leads: the oldest reachable `Up` member, with a term above every term heard of, taken
//! only while no other member claims to lead.

use super::{connected, stale_after_ms, GossipEngine, GossipEvent};
use crate::gossip::rng::SeededRng;
use crate::id::NodeId;
use crate::membership::{MemberStatus, PROXY_ROLE};
use crate::shard_map::Term;

impl GossipEngine {
    /// Takes (or gives up) leadership: the oldest reachable member whose status is `Up` (or not
    /// known yet: it may be an older leader) leads, with a term above every term this node has
    /// heard of. A node leads only in a formed cluster: the first seed forms one when its grace
    /// is over, and a member is part of one once it hears of a leader's term or of a member that
    /// is.
    pub(super) fn lead(&mut self, now: u64) {
        let (heard, formed, led) = {
            let statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
            let heard = statuses.values().map(|s| s.max_term.max(s.leader_term)).max().unwrap_or(0);
            let led = statuses.values().filter(|s| s.leader_term != 0).max_by_key(|s| s.leader_term);
            (heard, statuses.values().any(|s| s.formed), led.map(|s| (s.leader_term, s.node.clone())))
        };
        if heard > self.max_term {
            self.max_term = heard;
            self.max_term_at = now;
        }
        if led.as_ref().is_some_and(|(t, _)| self.max_leader.as_ref().is_none_or(|(known, _)| t > known)) {
            self.max_leader = led;
        }
        // A first seed that rejoins starts no cluster while it reaches nobody: the cluster that
        // outlived it may be just out of reach (it hears nothing through a one-way cut, or is
        // alone on its side of a partition), and would have downed it. Once it reaches members
        // and none of them is part of a formed cluster, that cluster is gone (they restarted
        // too): it forms one again after its grace, as at a first start.
        //
        // A member whose status has not arrived may be part of one: a leader whose own traffic
        // in is cut sends only announces, which carry no status, and never answers. The seed
        // waits for every member's status (the grace starts again when one turns up without);
        // it once formed a second cluster beside such a leader, which showed it down as it ran.
        if self.rejoining_seed && !self.formed {
            let known = {
                let statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
                self.foca.iter_members().all(|m| m.id().node.as_ref().is_some_and(|n| statuses.contains_key(n)))
            };
            if formed || heard != 0 || self.foca.num_members() == 0 || !known {
                self.bootstrap_at = None;
            } else if self.bootstrap_at.is_none() {
                self.bootstrap_at = Some(now + self.config.bootstrap_grace_ms);
            }
        }
        // A cluster where nobody may lead (every member restarted, and the first seed is not the
        // oldest) must still get a leader: the first seed forms it, and says so.
        let formed = heard > 0 || formed || self.bootstrap_at.is_some_and(|t| now >= t);
        if formed && !self.formed {
            self.formed = true;
            self.broadcast_status(now);
        }
        let leads = self.formed && !self.declared_down && self.first_in_line() == Some(self.node.clone());
        // A leader that hears of a higher term (a member that led apart from it: a first seed
        // restarted alone, the other side of a healed partition) takes a term above it: regions
        // follow the highest term they have seen and would refuse its coordinator for good. It
        // waits, as a member about to lead for the first time does, until no other member it
        // reaches claims to lead: two members whose views disagree for a moment (a rejoined
        // node that lacks the others' statuses finds itself first in line) would otherwise
        // outbid each other's terms until they agree. The one that is not first in line gives up
        // at once, which ends the claim.
        let outranked = self.term != 0 && self.max_term > self.term;
        if leads && (self.term == 0 || outranked) && !self.another_leads() {
            self.term = term_above(self.max_term.max(self.config.term_floor), self.tag);
            self.max_term = self.term;
            self.max_term_at = now;
            self.max_leader = Some((self.term, self.node.clone()));
            let term = self.term;
            self.log(GossipEvent::Leads { term });
            self.broadcast_status(now);
        } else if !leads && self.term != 0 {
            self.term = 0;
            self.broadcast_status(now);
        }
    }

    /// Whether a member other than this one may lead: its latest status says it leads, and this
    /// node reaches it or its statuses still arrive (relayed by others) without it being down. The
    /// second kind matters to a member that just joined: SWIM may not have told it of every
    /// member yet, while the leader's status already reached it through one that it knows; it
    /// found itself first in line among the few members it knew, and led a moment, long enough
    /// for its coordinator to give away shards that members it did not know still hosted.
    ///
    /// The leader of the newest term heard of counts as such a member until its status has had
    /// time to arrive when this node does not know who it is: it heard of the term second-hand
    /// (from a member that does not lead, such as a proxy that relays the cluster's term in its
    /// own status), and the leader may well be alive, just not known to it yet. Taking a term at
    /// once, a rejoined member that so far reached only such a member led a moment, and its
    /// coordinator gave away shards that the leader's side still hosted (a 2|2 partition test,
    /// healed with the rejoined member cut from the leader's side but not from the load driver).
    fn another_leads(&self) -> bool {
        let stale = stale_after_ms(&self.config);
        let newest = self.max_term;
        let unknown = newest != 0
            && newest != self.term
            && self.max_leader.as_ref().is_none_or(|(t, _)| *t != newest)
            && self.now.saturating_sub(self.max_term_at) < stale;
        if unknown {
            return true;
        }
        let statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
        let reached = self
            .foca
            .iter_members()
            .filter(|m| connected(&self.status_seen, &self.config, self.now, m))
            .filter_map(|m| m.id().node.clone())
            .any(|n| n != self.node && statuses.get(&n).is_some_and(|s| s.leader_term != 0));
        reached
            || statuses
                .iter()
                .filter(|(n, s)| **n != self.node && s.leader_term != 0 && !self.down.contains_key(*n))
                .any(|(n, _)| self.status_seen.get(n).is_some_and(|(_, at)| self.now.saturating_sub(*at) < stale))
    }

    /// The member that should lead as far as this node can tell: the oldest reachable
    /// non-proxy member that is `Up` or whose status has not arrived yet.
    fn first_in_line(&self) -> Option<NodeId> {
        let statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
        let mut candidates: Vec<NodeId> = self
            .foca
            .iter_members()
            .filter(|m| connected(&self.status_seen, &self.config, self.now, m))
            .filter(|m| !m.id().roles.iter().any(|r| r == PROXY_ROLE))
            .filter_map(|m| m.id().node.clone())
            .filter(|n| statuses.get(n).is_none_or(|s| s.status == MemberStatus::Up))
            .collect();
        if self.status == MemberStatus::Up && !self.me.roles.iter().any(|r| r == PROXY_ROLE) {
            candidates.push(self.node.clone());
        }
        candidates.into_iter().min_by(|a, b| (a.incarnation, a).cmp(&(b.incarnation, b)))
    }
}

/// A term above `above` for a member whose tag is `tag`: a counter one above `above`'s in the
/// high half, the tag in the low half. Two members that take a term at once (each believing it is
/// first in line) take different ones unless their tags are equal.
///
/// ```
/// use shardline_core::gossip::term_above;
///
/// let (a, b) = (term_above(7, 1), term_above(7, 2));
/// assert!(a > 7 && b > 7 && a != b);
/// assert!(term_above(a.max(b), 1) > a.max(b));
/// ```
pub fn term_above(above: Term, tag: u32) -> Term {
    (((above >> 32) + 1) << 32) | Term::from(tag)
}

/// A non-zero tag from the engine's seed (a different draw than foca's).
pub(super) fn term_tag(seed: u64) -> u32 {
    let mut rng = SeededRng::new(seed ^ 0x7E4A_11D5_3C2B_9F01);
    loop {
        let tag = rand_core::Rng::next_u32(&mut rng);
        if tag != 0 {
            return tag;
        }
    }
}
