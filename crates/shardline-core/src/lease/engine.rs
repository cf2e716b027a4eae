//! The engine's state, its inputs and its schedule; the steps of its rounds are in `steps.rs`.

use std::collections::{BTreeMap, VecDeque};

use super::command::{LeaseCommand, LeaseEvent, LeaseView, StoreAnswer};
use super::records::{LeaderRecord, MemberRecord, Revision};
use super::split_brain::Peers;
use super::steps::Step;
use crate::engine::Engine;
use crate::id::NodeId;
use crate::membership::{Member, MemberStatus, MembershipView};

/// Settings of lease membership (milliseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Lease TTL; keys are renewed every TTL/3.
    pub ttl_ms: u64,
    /// A node stops its shards when it has not renewed for `ttl − safety_margin`.
    pub safety_margin_ms: u64,
    /// Failed renewals in a row after which a node downs itself.
    pub max_failures: u32,
    /// How long a member whose key vanished stays in the view before it is down (0: its own
    /// self-fencing already guarantees it stopped).
    pub unknown_grace_ms: u64,
    /// Numbered membership slots: each node holds the smallest free number, which orders
    /// members for the `Ranges` strategy.
    pub numbered_slots: bool,
    /// Keep-alives between members and the split-brain race (None: members are judged by their
    /// keys alone, and a member cut from its peers but not from the store keeps its shards
    /// unreachable for as long as the cut lasts).
    pub split_brain: Option<PeerChecks>,
    /// Terms are taken above this, whatever the counter says: the journal's highest fence term.
    /// A counter in a store that was replaced, or a cluster that ran on gossip before (whose
    /// terms are large), would otherwise hand out terms the journal refuses for good.
    pub term_floor: u64,
    /// Breaks the protocol: the hosting lease is counted from the store's answer instead of the
    /// request, so a late answer lets the node host past its key's expiry. Exists so the
    /// simulation can prove it catches such a bug.
    #[cfg(feature = "fault-injection")]
    pub fault_lease_from_answer: bool,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            ttl_ms: 5_000,
            safety_margin_ms: 1_000,
            max_failures: 3,
            unknown_grace_ms: 0,
            numbered_slots: false,
            split_brain: None,
            term_floor: 0,
            #[cfg(feature = "fault-injection")]
            fault_lease_from_answer: false,
        }
    }
}

/// Keep-alives between members, and the split-brain race they lead to (milliseconds).
///
/// Each member sends a keep-alive to every other every `every_ms`; a member not heard from for
/// `unreachable_after_ms` is unreachable. Once the unreachable members have stayed the same for
/// `stable_after_ms`, every member that sees some races for the split-brain key in the store,
/// after a delay that shrinks with the members it still reaches (none for a majority): the
/// winner's side survives and names the others in its member record, the flag each member reads
/// in its listings; a member named there stops its shards and rejoins as a new incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerChecks {
    /// How often keep-alives go out.
    pub every_ms: u64,
    /// Silence after which a member is unreachable.
    pub unreachable_after_ms: u64,
    /// How long the unreachable members must stay the same before the race.
    pub stable_after_ms: u64,
    /// The wait of a side as large as the other; it scales with `unreachable / reachable`.
    pub acquire_delay_ms: u64,
}

impl Default for PeerChecks {
    fn default() -> Self {
        PeerChecks { every_ms: 500, unreachable_after_ms: 2_000, stable_after_ms: 5_000, acquire_delay_ms: 2_000 }
    }
}

/// A [`LeaseConfig`] that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseConfigError {
    /// The TTL is too short, or not longer than the safety margin.
    #[error("ttl must be ≥ 300 ms and larger than the safety margin (ttl {ttl_ms} ms, margin {margin_ms} ms)")]
    Ttl {
        /// The TTL.
        ttl_ms: u64,
        /// The margin.
        margin_ms: u64,
    },
}

