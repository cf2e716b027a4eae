//! The steps of the engine's rounds, one store operation each: what each sends, and what its
//! answer (or its lack of one) changes.

use super::command::{LeaseCommand, LeaseEvent, StoreAnswer, StoreOp};
use super::engine::{InFlight, Known, LeaseEngine};
use super::records::{LeaderRecord, Revision, StoreValue, StoredEntry, ValueKind};
use crate::id::NodeId;

/// One step of a round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Keep this node's slot (refresh), or find a free one (numbered slots).
    Slot,
    /// List the slots taken.
    SlotList,
    /// Try to take the first of these free slots.
    SlotCreate {
        candidates: Vec<u32>,
    },
    /// Create or refresh the member key.
    Renew,
    /// Renew, give up, or read the leadership.
    Elect,
    /// Read the term counter to claim leadership.
    ElectTerm,
    /// Take term `term` from the counter at `revision`.
    ElectCountTerm {
        term: u64,
        revision: Revision,
    },
    /// Claim the leader key for `term`.
    ElectClaim {
        term: u64,
    },
    /// List the member keys.
    Observe,
    /// Confirm that a member key missing from a listing is gone.
    Confirm {
        key: String,
    },
    /// Race for the split-brain key, downing these members if it is won.
    SplitBrainClaim {
        downed: Vec<NodeId>,
    },
    /// Read the split-brain key after a claim met it.
    SplitBrainRead,
    /// Keep the split-brain key won at `revision`.
    SplitBrainRefresh {
        revision: Revision,
    },
    /// Release it: every member downed is gone.
    SplitBrainRelease {
        revision: Revision,
    },
    /// Delete this node's keys on exit.
    ExitMember,
    ExitLeader,
    ExitSlot,
}

impl LeaseEngine {
    /// How long an operation of a renewal or an election may take: until the fencing deadline
    /// (a store that hangs must not keep this node hosting past it).
    fn renewal_deadline(&self, now: u64) -> u64 {
        if self.my_rev.is_some() && !self.fenced {
            self.fence_deadline()
        } else {
            now + self.config.ttl_ms
        }
    }

    /// How long any operation may take: not past the next renewal either, so that an answer
    /// that never comes costs one round, not the lease. A node that holds no key yet has no
    /// lease to protect, and its next "renewal" is its next try to join, which may be due at
    /// once: its reads get a sixth of the TTL, as a write of the member key does (bounded by
    /// that try, they were abandoned before any store could answer, and a new incarnation never
    /// learnt who leads before it joined).
    fn step_deadline(&self, now: u64) -> u64 {
        let until = if self.fenced {
            now + self.config.ttl_ms
        } else if self.my_rev.is_none() {
            now + (self.config.ttl_ms / 6).max(1)
        } else {
            self.renewal_deadline(now).min(self.renew_at)
        };
        until.max(now + 1)
    }

    /// How long a write of the member key may take: a sixth of the TTL at most, so that a lost
    /// answer leaves time to find out what happened and renew before the fencing deadline.
    fn renew_deadline(&self, now: u64) -> u64 {
        self.step_deadline(now).min(now + (self.config.ttl_ms / 6).max(1))
    }

    fn slot_key(&self, n: u32) -> String {
        format!("{}{n}", self.keys.slots_prefix)
    }

