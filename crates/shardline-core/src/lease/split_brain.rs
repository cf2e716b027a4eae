//! Keep-alives between members and the split-brain race (the lease engine's [`PeerChecks`]).
//!
//! A store only tells who holds a key, not who can talk to whom: a member cut from its peers but
//! not from the store keeps its key, its shards and its place in every view, unreachable for as
//! long as the cut lasts. So members send each other keep-alives, and when some stay silent:
//!
//! 1. they are unreachable in the published view (no rebalance starts, nothing is placed on them);
//! 2. once the unreachable members have stayed the same for `stable_after_ms`, every member that
//!    sees some races for one ephemeral key, `{cluster}/split-brain`, after a delay that shrinks
//!    with the share of members it still reaches (none for a majority), so the larger side
//!    usually wins;
//! 3. the winner names the members it cannot reach in its own member record, the flag every
//!    member reads in its listings; a member named there revokes its hosting, deletes its keys
//!    and rejoins as a new incarnation. The winner's side takes their shards once their keys are
//!    gone, as after any departure: deleting only after hosting stopped keeps "a member may host
//!    only while its key lives".
//!
//! A member that cannot reach the store cannot win, read the flag or renew: its lease fences it.
//! A member that loses the race and is not named is on the winner's side. A new incarnation whose
//! peers hold keys joins only once the leader (without one, any member) answers, so a member
//! still cut off does not come back as an unreachable member, be downed again, and so on. It reads
//! who leads first (a leader it has not read is not "no leader"), and members a winner names do
//! not count: they are leaving, on the other side of the cut from the winner.

use std::collections::{BTreeMap, BTreeSet};

use super::command::{LeaseCommand, LeaseEvent, StoreAnswer, StoreOp};
use super::engine::{LeaseEngine, PeerChecks};
use super::records::{Revision, SplitBrainRecord, StoreValue, StoredEntry, ValueKind};
use super::steps::Step;
use crate::id::NodeId;
use crate::membership::{Member, MemberStatus};
use crate::split_brain::{SplitBrainDecision, SplitBrainPolicy};

/// This node's standing in a split-brain race.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Race {
    /// No race.
    Idle,
    /// Try for the key at this time.
    Due { at: u64 },
    /// Another member held the key (or the try's outcome is unknown): wait until then.
    Lost { until: u64 },
    /// This node holds the key at this revision.
    Won { revision: Revision },
}

/// What the engine knows of its peers' liveness.
#[derive(Debug)]
pub(super) struct Peers {
    pub(super) config: PeerChecks,
    /// When each member was first seen in a listing, and last heard from.
    contacts: BTreeMap<NodeId, Contact>,
    /// The next keep-alive.
    keepalive_at: u64,
    /// Members not heard from for the threshold.
    pub(super) unreachable: BTreeSet<NodeId>,
    /// When `unreachable` last changed to a non-empty set.
    unstable_since: Option<u64>,
    pub(super) race: Race,
    /// Whether the members were listed once (a new incarnation lists them before it joins).
    listed: bool,
    waiting_logged: bool,
}

#[derive(Debug, Clone, Copy)]
struct Contact {
    first_seen: u64,
    heard: Option<u64>,
}

impl Peers {
    pub(super) fn new(config: PeerChecks, now: u64) -> Self {
        Peers {
            config,
            contacts: BTreeMap::new(),
            keepalive_at: now,
            unreachable: BTreeSet::new(),
            unstable_since: None,
            race: Race::Idle,
            listed: false,
            waiting_logged: false,
        }
    }
}

impl LeaseEngine {
    /// A member answered a keep-alive, or sent one.
    pub fn handle_heard(&mut self, now: u64, from: &NodeId) {
        let Some(p) = self.peers.as_mut() else { return };
        let contact = p.contacts.entry(from.clone()).or_insert(Contact { first_seen: now, heard: None });
        contact.heard = Some(now);
        self.drive(now);
    }

    /// Members other than this node whose keys live, with their addresses.
    fn live_peers(&self) -> impl Iterator<Item = (&NodeId, &String)> {
        self.known
            .values()
            .filter(|k| k.missing_since.is_none() && k.record.node.name != self.me.node.name)
            .filter(|k| !matches!(k.record.status, MemberStatus::Down | MemberStatus::Removed))
            .map(|k| (&k.record.node, &k.record.addr))
    }