impl LeaseConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), LeaseConfigError> {
        if self.ttl_ms < 300 || self.safety_margin_ms >= self.ttl_ms {
            return Err(LeaseConfigError::Ttl { ttl_ms: self.ttl_ms, margin_ms: self.safety_margin_ms });
        }
        Ok(())
    }

    /// How often the members are listed.
    pub(super) fn observe_every_ms(&self) -> u64 {
        (self.ttl_ms / 25).max(50)
    }

    /// How long a renewal keeps the node hosting.
    pub(super) fn hosting_ms(&self) -> u64 {
        self.ttl_ms - self.safety_margin_ms
    }

    /// When a renewal sent at `sent` and answered at `now` counts from.
    pub(super) fn lease_start(&self, sent: u64, now: u64) -> u64 {
        #[cfg(feature = "fault-injection")]
        if self.fault_lease_from_answer {
            return now;
        }
        let _ = now;
        sent
    }
}

/// The keys of one cluster in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseKeys {
    /// This node's member key: `{cluster}/members/{name}`.
    pub member: String,
    /// `{cluster}/members/`.
    pub members_prefix: String,
    /// `{cluster}/leader`.
    pub leader: String,
    /// `{cluster}/term`, the durable term counter.
    pub term: String,
    /// `{cluster}/slots/`.
    pub slots_prefix: String,
    /// `{cluster}/split-brain`, held by the winner of a split-brain race.
    pub split_brain: String,
}

impl LeaseKeys {
    /// The keys of `cluster` for the node named `name`.
    pub fn new(cluster: &str, name: &str) -> Self {
        LeaseKeys {
            member: format!("{cluster}/members/{name}"),
            members_prefix: format!("{cluster}/members/"),
            leader: format!("{cluster}/leader"),
            term: format!("{cluster}/term"),
            slots_prefix: format!("{cluster}/slots/"),
            split_brain: format!("{cluster}/split-brain"),
        }
    }
}

/// A member this node has seen in the store.
#[derive(Debug)]
pub(super) struct Known {
    pub(super) record: MemberRecord,
    /// When its key was last seen missing (None: present).
    pub(super) missing_since: Option<u64>,
}

/// The operation in flight.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) id: u64,
    pub(super) step: Step,
    /// When the answer is no longer wanted.
    pub(super) deadline: Option<u64>,
    /// When it was sent.
    pub(super) sent: u64,
}

/// Lease membership of one node; see the [module docs](super).
///
/// ```
/// use shardline_core::lease::{LeaseCommand, LeaseConfig, LeaseEngine, LeaseKeys, MemberRecord, StoreAnswer, StoreOp};
/// use shardline_core::{Engine, MemberStatus, NodeId};
///
/// let me = MemberRecord::up(NodeId::new("n1", 1), "127.0.0.1:7001", "1");
/// let mut engine = LeaseEngine::new(LeaseConfig::default(), LeaseKeys::new("demo", "n1"), me, 0).unwrap();
/// // First the member key is created.
/// let create = engine.drain_commands().find_map(|c| match c {
///     LeaseCommand::Store { id, op: StoreOp::CreateEphemeral { key, .. } } => Some((id, key)),
///     _ => None,
/// });
/// let (id, key) = create.unwrap();
/// assert_eq!(key, "demo/members/n1");
/// engine.handle_answer(5, id, StoreAnswer::Written(Some(1)));
/// // The node may host until the renewal's start + TTL − safety margin.
/// assert!(engine.drain_commands().any(|c| c == LeaseCommand::ExtendHosting { until: 4_000 }));
/// ```
#[derive(Debug)]
pub struct LeaseEngine {
    pub(super) config: LeaseConfig,
    pub(super) keys: LeaseKeys,
    pub(super) me: MemberRecord,
    pub(super) my_rev: Option<Revision>,
    /// When the last write of the member key whose outcome is unknown (no answer, or a failure
    /// that may have happened) was sent: the key may hold that write, so the next renewal reads
    /// it instead of writing blind.
    pub(super) uncertain: Option<u64>,
    pub(super) last_renewed: u64,
    pub(super) failures: u32,
    pub(super) leader: Option<(LeaderRecord, Revision)>,
    pub(super) leader_renewed: u64,
    /// Whether the leader key was read since the last failed read of it: until then `leader`
    /// says nothing about who leads (a new incarnation must know before it joins).
    pub(super) leader_read: bool,
    /// A claim of the leader key whose outcome is unknown (no answer in time, or a failure):
    /// its term and when it was sent. A read that finds this node's record with that term finds
    /// this claim's key, which lives at least until then + TTL.
    pub(super) claim_unknown: Option<(u64, u64)>,
    pub(super) known: BTreeMap<String, Known>,
    pub(super) fenced: bool,
    pub(super) exited: bool,
    pub(super) slot_rev: Option<Revision>,
    pub(super) renew_at: u64,
    pub(super) observe_at: u64,
    pub(super) inflight: Option<InFlight>,
    pub(super) plan: VecDeque<Step>,
    /// Keep-alives and the split-brain race (when configured).
    pub(super) peers: Option<Peers>,
    next_id: u64,
    commands: VecDeque<LeaseCommand>,
    published: Option<LeaseView>,
}