    /// The operation `step` sends, with its deadline; `None`: nothing to send (the step is done).
    pub(super) fn start(&mut self, now: u64, step: &Step) -> Option<(StoreOp, Option<u64>)> {
        let ttl_ms = self.config.ttl_ms;
        let renewal = Some(self.step_deadline(now));
        let holder = StoreValue::SlotHolder(self.me.node.clone());
        match step {
            Step::Slot => match (self.me.slot, self.slot_rev) {
                (Some(n), Some(revision)) => {
                    Some((StoreOp::Refresh { key: self.slot_key(n), value: holder, revision, ttl_ms }, renewal))
                }
                _ => self.start(now, &Step::SlotList),
            },
            Step::SlotList => {
                Some((StoreOp::List { prefix: self.keys.slots_prefix.clone(), kind: ValueKind::SlotHolder }, renewal))
            }
            Step::SlotCreate { candidates } => {
                let n = *candidates.first()?;
                Some((StoreOp::CreateEphemeral { key: self.slot_key(n), value: holder, ttl_ms }, renewal))
            }
            Step::Renew => {
                let key = self.keys.member.clone();
                let value = StoreValue::Member(self.me.clone());
                let op = match self.my_rev {
                    // Writing again could not tell this node's own write from another's (a
                    // create meets "exists", a refresh a new revision): read the key first.
                    _ if self.uncertain.is_some() => StoreOp::Get { key, kind: ValueKind::Member },
                    None => StoreOp::CreateEphemeral { key, value, ttl_ms },
                    Some(revision) => StoreOp::Refresh { key, value, revision, ttl_ms },
                };
                Some((op, Some(self.renew_deadline(now))))
            }
            Step::Elect => {
                let eligible = self.eligible();
                // A leader below a journal's fence can allocate nothing the journal takes: it gives
                // the key up, and the next election takes a term above the fence.
                let fenced_above = |l: &LeaderRecord| l.term < self.config.term_floor;
                match self.leader.clone() {
                    Some((l, revision)) if l.node == self.me.node && (!eligible || fenced_above(&l)) => {
                        self.leader = None;
                        let reason = if eligible { "a journal is fenced above its term" } else { "no longer eligible" };
                        self.log(LeaseEvent::LeadershipLost { reason });
                        Some((StoreOp::Delete { key: self.keys.leader.clone(), revision: Some(revision) }, renewal))
                    }
                    Some((l, revision)) if l.node == self.me.node => {
                        let key = self.keys.leader.clone();
                        let op = StoreOp::Refresh { key, value: StoreValue::Leader(l), revision, ttl_ms };
                        Some((op, self.leader_deadline().map(|d| d.min(self.step_deadline(now)))))
                    }
                    _ => Some((StoreOp::Get { key: self.keys.leader.clone(), kind: ValueKind::Leader }, renewal)),
                }
            }
            Step::ElectTerm => Some((StoreOp::Get { key: self.keys.term.clone(), kind: ValueKind::Term }, renewal)),
            Step::ElectCountTerm { term, revision } => Some((
                StoreOp::CompareAndPut {
                    key: self.keys.term.clone(),
                    value: StoreValue::Term(*term),
                    revision: *revision,
                },
                renewal,
            )),
            Step::ElectClaim { term } => {
                let record = LeaderRecord { node: self.me.node.clone(), term: *term };
                let op = StoreOp::CreateEphemeral {
                    key: self.keys.leader.clone(),
                    value: StoreValue::Leader(record),
                    ttl_ms,
                };
                Some((op, renewal))
            }
            Step::Observe => {
                Some((StoreOp::List { prefix: self.keys.members_prefix.clone(), kind: ValueKind::Member }, renewal))
            }
            Step::Confirm { key } => Some((StoreOp::Get { key: key.clone(), kind: ValueKind::Member }, renewal)),
            Step::SplitBrainClaim { .. }
            | Step::SplitBrainRead
            | Step::SplitBrainRefresh { .. }
            | Step::SplitBrainRelease { .. } => self.split_brain_op(step).map(|op| (op, renewal)),
            Step::ExitMember => {
                let revision = self.my_rev.take()?;
                Some((StoreOp::Delete { key: self.keys.member.clone(), revision: Some(revision) }, Some(now + ttl_ms)))
            }
            Step::ExitLeader => {
                let (l, revision) = self.leader.take()?;
                if l.node != self.me.node {
                    return None;
                }
                Some((StoreOp::Delete { key: self.keys.leader.clone(), revision: Some(revision) }, Some(now + ttl_ms)))
            }
            Step::ExitSlot => {
                let (n, revision) = (self.me.slot?, self.slot_rev.take()?);
                Some((StoreOp::Delete { key: self.slot_key(n), revision: Some(revision) }, Some(now + ttl_ms)))
            }
        }
    }

