//! Until when this node may host: while a majority of its members answered it recently.
//!
//! The resolver stops the losing side of a partition, but only once that side decides, and a
//! process that is paused (a stall, a suspended VM, `SIGSTOP`) decides nothing: it wakes up with
//! work queued everywhere and runs it before its engine hears that it was downed. A one-way cut
//! is as bad: a node whose messages are lost still hears the others and keeps its view. Lease
//! providers fence such a node by its lease; gossip has none, so it makes one from the protocol
//! itself. A member that answers a message proves that it reached this node at least as late as
//! the message was sent; a majority of members (keep-majority's side, with its tie rule) that
//! answered messages sent within the last window proves that this node is not cut off from its
//! side. Without such answers it processes nothing; and once the bound has been granted, its
//! lapse is final, as a lease's: the node downs itself and comes back as a new incarnation. It
//! cannot know what happened meanwhile: its side may have downed it, or every other member may
//! have downed itself and a new cluster, which never knew this node, taken its shards (the
//! runtime's simulation found that one).
//!
//! Members known for less than the bound count only once they answered: a cluster that grows
//! from one member to many at once (parallel starts) would otherwise lapse its first member
//! before it has probed the newcomers. A member that never answered is counted the bound after
//! it was first seen, which the others' takeover (the window and the margin) outlasts. That
//! grace is for a node that hosts already or joined within the bound; one that has been a
//! member longer and was never granted the bound counts every member it knows.
//!
//! The bound is the resolver's window (`stable_after`, never less than a probe per member) and
//! one probe round more (a member may go almost two rounds between probes): the others take a
//! node's shards over only after they held it unreachable for that window and then for the down
//! margin, which is longer than a round, so a node that stops answering them — paused, cut off,
//! or sending into a void — has stopped processing before they can start. Times are those of
//! this node's sends (a probe's, kept by its number while the bound lasts): an answer that
//! waited in a socket across a pause carries the time it was asked for, not the time it was
//! read, so it extends nothing. The runtime checks the bound at every entry point, as it checks
//! a lease.

use std::collections::{BTreeMap, BTreeSet};

use super::{GossipEngine, GossipEvent};
use crate::id::NodeId;
use crate::membership::MemberStatus;

/// What this node sent that may be answered, and what was.
#[derive(Debug, Default)]
pub(super) struct Answers {
    /// When each probe of this node went out (a ping, a request to ping indirectly, a ping it
    /// relays), by the member it went to and the probe's number, while the bound lasts.
    sent: BTreeMap<(NodeId, u8), u64>,
    /// When this node first announced itself to each address while the bound lasts (a feed
    /// answers it: how a node that just joined is answered before its first probe).
    announced: BTreeMap<String, u64>,
    /// Per member, when the newest message it answered was sent.
    answered: BTreeMap<NodeId, u64>,
    /// The bound as last granted (its lapse is final from then on, whatever this node hears
    /// after it: a runtime checking the clock refused to host from then on).
    granted: Option<u64>,
}

impl GossipEngine {
    /// Until when this node may host shards (engine time, exclusive): while members that make a
    /// majority (keep-majority's side, with its tie rule) answered messages it sent within the
    /// bound (see the module docs). None: no bound, without a split-brain resolver (a partition hosts on both sides
    /// anyway). Zero while this node is part of no formed cluster (it has heard of no leader),
    /// and once it was declared down or left.
    ///
    /// ```
    /// use shardline_core::gossip::{GossipConfig, GossipEngine, GossipId};
    /// use shardline_core::NodeId;
    ///
    /// let me = GossipId {
    ///     addr: "127.0.0.1:7000".into(),
    ///     node: Some(NodeId::new("a", 1)),
    ///     app_version: "1".into(),
    ///     roles: Vec::new(),
    ///     weight: 1,
    /// };
    /// let e = GossipEngine::new(GossipConfig::default(), me, &[], 0, 1).unwrap();
    /// // Alone, it is its own majority: it may host for the bound from now.
    /// assert!(e.hosting_until().unwrap() > 0);
    /// ```
    pub fn hosting_until(&self) -> Option<u64> {
        self.resolver.as_ref()?;
        #[cfg(feature = "fault-injection")]
        if self.config.fault_host_without_majority {
            return Some(u64::MAX);
        }
        // A member of no formed cluster has no leader to be given shards by; one that joined
        // while it could hear nobody would otherwise be a majority of one.
        if self.declared_down || self.status == MemberStatus::Removed || !self.formed {
            return Some(0);
        }
        let bound = self.hosting_bound_ms();
        // The grace of members met recently is for a node that hosts already, or joined just
        // now: nobody can have downed it yet. One that has been a member for the bound without
        // ever being granted it may have been downed meanwhile (the gossip world found one paused
        // before it heard of a leader: it woke to a cluster it had never probed, which had
        // downed it, and counting none of those members it was a majority of one); every
        // member it knows counts.
        let overdue =
            self.answers.granted.is_none() && self.joined_at.is_some_and(|at| at.saturating_add(bound) <= self.now);
        let known_long =
            |node: &NodeId| overdue || self.first_seen.get(node).is_some_and(|at| at.saturating_add(bound) <= self.now);
        let members: Vec<&NodeId> = self
            .foca
            .iter_members()
            .filter(|m| m.state() != foca::State::Down)
            .filter_map(|m| m.id().node.as_ref())
            .collect();
        let counted: Vec<&NodeId> = members
            .iter()
            .copied()
            .filter(|node| known_long(node) || self.answers.answered.contains_key(*node))
            .collect();
        let n = counted.len() + 1;
        let answered = |node: &NodeId| self.answers.answered.get(node).copied();
        // The newest time by which `k` members of `others` (and this node) had all answered.
        let newest = |k: usize, others: &mut dyn Iterator<Item = &NodeId>| -> Option<u64> {
            if k == 0 {
                return Some(self.now);
            }
            let mut times: Vec<u64> = others.filter_map(&answered).collect();
            times.sort_unstable_by(|a, b| b.cmp(a));
            times.get(k - 1).copied()
        };
        // More than half of the members.
        let mut since = newest(n / 2, &mut counted.iter().copied());
        // Exactly half, holding the lowest member (keep-majority's tie rule); not while members
        // are left out as recent (the gossip world found a node that woke from a pause and,
        // counting one silent member of three, held the lowest of the two).
        if n % 2 == 0 && counted.len() == members.len() {
            let lowest = counted.iter().copied().min().filter(|l| **l < self.node);
            let tie = match lowest {
                None => newest(n / 2 - 1, &mut counted.iter().copied()),
                // Of two, the other one holds the lowest: no half holds it and this node.
                Some(_) if n == 2 => None,
                Some(l) => {
                    let rest = newest(n / 2 - 2, &mut counted.iter().copied().filter(|m| *m != l));
                    rest.zip(answered(l)).map(|(a, b)| a.min(b))
                }
            };
            since = since.max(tie);
        }
        Some(since.map_or(0, |s| s.saturating_add(bound)))
    }