impl LeaseEngine {
    /// The engine of the node `me` describes, starting at `now`: its first round renews (creates
    /// the member key), elects and observes.
    pub fn new(config: LeaseConfig, keys: LeaseKeys, me: MemberRecord, now: u64) -> Result<Self, LeaseConfigError> {
        config.validate()?;
        let peers = config.split_brain.clone().map(|c| Peers::new(c, now));
        let mut e = LeaseEngine {
            config,
            keys,
            me,
            my_rev: None,
            uncertain: None,
            last_renewed: now,
            failures: 0,
            leader: None,
            leader_renewed: now,
            leader_read: false,
            claim_unknown: None,
            known: BTreeMap::new(),
            fenced: false,
            exited: false,
            slot_rev: None,
            renew_at: now,
            observe_at: now,
            inflight: None,
            plan: VecDeque::new(),
            peers,
            next_id: 0,
            commands: VecDeque::new(),
            published: None,
        };
        e.drive(now);
        Ok(e)
    }

    /// The store answered operation `id` (answers no longer wanted are ignored).
    pub fn handle_answer(&mut self, now: u64, id: u64, answer: StoreAnswer) {
        let Some(flight) = self.inflight.take_if(|f| f.id == id) else { return };
        self.answered(now, flight, answer);
        self.drive(now);
    }

    /// This node leaves gracefully: its record says `Leaving` from the next renewal, at once.
    pub fn handle_leave(&mut self, now: u64) {
        if self.fenced || self.exited {
            return;
        }
        self.me.status = MemberStatus::Leaving;
        self.renew_at = now;
        self.drive(now);
    }

    /// The journal refused a claim of this node's: a shard's fence is stored at `term`, above
    /// the terms this cluster took (the counter's store was replaced, or another cluster wrote
    /// the journal). The next term taken goes above it; this node, when it leads in a lower
    /// term, gives the leader key up at its next renewal so that the election takes one.
    pub fn handle_fenced_above(&mut self, _now: u64, term: u64) {
        self.config.term_floor = self.config.term_floor.max(term);
    }

    /// This node has stopped every shard and exits: its keys are deleted (member, leader, slot)
    /// so that the others need not wait for them to expire, and it renews nothing any more.
    pub fn handle_exit(&mut self, now: u64) {
        if self.exited {
            return;
        }
        self.exited = true;
        self.fenced = true;
        self.me.status = MemberStatus::Removed;
        self.inflight = None;
        self.plan.clear();
        self.plan.extend([Step::ExitMember, Step::ExitLeader, Step::ExitSlot]);
        self.drive(now);
    }