    pub(super) fn peers_timeout(&self) -> Option<u64> {
        let p = self.peers.as_ref()?;
        if self.exited {
            return None;
        }
        let mut at = p.keepalive_at;
        // Only stages that move on when their time comes (no busy wake-ups): a race starts only
        // for a member holding a key, a claim goes out only between operations.
        let racing = !self.fenced && self.my_rev.is_some();
        match (p.race.clone(), p.unstable_since) {
            (Race::Idle, Some(since)) if racing => at = at.min(since + p.config.stable_after_ms),
            (Race::Lost { until }, _) if racing => at = at.min(until),
            (Race::Due { at: due }, _) if racing && self.inflight.is_none() => at = at.min(due),
            _ => {}
        }
        Some(at)
    }

    /// Keep-alives due, reachability, and the race's next stage.
    pub(super) fn check_peers(&mut self, now: u64) {
        if self.peers.is_none() || self.exited {
            return;
        }
        let live: Vec<(NodeId, String)> = self.live_peers().map(|(n, a)| (n.clone(), a.clone())).collect();
        let Some(p) = self.peers.as_mut() else { return };
        if now >= p.keepalive_at {
            p.keepalive_at = now + p.config.every_ms;
            if !live.is_empty() {
                self.command(LeaseCommand::KeepAlive { to: live.clone() });
            }
        }
        let Some(p) = self.peers.as_mut() else { return };
        p.contacts.retain(|n, _| live.iter().any(|(l, _)| l == n));
        let silent_after = p.config.unreachable_after_ms;
        let unreachable: BTreeSet<NodeId> = live
            .iter()
            .filter(|(n, _)| {
                let c = p.contacts.get(n);
                let last = c.map(|c| c.heard.unwrap_or(c.first_seen).max(c.first_seen)).unwrap_or(now);
                now.saturating_sub(last) >= silent_after
            })
            .map(|(n, _)| n.clone())
            .collect();
        if unreachable != p.unreachable {
            let gone: Vec<NodeId> = p.unreachable.difference(&unreachable).cloned().collect();
            let new: Vec<NodeId> = unreachable.difference(&p.unreachable).cloned().collect();
            p.unstable_since = (!unreachable.is_empty()).then_some(now);
            p.unreachable = unreachable;
            if !matches!(p.race, Race::Won { .. }) {
                p.race = Race::Idle;
            }
            for node in gone {
                // Reachable again, or its key is gone: only the former is news.
                if live.iter().any(|(l, _)| *l == node) {
                    self.log(LeaseEvent::ReachableAgain { node });
                }
            }
            for node in new {
                self.log(LeaseEvent::Unreachable { node });
            }
        }
        self.start_race(now);
    }

    /// After the stable window, a member that sees unreachable ones schedules its try.
    fn start_race(&mut self, now: u64) {
        if self.fenced || self.my_rev.is_none() {
            return;
        }
        let me = self.me.node.clone();
        let Some(p) = self.peers.as_mut() else { return };
        let Some(since) = p.unstable_since else { return };
        if let Race::Lost { until } = p.race {
            if now >= until {
                p.race = Race::Idle;
            }
        }
        if p.race != Race::Idle || now < since + p.config.stable_after_ms {
            return;
        }
        let unreachable: Vec<Member> = p.unreachable.iter().map(|n| Member::new(n.clone(), 0)).collect();
        let mut reachable = vec![Member::new(me, 0)];
        let live: Vec<NodeId> = self.live_peers().map(|(n, _)| n.clone()).collect();
        let Some(p) = self.peers.as_mut() else { return };
        reachable.extend(live.into_iter().filter(|n| !p.unreachable.contains(n)).map(|n| Member::new(n, 0)));
        let policy = SplitBrainPolicy::LeaseMajority { acquire_delay_ms: p.config.acquire_delay_ms };
        let delay_ms = match policy.decide(&reachable, &unreachable, None) {
            SplitBrainDecision::AcquireLease { delay_ms } => delay_ms,
            _ => 0,
        };
        p.race = Race::Due { at: now + delay_ms };
        let (reachable, unreachable) = (reachable.len(), unreachable.len());
        self.log(LeaseEvent::SplitBrainRace { reachable, unreachable, delay_ms });
    }