    /// The operation of `flight` was answered.
    pub(super) fn answered(&mut self, now: u64, flight: InFlight, answer: StoreAnswer) {
        let sent = flight.sent;
        match (flight.step, answer) {
            (Step::Slot, StoreAnswer::Written(Some(rev))) => self.slot_rev = Some(rev),
            (Step::Slot, StoreAnswer::Written(None)) => {
                if let Some(slot) = self.me.slot.take() {
                    self.log(LeaseEvent::SlotLost { slot });
                }
                self.slot_rev = None;
                self.plan.push_front(Step::SlotList);
            }
            (Step::Slot, StoreAnswer::Entries(entries)) | (Step::SlotList, StoreAnswer::Entries(entries)) => {
                let prefix = self.keys.slots_prefix.len();
                let taken: std::collections::BTreeSet<u32> =
                    entries.iter().filter_map(|e| e.key.get(prefix..).and_then(|n| n.parse().ok())).collect();
                let candidates = (0..).filter(|n| !taken.contains(n)).take(8).collect();
                self.plan.push_front(Step::SlotCreate { candidates });
            }
            (Step::SlotCreate { candidates }, answer) => match (candidates.first(), answer) {
                (Some(&slot), StoreAnswer::Written(Some(rev))) => {
                    self.log(LeaseEvent::SlotTaken { slot });
                    self.me.slot = Some(slot);
                    self.slot_rev = Some(rev);
                }
                _ if candidates.len() > 1 => {
                    self.plan.push_front(Step::SlotCreate { candidates: candidates[1..].to_vec() });
                }
                _ => {}
            },
            (Step::Renew, answer) => self.renewed(now, sent, answer),
            (Step::Elect, answer) => self.elect_answered(now, sent, answer),
            (Step::ElectTerm, StoreAnswer::Entry(current)) => {
                if let Some((term, revision)) = self.next_term(current) {
                    self.plan.push_front(Step::ElectCountTerm { term, revision });
                }
            }
            (Step::ElectCountTerm { term, .. }, StoreAnswer::Written(Some(_))) => {
                self.plan.push_front(Step::ElectClaim { term });
            }
            (Step::ElectClaim { term }, StoreAnswer::Written(Some(rev))) => {
                self.log(LeaseEvent::Leads { term });
                self.leader = Some((LeaderRecord { node: self.me.node.clone(), term }, rev));
                self.leader_renewed = sent;
            }
            // The key may hold this claim: the next read of it finds out.
            (Step::ElectClaim { term }, StoreAnswer::Failed(_)) => self.claim_unknown = Some((term, sent)),
            (Step::Observe, StoreAnswer::Entries(entries)) => self.observed(now, entries),
            (
                step @ (Step::SplitBrainClaim { .. }
                | Step::SplitBrainRead
                | Step::SplitBrainRefresh { .. }
                | Step::SplitBrainRelease { .. }),
                answer,
            ) => self.split_brain_answered(now, step, answer),
            (Step::Confirm { key }, StoreAnswer::Entry(None)) => {
                if let Some(k) = self.known.get_mut(&key) {
                    k.missing_since = Some(now);
                    let node = k.record.node.clone();
                    self.log(LeaseEvent::MemberGone { node });
                }
            }
            // Renewal failures are counted above; every other failure or refusal ends its step:
            // the next round tries again.
            _ => {}
        }
    }

    /// An operation's deadline passed without an answer.
    pub(super) fn abandoned(&mut self, now: u64, flight: InFlight) {
        match flight.step {
            Step::Renew => self.renewed(now, flight.sent, StoreAnswer::Failed("no answer in time".into())),
            Step::ElectClaim { term } => self.claim_unknown = Some((term, flight.sent)),
            Step::ExitMember | Step::ExitLeader | Step::ExitSlot => return,
            _ => {}
        }
        // The rest of the round depended on this answer.
        self.plan.retain(|s| matches!(s, Step::ExitMember | Step::ExitLeader | Step::ExitSlot));
    }