    /// Whether this node is deleting its keys before it stops (it left, or was downed).
    pub fn is_exiting(&self) -> bool {
        self.exited && (self.inflight.is_some() || !self.plan.is_empty())
    }

    /// The lease TTL (ms).
    pub fn ttl_ms(&self) -> u64 {
        self.config.ttl_ms
    }

    /// Whether this node fenced itself (or exited).
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// This node's record as it stands.
    pub fn me(&self) -> &MemberRecord {
        &self.me
    }

    /// When this node must have stopped its shards unless it renews first.
    pub(super) fn fence_deadline(&self) -> u64 {
        self.last_renewed + self.config.hosting_ms()
    }

    /// While this node leads: when it must have stopped coordinating unless it renews the
    /// leader key first (the key may expire at `renewed + ttl`, and a successor may take it).
    pub(super) fn leader_deadline(&self) -> Option<u64> {
        let leads = self.leader.as_ref().is_some_and(|(l, _)| l.node == self.me.node);
        leads.then(|| self.leader_renewed + self.config.ttl_ms - self.config.safety_margin_ms)
    }

    pub(super) fn log(&mut self, event: LeaseEvent) {
        self.commands.push_back(LeaseCommand::Log(event));
    }

    pub(super) fn command(&mut self, c: LeaseCommand) {
        self.commands.push_back(c);
    }

    /// Stops hosting for good: the lease cannot be kept.
    pub(super) fn fence(&mut self, reason: &'static str) {
        self.commands.push_back(LeaseCommand::RevokeHosting);
        if !self.fenced {
            self.log(LeaseEvent::Fenced { reason });
            self.fenced = true;
            self.me.status = MemberStatus::Down;
            self.leader = None;
            // What was planned renews or elects; reading the members goes on.
            self.plan.retain(|s| matches!(s, Step::Observe | Step::Confirm { .. }));
        }
    }

    /// Gives up leadership whose key was not renewed in time, whatever the member key does: a
    /// store can answer one renewal and not the other.
    fn drop_lapsed_leadership(&mut self, now: u64) {
        if self.leader_deadline().is_some_and(|d| now >= d) {
            self.log(LeaseEvent::LeadershipLost { reason: "not renewed in time" });
            self.leader = None;
        }
    }

    /// Deadlines first, then the next operation, then the view.
    pub(super) fn drive(&mut self, now: u64) {
        if !self.fenced && self.my_rev.is_some() && now >= self.fence_deadline() {
            self.fence("lease not renewed in time");
        }
        self.drop_lapsed_leadership(now);
        if let Some(flight) = self.inflight.take_if(|f| f.deadline.is_some_and(|d| now >= d)) {
            self.abandoned(now, flight);
        }
        self.check_peers(now);
        while self.inflight.is_none() {
            let Some(step) = self.plan.pop_front().or_else(|| self.next_round(now)) else { break };
            let Some((op, deadline)) = self.start(now, &step) else { continue };
            self.next_id += 1;
            let id = self.next_id;
            self.inflight = Some(InFlight { id, step, deadline, sent: now });
            self.commands.push_back(LeaseCommand::Store { id, op });
        }
        self.publish(now);
    }

    /// The next round when one is due: renewal first, then observation.
    fn next_round(&mut self, now: u64) -> Option<Step> {
        if self.exited {
            return None;
        }
        if let Some(step) = self.before_joining(now) {
            return Some(step);
        }
        if !self.fenced && now >= self.renew_at {
            self.renew_at = now + self.config.ttl_ms / 3;
            if self.config.numbered_slots {
                self.plan.extend([Step::Renew, Step::Elect]);
                return Some(Step::Slot);
            }
            self.plan.push_back(Step::Elect);
            if let Some(step) = self.split_brain_renewal() {
                self.plan.push_back(step);
            }
            return Some(Step::Renew);
        }
        if let Some(step) = self.split_brain_step(now) {
            return Some(step);
        }
        if now >= self.observe_at {
            self.observe_at = now + self.config.observe_every_ms();
            return Some(Step::Observe);
        }
        None
    }