    /// The step of the race due now, if any (the renewal goes first).
    pub(super) fn split_brain_step(&mut self, now: u64) -> Option<Step> {
        if self.fenced || self.my_rev.is_none() {
            return None;
        }
        let all_gone = self.me.downed.iter().all(|d| !self.holds_key(d));
        let p = self.peers.as_mut()?;
        match p.race {
            // Scheduled while the unreachable members stayed the same; any change cancels it.
            Race::Due { at } if now >= at && !p.unreachable.is_empty() => {
                Some(Step::SplitBrainClaim { downed: p.unreachable.iter().cloned().collect() })
            }
            Race::Won { revision } if all_gone => {
                // Every member downed is gone: the key is released for the next split.
                p.race = Race::Idle;
                self.me.downed.clear();
                Some(Step::SplitBrainRelease { revision })
            }
            _ => None,
        }
    }

    /// While this node holds the split-brain key, each renewal refreshes it too.
    pub(super) fn split_brain_renewal(&self) -> Option<Step> {
        match self.peers.as_ref()?.race {
            Race::Won { revision } => Some(Step::SplitBrainRefresh { revision }),
            _ => None,
        }
    }

    /// Whether `node` holds a live member key.
    fn holds_key(&self, node: &NodeId) -> bool {
        self.known.values().any(|k| k.missing_since.is_none() && &k.record.node == node)
    }

    pub(super) fn split_brain_op(&self, step: &Step) -> Option<StoreOp> {
        let key = self.keys.split_brain.clone();
        let ttl_ms = self.config.ttl_ms;
        let record =
            |downed: Vec<NodeId>| StoreValue::SplitBrain(SplitBrainRecord { winner: self.me.node.clone(), downed });
        match step {
            Step::SplitBrainClaim { downed } => {
                Some(StoreOp::CreateEphemeral { key, value: record(downed.clone()), ttl_ms })
            }
            Step::SplitBrainRefresh { revision } => {
                Some(StoreOp::Refresh { key, value: record(self.me.downed.clone()), revision: *revision, ttl_ms })
            }
            Step::SplitBrainRelease { revision } => Some(StoreOp::Delete { key, revision: Some(*revision) }),
            Step::SplitBrainRead => Some(StoreOp::Get { key, kind: ValueKind::SplitBrain }),
            _ => None,
        }
    }

    pub(super) fn split_brain_answered(&mut self, now: u64, step: Step, answer: StoreAnswer) {
        let ttl = self.config.ttl_ms;
        let Some(p) = self.peers.as_mut() else { return };
        match (step, answer) {
            (Step::SplitBrainClaim { downed }, StoreAnswer::Written(Some(revision))) => {
                p.race = Race::Won { revision };
                self.me.downed = downed.clone();
                // The flag goes out with the member record at once.
                self.renew_at = now;
                self.log(LeaseEvent::SplitBrainWon { downed });
            }
            // Held: by another member, or by this one if an earlier try's answer was lost.
            (Step::SplitBrainClaim { .. }, StoreAnswer::Written(None)) => self.plan.push_front(Step::SplitBrainRead),
            (Step::SplitBrainRead, StoreAnswer::Entry(Some(StoredEntry { value, revision, .. }))) => match value {
                Ok(StoreValue::SplitBrain(r)) if r.winner == self.me.node => {
                    p.race = Race::Won { revision };
                    self.me.downed = r.downed.clone();
                    self.renew_at = now;
                    self.log(LeaseEvent::SplitBrainWon { downed: r.downed });
                }
                _ => {
                    p.race = Race::Lost { until: now + ttl };
                    self.log(LeaseEvent::SplitBrainLost);
                }
            },
            // Unknown: the key may be this node's; the next try finds out.
            (Step::SplitBrainRefresh { .. }, StoreAnswer::Written(Some(revision))) => {
                if let Race::Won { revision: r } = &mut p.race {
                    *r = revision;
                }
            }
            // The flag stays in this node's record; the key is taken again by whoever races next.
            (Step::SplitBrainRefresh { .. }, StoreAnswer::Written(None)) => p.race = Race::Idle,
            // The store failed: try again a keep-alive interval later, not at once. A store that
            // fails at once (a refused connection) was otherwise asked again in a loop that never
            // waited, for as long as it stayed down. (A claim that took after all is found by the
            // next try, which the key refuses, and the read after it.)
            (Step::SplitBrainClaim { .. } | Step::SplitBrainRead, StoreAnswer::Failed(_)) => {
                if let Race::Due { at } = &mut p.race {
                    *at = now + p.config.every_ms;
                }
            }
            _ => {}
        }
    }