    fn renewed(&mut self, now: u64, sent: u64, answer: StoreAnswer) {
        let answer = match answer {
            // The read after a write of unknown outcome.
            StoreAnswer::Entry(entry) => {
                self.verified(entry);
                return;
            }
            other => other,
        };
        match answer {
            StoreAnswer::Written(Some(rev)) => {
                self.my_rev = Some(rev);
                // The store may extend the lease any time during the call: count from its start.
                self.last_renewed = self.config.lease_start(sent, now);
                self.failures = 0;
                if !self.fenced {
                    let until = self.last_renewed + self.config.hosting_ms();
                    self.command(LeaseCommand::ExtendHosting { until });
                }
            }
            StoreAnswer::Written(None) if self.my_rev.is_none() => {
                // A previous incarnation's key has not expired yet: wait for it (it fences itself).
                self.log(LeaseEvent::WaitingForPreviousIncarnation);
            }
            StoreAnswer::Written(None) => self.fence("the membership lease was lost"),
            StoreAnswer::Failed(error) => {
                self.uncertain = Some(self.uncertain.unwrap_or(sent));
                // Try again soon, not a whole period later: the fencing deadline is near.
                self.renew_at = self.renew_at.min(now + (self.config.ttl_ms / 12).max(1));
                self.failures += 1;
                let failures = self.failures;
                self.log(LeaseEvent::RenewalFailed { error, failures });
            }
            _ => {}
        }
        let silent = self.my_rev.is_some() && now >= self.fence_deadline();
        if silent || self.failures >= self.config.max_failures {
            self.fence("the membership lease cannot be renewed");
        }
    }

    /// What the member key holds after a write of unknown outcome sent at `uncertain`.
    fn verified(&mut self, entry: Option<StoredEntry>) {
        let Some(sent) = self.uncertain.take() else { return };
        match entry {
            // Nothing was written: the key stands as this node last renewed it.
            Some(StoredEntry { revision, .. }) if self.my_rev == Some(revision) => self.plan.push_front(Step::Renew),
            Some(StoredEntry { value: Ok(StoreValue::Member(r)), revision, .. }) if r.node == self.me.node => {
                // A write went through, after the first uncertain one was sent: the key lives at
                // least until then + TTL. Refresh it at once.
                self.my_rev = Some(revision);
                self.last_renewed = self.last_renewed.max(sent);
                self.failures = 0;
                if !self.fenced {
                    let until = self.last_renewed + self.config.hosting_ms();
                    self.command(LeaseCommand::ExtendHosting { until });
                }
                self.plan.push_front(Step::Renew);
            }
            // Another incarnation's key, and this node never had one: its create did not happen.
            Some(_) if self.my_rev.is_none() => {}
            // The key may have been this node's and expired: others may have seen it gone, so
            // this incarnation may never host again. A new one starts.
            _ => self.fence("the member key may have expired before this node knew it had it"),
        }
    }