    fn publish(&mut self, now: u64) {
        let view = self.view(now);
        if self.published.as_ref() != Some(&view) {
            self.published = Some(view.clone());
            self.commands.push_back(LeaseCommand::Publish(view));
        }
    }

    /// The membership as this node sees it.
    pub fn view(&self, now: u64) -> LeaseView {
        let mut view = MembershipView::new();
        let mut addresses = BTreeMap::new();
        let grace = self.config.unknown_grace_ms;
        let mut add = |r: &MemberRecord, status: MemberStatus| {
            let mut m = Member::new(r.node.clone(), r.node.incarnation)
                .with_status(status)
                .with_version(&r.app_version)
                .with_weight(r.weight);
            if let Some(slot) = r.slot {
                m = m.with_slot(slot);
            }
            for role in &r.roles {
                m = m.with_role(role.clone());
            }
            let _ = view.add(m);
            addresses.insert(r.node.clone(), r.addr.clone());
        };
        for k in self.known.values() {
            if k.record.node == self.me.node {
                continue;
            }
            let status = match k.missing_since {
                None => k.record.status,
                // Left gracefully: gone at once. Otherwise unknown for the grace period, then down.
                Some(_)
                    if matches!(
                        k.record.status,
                        MemberStatus::Leaving | MemberStatus::Exiting | MemberStatus::Removed
                    ) =>
                {
                    MemberStatus::Down
                }
                Some(t) if now.saturating_sub(t) < grace => k.record.status,
                Some(_) => MemberStatus::Down,
            };
            add(&k.record, status);
        }
        add(&self.me, self.me.status);
        if let Some(p) = &self.peers {
            for node in &p.unreachable {
                let _ = view.set_reachable(node, false);
            }
        }
        let leader: Option<(NodeId, u64)> =
            self.leader.as_ref().map(|(l, _)| (l.node.clone(), l.term)).filter(|(n, _)| !view.is_fenced(n));
        let _ = view.set_leader(leader.as_ref().map(|(n, _)| n.clone()));
        LeaseView { view, leader, addresses }
    }

    /// Whether this node may stand for leadership.
    pub(super) fn eligible(&self) -> bool {
        !self.fenced
            && self.my_rev.is_some()
            && self.me.status == MemberStatus::Up
            && !self.me.roles.iter().any(|r| r == crate::membership::PROXY_ROLE)
    }
}

impl Engine for LeaseEngine {
    type Command = LeaseCommand;

    /// The next command to carry out.
    fn poll_command(&mut self) -> Option<LeaseCommand> {
        self.commands.pop_front()
    }

    /// When [`handle_timeout`](Engine::handle_timeout) must be called next.
    fn poll_timeout(&self) -> Option<u64> {
        if self.exited && self.inflight.is_none() && self.plan.is_empty() {
            return None;
        }
        let mut at = u64::MAX;
        // A round starts once the operation in flight is done: while one is, only deadlines count.
        if self.inflight.is_none() {
            at = self.observe_at;
            if !self.fenced && !self.exited {
                at = at.min(self.renew_at);
            }
        }
        if !self.fenced && self.my_rev.is_some() {
            at = at.min(self.fence_deadline());
        }
        if let Some(d) = self.leader_deadline() {
            at = at.min(d);
        }
        if let Some(d) = self.inflight.as_ref().and_then(|f| f.deadline) {
            at = at.min(d);
        }
        if let Some(d) = self.peers_timeout() {
            at = at.min(d);
        }
        (at != u64::MAX).then_some(at)
    }

    /// Time passed.
    fn handle_timeout(&mut self, now: u64) {
        self.drive(now);
    }
}