    /// After a listing: members first seen, and the flag naming this node.
    pub(super) fn peers_listed(&mut self, now: u64) {
        let me = self.me.node.clone();
        let flagged_by = self
            .known
            .values()
            .find(|k| k.missing_since.is_none() && k.record.node != me && k.record.downed.contains(&me))
            .map(|k| k.record.node.clone());
        let live: Vec<NodeId> = self.live_peers().map(|(n, _)| n.clone()).collect();
        let joining = self.my_rev.is_none() && !self.fenced;
        let Some(p) = self.peers.as_mut() else { return };
        if !p.listed && joining {
            // Join, or ask the members at once whether they can be reached.
            self.renew_at = now;
            p.keepalive_at = now;
        }
        p.listed = true;
        for n in live {
            p.contacts.entry(n).or_insert(Contact { first_seen: now, heard: None });
        }
        if let Some(by) = flagged_by {
            if !self.exited {
                self.log(LeaseEvent::DownedBySplitBrain { by });
                self.fence("downed by the split-brain resolver");
                // Hosting is revoked (above) before the keys go, so the winner's side takes the
                // shards only once nothing runs here.
                self.exited = true;
                self.inflight = None;
                self.plan.clear();
                self.plan.extend([Step::ExitMember, Step::ExitLeader, Step::ExitSlot]);
            }
        }
    }

    /// Before this incarnation holds a key: list the members first, and join only once the
    /// leader (without one, any member) answered a keep-alive, or when no member holds a key.
    pub(super) fn before_joining(&mut self, now: u64) -> Option<Step> {
        if self.fenced || self.my_rev.is_some() || now < self.renew_at {
            return None;
        }
        let p = self.peers.as_ref()?;
        if !p.listed {
            // No key before the first listing, which may take as long as a write of the key;
            // the renewal is due again as soon as it is answered.
            self.renew_at = now + (self.config.ttl_ms / 6).max(1);
            if now >= self.observe_at {
                self.observe_at = now + self.config.observe_every_ms();
                return Some(Step::Observe);
            }
            return None;
        }
        let recent = p.config.unreachable_after_ms;
        let every = p.config.every_ms;
        // Members a winner names are leaving: hearing from one says nothing about reaching the
        // side that stays (it is on the other side, and so is this node, most likely: the
        // previous incarnation was named with it).
        let named: BTreeSet<&NodeId> =
            self.known.values().filter(|k| k.missing_since.is_none()).flat_map(|k| k.record.downed.iter()).collect();
        let mut peers: Vec<NodeId> = self.live_peers().map(|(n, _)| n.clone()).filter(|n| !named.contains(n)).collect();
        // The leader's side is the cluster: a member that also lost a split-brain race may still
        // hold its key on this side of the cut. So who leads must be known first ("no leader"
        // included): a leader read that failed or was never answered is no answer.
        let leader_known = self.leader_read;
        if let Some((l, _)) = self.leader.as_ref().filter(|(l, _)| peers.contains(&l.node)) {
            peers = vec![l.node.clone()];
        }
        let p = self.peers.as_mut()?;
        let heard_one = peers
            .iter()
            .any(|n| p.contacts.get(n).and_then(|c| c.heard).is_some_and(|h| now.saturating_sub(h) < recent));
        if peers.is_empty() || (heard_one && leader_known) {
            return None;
        }
        if !p.waiting_logged {
            p.waiting_logged = true;
            self.log(LeaseEvent::WaitingToReachAMember);
        }
        self.renew_at = now + every;
        None
    }
}