    fn elect_answered(&mut self, now: u64, sent: u64, answer: StoreAnswer) {
        let leads = self.leader.as_ref().is_some_and(|(l, _)| l.node == self.me.node);
        let claim = self.claim_unknown.take();
        match answer {
            StoreAnswer::Written(Some(rev)) if leads => {
                if let Some((_, r)) = self.leader.as_mut() {
                    *r = rev;
                }
                self.leader_renewed = sent;
            }
            StoreAnswer::Written(None) if leads => {
                self.log(LeaseEvent::LeadershipLost { reason: "the leader key was taken or expired" });
                self.leader = None;
            }
            StoreAnswer::Entry(Some(StoredEntry { key, value, revision })) => {
                self.leader_read = true;
                self.leader = match value {
                    // The claim of this term whose outcome was unknown took: the key was created
                    // after the claim was sent, so it lives at least until then + TTL, as if
                    // its answer had come. Lead, and renew it from the next round on.
                    Ok(StoreValue::Leader(l))
                        if l.node == self.me.node
                            && claim.is_some_and(|(term, claimed)| {
                                term == l.term
                                    && self.eligible()
                                    && claimed + self.config.ttl_ms - self.config.safety_margin_ms > now
                            }) =>
                    {
                        self.leader_renewed = claim.map_or(sent, |(_, claimed)| claimed);
                        self.log(LeaseEvent::Leads { term: l.term });
                        Some((l, revision))
                    }
                    // Any other key of this node (a claim whose term or age is unknown) cannot be
                    // renewed in time for sure. Let it expire; someone is elected then.
                    Ok(StoreValue::Leader(l)) if l.node == self.me.node => None,
                    Ok(StoreValue::Leader(l)) => Some((l, revision)),
                    Ok(other) => {
                        self.log(LeaseEvent::BadValue { key, reason: format!("not a leader record: {other:?}") });
                        None
                    }
                    Err(reason) => {
                        self.log(LeaseEvent::BadValue { key, reason });
                        None
                    }
                };
            }
            StoreAnswer::Entry(None) => {
                self.leader_read = true;
                self.leader = None;
                if self.eligible() {
                    self.plan.push_front(Step::ElectTerm);
                }
            }
            StoreAnswer::Failed(_) if !leads => {
                self.leader = None;
                self.leader_read = false;
                // Still unknown: the next read may find it.
                self.claim_unknown = claim;
            }
            _ => {}
        }
    }

    /// The next term from the stored counter (absent: 1), never at or below the term floor, and
    /// the revision to count it at (0: create). An unreadable counter is no term at all (never 0:
    /// terms would repeat), so no leadership until an operator repairs it.
    fn next_term(&mut self, current: Option<StoredEntry>) -> Option<(u64, Revision)> {
        let floor = self.config.term_floor;
        let Some(StoredEntry { key, value, revision }) = current else {
            return floor.checked_add(1).map(|t| (t, 0));
        };
        let last = match value {
            Ok(StoreValue::Term(t)) => t,
            Ok(other) => {
                self.log(LeaseEvent::BadValue { key, reason: format!("not a term counter: {other:?}") });
                return None;
            }
            Err(reason) => {
                self.log(LeaseEvent::BadValue { key, reason });
                return None;
            }
        };
        match last.max(floor).checked_add(1) {
            Some(next) => Some((next, revision)),
            None => {
                self.log(LeaseEvent::BadValue { key, reason: "the term counter is at its maximum".into() });
                None
            }
        }
    }

    fn observed(&mut self, now: u64, entries: Vec<StoredEntry>) {
        let mut present = std::collections::BTreeSet::new();
        for StoredEntry { key, value, .. } in entries {
            match value {
                Ok(StoreValue::Member(record)) => {
                    present.insert(key.clone());
                    self.known.insert(key, Known { record, missing_since: None });
                }
                Ok(other) => self.log(LeaseEvent::BadValue { key, reason: format!("not a member record: {other:?}") }),
                Err(reason) => self.log(LeaseEvent::BadValue { key, reason }),
            }
        }
        // A listing can miss a key that is rewritten while it runs (NATS lists through a
        // consumer, and a refresh replaces the key's only message). Missing means down, at once
        // by default, so every newly missing key is confirmed with a direct read.
        let newly_missing: Vec<String> = self
            .known
            .iter()
            .filter(|(key, k)| !present.contains(*key) && k.missing_since.is_none())
            .map(|(key, _)| key.clone())
            .collect();
        // Followers read who leads after looking at the members; the leader renews on its own
        // schedule.
        if !self.fenced && self.leader.as_ref().is_none_or(|(l, _)| l.node != self.me.node) {
            self.plan.push_front(Step::Elect);
        }
        for key in newly_missing.into_iter().rev() {
            self.plan.push_front(Step::Confirm { key });
        }
        // Forget members gone for a long time.
        let forget = self.config.ttl_ms * 12;
        self.known.retain(|_, k| k.missing_since.is_none_or(|t| now.saturating_sub(t) < forget));
        self.peers_listed(now);
    }
}