    /// Downs this node when its bound, once granted, has run out (see the module docs).
    /// The bound that ran out may have been granted before this input, or computed from it:
    /// whichever ran out first (a node that wakes from a pause may find answers enough in what
    /// it reads, but it was not allowed to host while it slept, and cannot know what moved).
    pub(super) fn check_majority(&mut self, now: u64) {
        if self.declared_down || self.status == MemberStatus::Removed {
            return;
        }
        let Some(until) = self.hosting_until() else { return };
        let lapsed = match self.answers.granted {
            Some(granted) => now >= granted || now >= until,
            None => false,
        };
        if lapsed {
            let since = self.answers.granted.unwrap_or(until).min(until);
            self.declared_down = true;
            self.log(GossipEvent::LostMajority { silent_ms: now.saturating_sub(since) + self.hosting_bound_ms() });
            self.log(GossipEvent::DeclaredDown);
        } else if until > now {
            self.answers.granted = Some(until);
        }
    }

    /// When the bound runs out, once granted (for `poll_timeout`).
    pub(super) fn majority_deadline(&self) -> Option<u64> {
        self.answers.granted.filter(|_| !self.declared_down)
    }

    /// How long an answer counts: the resolver's window and a probe round (see the module
    /// docs). SWIM probes each member once a round in a random order, so two probes of one
    /// member can be almost two rounds apart; the others' margin is longer than a round.
    pub(super) fn hosting_bound_ms(&self) -> u64 {
        let members = self.foca.num_members() as u64 + 1;
        let round = members * self.config.probe_period_ms + self.config.probe_rtt_ms;
        self.config.stable_after_ms.max(round) + round
    }

    /// Records a probe or an announce this node sends (to `header.dst`), to credit its answer
    /// with its time.
    pub(super) fn note_sent(&mut self, now: u64, header: &foca::Header<super::GossipId>) {
        use foca::Message;
        if matches!(header.message, Message::Announce) {
            self.answers.announced.entry(header.dst.addr.clone()).or_insert(now);
            return;
        }
        let Some(to) = header.dst.node.as_ref() else { return };
        let number = match &header.message {
            Message::Ping(n) => *n,
            Message::PingReq { probe_number, .. } | Message::IndirectPing { probe_number, .. } => *probe_number,
            _ => return,
        };
        // The earliest send under one key: an answer proves no more than that.
        self.answers.sent.entry((to.clone(), number)).or_insert(now);
    }

    /// Credits the sender of an answer (`header`, just received) with the time of what it answers.
    pub(super) fn note_answer(&mut self, header: &foca::Header<super::GossipId>) {
        use foca::Message;
        let Some(from) = header.src.node.clone() else { return };
        let asked = match &header.message {
            Message::Ack(n) => self.answers.sent.get(&(from.clone(), *n)),
            Message::ForwardedAck { probe_number, .. } | Message::IndirectAck { probe_number, .. } => {
                self.answers.sent.get(&(from.clone(), *probe_number))
            }
            Message::Feed => self.answers.announced.get(&header.src.addr),
            _ => return,
        };
        if let Some(at) = asked.copied() {
            let newest = self.answers.answered.entry(from).or_insert(at);
            *newest = (*newest).max(at);
        }
    }

    /// Forgets sends older than the bound (their answers could extend nothing, and probe
    /// numbers come round again) and members no longer known.
    pub(super) fn forget_old_sends(&mut self, now: u64) {
        let bound = self.hosting_bound_ms();
        self.answers.sent.retain(|_, at| now.saturating_sub(*at) < bound);
        self.answers.announced.retain(|_, at| now.saturating_sub(*at) < bound);
        let known: BTreeSet<NodeId> = self.foca.iter_members().filter_map(|m| m.id().node.clone()).collect();
        self.answers.answered.retain(|node, _| known.contains(node));
    }
}
