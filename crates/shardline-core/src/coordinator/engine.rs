//! The coordinator's state and its inputs from membership and regions.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::command::CoordinatorCommand;
use super::hand_off::HandOff;
use super::map_store::Loading;
use crate::allocation::AllocationStrategy;
use crate::engine::Engine;
use crate::events::{DomainEvent, RebalanceReason};
use crate::id::{NodeId, ShardId};
use crate::membership::{MemberStatus, MembershipView};
use crate::protocol::ToCoordinator;
use crate::shard_map::{Epoch, ShardHome, ShardMap, Term};

/// Settings of a coordinator.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Number of shards of the entity type.
    pub num_shards: u32,
    /// Only members with this role host the type (None: every member).
    pub role: Option<String>,
    /// How long regions may take to acknowledge `BeginHandOff` before the hand-off is abandoned,
    /// and after which a silent owner is reported (default 10 s).
    pub hand_off_timeout_ms: u64,
    /// How often unanswered `BeginHandOff` / `HandOff` messages are re-sent (default 1 s).
    pub resend_interval_ms: u64,
    /// How often the strategy is asked for a plan when nothing else triggers it (default 10 s).
    pub rebalance_interval_ms: u64,
    /// How long one read or write of the stored map may take before it counts as unavailable
    /// (`MapLoadError::Unavailable`, `MapWriteError::Unavailable`) and is tried again (default
    /// 3 s).
    pub store_call_limit_ms: u64,
    /// Breaks the protocol: completes a hand-off without waiting for `ShardStopped`. Exists so
    /// the simulation can prove it catches such a bug.
    #[cfg(feature = "fault-injection")]
    pub fault_skip_wait_for_shard_stopped: bool,
    /// Breaks the protocol: plans as if every member were reachable and nothing held
    /// rebalancing. Exists so the simulation can prove it catches such a bug.
    #[cfg(feature = "fault-injection")]
    pub fault_ignore_reachability: bool,
}

impl CoordinatorConfig {
    /// Defaults for `num_shards` shards.
    pub fn new(num_shards: u32) -> Self {
        CoordinatorConfig {
            num_shards,
            role: None,
            hand_off_timeout_ms: 10_000,
            resend_interval_ms: 1_000,
            rebalance_interval_ms: 10_000,
            store_call_limit_ms: 3_000,
            #[cfg(feature = "fault-injection")]
            fault_skip_wait_for_shard_stopped: false,
            #[cfg(feature = "fault-injection")]
            fault_ignore_reachability: false,
        }
    }
}

/// The coordinator state machine; see the [module docs](super).
#[derive(Debug)]
pub struct CoordinatorEngine {
    pub(super) config: CoordinatorConfig,
    pub(super) node: NodeId,
    pub(super) term: Term,
    pub(super) strategy: Box<dyn AllocationStrategy>,
    pub(super) view: MembershipView,
    pub(super) map: ShardMap,
    /// Regions registered with this coordinator (proxies included: they get announcements).
    pub(super) regions: BTreeSet<NodeId>,
    /// Registered regions that host shards.
    pub(super) hosting: BTreeSet<NodeId>,
    /// While recovering: the nodes that reported, and for each shard whether its current owner
    /// confirmed it.
    pub(super) recovery: Option<Recovery>,
    pub(super) hand_offs: BTreeMap<ShardId, HandOff>,
    /// Hand-offs finished in the current round, when a round is running.
    pub(super) round: Option<usize>,
    pub(super) rebalance_at: Option<u64>,
    pub(super) rebalance_reason: RebalanceReason,
    pub(super) changed: BTreeSet<ShardId>,
    pub(super) announce: Vec<(ShardId, ShardHome)>,
    pub(super) commands: VecDeque<CoordinatorCommand>,
    pub(super) stopped: bool,
    /// Reading the stored map: nothing is decided until it is read ([`Self::loading`]).
    pub(super) loading: Option<Loading>,
    /// When a map write that failed is tried again.
    pub(super) persist_retry_at: Option<u64>,
    /// The newest view that arrived while this node could not act ([`Self::hold_view`]).
    pub(super) held_view: Option<MembershipView>,
}

#[derive(Debug)]
pub(super) struct Recovery {
    reported: BTreeSet<NodeId>,
    confirmed: Vec<bool>,
    /// When members that have not reported are asked again.
    pub(super) ask_again_at: u64,
}

impl CoordinatorEngine {
    /// Starts a coordinator of `term` on `node` (the leader). It recovers first: it asks every
    /// member to register and allocates nothing until every live member has reported what it
    /// hosts. `stored` is the map kept by the provider's store, if any; a map with another
    /// number of shards (the type was reconfigured) is ignored.
    pub fn new(
        config: CoordinatorConfig,
        node: NodeId,
        term: Term,
        strategy: Box<dyn AllocationStrategy>,
        view: MembershipView,
        stored: Option<ShardMap>,
        now: u64,
    ) -> Result<Self, crate::shard_map::MapError> {
        let mut engine = Self::idle(config, node, term, strategy)?;
        engine.map = ShardMap::resume(engine.config.num_shards, stored.as_ref())?;
        engine.begin(now, &view);
        Ok(engine)
    }

    /// A coordinator that reads the stored map first: it asks for it
    /// ([`CoordinatorCommand::LoadShardMap`]) and decides nothing until
    /// [`handle_map_loaded`](Self::handle_map_loaded) gives it, then starts as [`new`](Self::new)
    /// does. Membership views that arrive meanwhile are kept; the newest is used.
    pub fn loading(
        config: CoordinatorConfig,
        node: NodeId,
        term: Term,
        strategy: Box<dyn AllocationStrategy>,
        view: MembershipView,
    ) -> Result<Self, crate::shard_map::MapError> {
        let mut engine = Self::idle(config, node, term, strategy)?;
        engine.loading = Some(Loading { view, retry_at: None });
        engine.commands.push_back(CoordinatorCommand::LoadShardMap);
        Ok(engine)
    }

    fn idle(
        config: CoordinatorConfig,
        node: NodeId,
        term: Term,
        strategy: Box<dyn AllocationStrategy>,
    ) -> Result<Self, crate::shard_map::MapError> {
        let map = ShardMap::new(config.num_shards)?;
        let confirmed = vec![false; config.num_shards as usize];
        Ok(CoordinatorEngine {
            config,
            node,
            term,
            strategy,
            view: MembershipView::new(),
            map,
            regions: BTreeSet::new(),
            hosting: BTreeSet::new(),
            recovery: Some(Recovery { reported: BTreeSet::new(), confirmed, ask_again_at: 0 }),
            hand_offs: BTreeMap::new(),
            round: None,
            rebalance_at: None,
            rebalance_reason: RebalanceReason::Membership,
            changed: BTreeSet::new(),
            announce: Vec::new(),
            commands: VecDeque::new(),
            stopped: false,
            held_view: None,
            loading: None,
            persist_retry_at: None,
        })
    }

    /// Starts recovering from `self.map`: the leader is announced and every member asked to
    /// register.
    pub(super) fn begin(&mut self, now: u64, view: &MembershipView) {
        if let Some(r) = self.recovery.as_mut() {
            r.ask_again_at = now;
        }
        self.emit(DomainEvent::LeaderElected { node: self.node.clone(), term: self.term });
        self.handle_membership(now, view);
    }

    /// Whether inputs are ignored: stopped, or still reading the stored map.
    pub(super) fn is_idle(&self) -> bool {
        self.stopped || self.loading.is_some()
    }

    /// Whether it still reads the stored map.
    pub fn is_loading(&self) -> bool {
        self.loading.is_some()
    }

    /// The term this coordinator was started with.
    pub fn term(&self) -> Term {
        self.term
    }

    /// The node it runs on.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// The shard map as the coordinator knows it.
    pub fn shard_map(&self) -> &ShardMap {
        &self.map
    }

    /// Whether it is still waiting for region reports.
    pub fn is_recovering(&self) -> bool {
        self.recovery.is_some()
    }

    /// Whether leadership was lost (the engine ignores every input from then on).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Shards being handed off.
    pub fn hand_offs_in_progress(&self) -> impl Iterator<Item = ShardId> + '_ {
        self.hand_offs.keys().copied()
    }

    /// Registered regions.
    pub fn regions(&self) -> &BTreeSet<NodeId> {
        &self.regions
    }

    /// The membership view it works from.
    pub fn view(&self) -> &MembershipView {
        &self.view
    }

    /// The membership view changed (a provider's new view, complete).
    pub fn handle_membership(&mut self, now: u64, view: &MembershipView) {
        // A newer view replaces one held back.
        self.held_view = None;
        if let Some(l) = self.loading.as_mut() {
            l.view = view.clone();
            return;
        }
        if self.stopped {
            return;
        }
        let old = std::mem::replace(&mut self.view, view.clone());
        let mut new_nodes = Vec::new();
        for m in view.members() {
            let before = old.get(&m.node).map(|o| o.status);
            if before.is_none() && !m.status.is_fenced() {
                new_nodes.push(m.node.clone());
            }
            if before == Some(m.status) {
                continue;
            }
            let event = match m.status {
                MemberStatus::Up => Some(DomainEvent::NodeJoined { node: m.node.clone() }),
                MemberStatus::Leaving | MemberStatus::Exiting | MemberStatus::Removed
                    if !matches!(
                        before,
                        Some(MemberStatus::Leaving | MemberStatus::Exiting | MemberStatus::Removed)
                    ) =>
                {
                    Some(DomainEvent::NodeLeft { node: m.node.clone() })
                }
                MemberStatus::Down => Some(DomainEvent::NodeFailed { node: m.node.clone() }),
                _ => None,
            };
            if let Some(e) = event {
                self.emit(e);
            }
        }
        if !new_nodes.is_empty() {
            self.commands.push_back(CoordinatorCommand::RequestRegistration { to: new_nodes });
        }
        self.on_fenced(now);
        self.check_recovery();
        if old != *view {
            self.schedule_rebalance(now, RebalanceReason::Membership);
        }
        self.after_input(now);
    }

    /// A node is known to be stopped (downed by the split-brain resolver, lease expired): its
    /// shards may move without hand-off.
    pub fn handle_node_fenced(&mut self, now: u64, node: &NodeId) {
        if self.is_idle() {
            return;
        }
        if self.view.get(node).is_some() && self.view.set_status(node, MemberStatus::Down).is_ok() {
            self.emit(DomainEvent::NodeFailed { node: node.clone() });
        }
        self.on_fenced(now);
        self.check_recovery();
        self.schedule_rebalance(now, RebalanceReason::Membership);
        self.after_input(now);
    }

    /// This node lost leadership: the coordinator stops at once and ignores every later input.
    pub fn handle_leadership_lost(&mut self, _now: u64) {
        if self.stop() {
            self.emit(DomainEvent::LeadershipLost { node: self.node.clone(), term: self.term });
        }
    }

    /// Writing the shard map was refused: a coordinator of the newer term `by` wrote it, so
    /// another leader runs. This one steps down at once, whatever the membership still says,
    /// and ignores every later input (its membership provider will catch up).
    pub fn handle_map_write_refused(&mut self, _now: u64, by: Term) {
        if by > self.term && self.stop() {
            self.deposed_by(by);
        }
    }

    /// Stops coordinating; false when already stopped.
    fn stop(&mut self) -> bool {
        if self.stopped {
            return false;
        }
        self.stopped = true;
        self.hand_offs.clear();
        self.commands.clear();
        true
    }

    /// A region's message, whichever it is (each kind also has its own `handle_*`).
    pub fn handle_message(&mut self, now: u64, from: &NodeId, msg: ToCoordinator) {
        match msg {
            ToCoordinator::Register { term, hosted, hosting } => {
                self.handle_register(now, from, term, &hosted, hosting)
            }
            ToCoordinator::GetShardHome { shard } => self.handle_get_shard_home(now, from, shard),
            ToCoordinator::BeginHandOffAck { term, shard } => self.handle_begin_hand_off_ack(now, from, term, shard),
            ToCoordinator::ShardStopped { shard, epoch, handover, .. } => {
                self.handle_shard_stopped(now, from, shard, epoch, handover)
            }
        }
    }

    /// A region registered for `term` and reported the shards it hosts; `hosting` is false for a
    /// proxy region, which routes but is never given shards.
    pub fn handle_register(&mut self, now: u64, from: &NodeId, term: Term, hosted: &[(ShardId, Epoch)], hosting: bool) {
        if self.is_idle() || term != self.term || self.view.is_fenced(from) {
            return;
        }
        self.regions.insert(from.clone());
        if hosting {
            self.hosting.insert(from.clone());
        } else {
            self.hosting.remove(from);
        }
        for &(shard, epoch) in hosted {
            let Some(slot) = self.map.slot(shard) else { continue };
            let (owner, known) = (slot.owner.clone(), slot.epoch);
            let home = ShardHome { owner: from.clone(), epoch };
            if owner.as_ref() == Some(from) && epoch == known {
                // Regions welcomed earlier in recovery were not told this home yet.
                if !self.is_confirmed(shard) {
                    self.announce.push((shard, home));
                }
                self.confirm(shard);
            } else if epoch > known || (owner.is_none() && epoch == known) {
                // The region knows a newer allocation than the map: adopt it and tell every
                // region; a previous owner at an older epoch must stop.
                if let Some(stale) = owner.filter(|o| o != from) {
                    self.stop_stale(shard, stale, known);
                }
                if self.map.adopt(shard, home.clone()).unwrap_or(false) {
                    self.changed.insert(shard);
                }
                self.announce.push((shard, home));
                self.confirm(shard);
            } else {
                self.stop_stale(shard, from.clone(), epoch);
            }
        }
        if let Some(r) = &mut self.recovery {
            r.reported.insert(from.clone());
        }
        self.check_recovery();
        let homes = self
            .map
            .iter()
            .filter(|(s, _)| !self.hand_offs.contains_key(s) && self.is_confirmed(*s))
            .filter_map(|(s, slot)| slot.home().map(|h| (s, h)))
            .collect();
        self.commands.push_back(CoordinatorCommand::SendWelcome { to: from.clone(), homes });
        self.schedule_rebalance(now, RebalanceReason::Membership);
        self.after_input(now);
    }

    /// A region asks where `shard` lives.
    pub fn handle_get_shard_home(&mut self, now: u64, from: &NodeId, shard: ShardId) {
        if self.is_idle() || self.hand_offs.contains_key(&shard) {
            return;
        }
        match self.map.home(shard).filter(|_| self.is_confirmed(shard)) {
            Some(home) => self.commands.push_back(CoordinatorCommand::SendShardHome { to: from.clone(), shard, home }),
            None if self.map.slot(shard).is_some() => self.schedule_rebalance(now, RebalanceReason::Membership),
            None => {}
        }
        self.after_input(now);
    }

    /// While recovering, asks members that have not reported to register again.
    pub(super) fn ask_silent_members(&mut self, now: u64) {
        let Some(r) = &mut self.recovery else { return };
        if now < r.ask_again_at {
            return;
        }
        r.ask_again_at = now + self.config.resend_interval_ms;
        let silent: Vec<NodeId> = self
            .view
            .members()
            .filter(|m| !m.status.is_fenced() && !r.reported.contains(&m.node))
            .map(|m| m.node.clone())
            .collect();
        if !silent.is_empty() {
            self.commands.push_back(CoordinatorCommand::RequestRegistration { to: silent });
        }
    }

    /// Whether a home may be told to regions: while recovering, only homes their owner
    /// reported. An entry from the stored map may be stale: its owner may have stopped the shard.
    fn is_confirmed(&self, shard: ShardId) -> bool {
        self.recovery.as_ref().is_none_or(|r| r.confirmed.get(shard.index()).copied().unwrap_or(false))
    }

    fn confirm(&mut self, shard: ShardId) {
        if let Some(r) = &mut self.recovery {
            if let Some(c) = r.confirmed.get_mut(shard.index()) {
                *c = true;
            }
        }
    }

    fn stop_stale(&mut self, shard: ShardId, node: NodeId, epoch: Epoch) {
        self.emit(DomainEvent::StaleShardStopped { shard, node: node.clone(), epoch });
        self.commands.push_back(CoordinatorCommand::SendHandOff { to: node, shard, epoch });
    }

    /// Ends recovery once every live member that may host has reported, and every owner in the
    /// map has either reported or is fenced. Owners that reported without a shard lose it.
    fn check_recovery(&mut self) {
        let Some(r) = &self.recovery else { return };
        // Proxies and members without the type's role never host it: their report cannot
        // change anything, and a proxy may not even run this type.
        let role = self.config.role.as_deref();
        // `Joining` too: gossip shows a member whose status has not reached this node as
        // joining, and a restart that joined one side of a partition sees the other side's
        // members that way; their shards are theirs until they report (a real partition test
        // found a rejoined member that led its side alone give itself every shard of the other).
        let waiting_member = self.view.members().any(|m| {
            matches!(m.status, MemberStatus::Joining | MemberStatus::Up | MemberStatus::Leaving | MemberStatus::Exiting)
                && !m.is_proxy()
                && role.is_none_or(|r| m.roles.contains(r))
                && !r.reported.contains(&m.node)
        });
        // An owner absent from the view is treated as gone: only a provider with a store hands
        // in a map, and its view is authoritative.
        let waiting_owner = self.map.iter().any(|(_, slot)| {
            slot.owner
                .as_ref()
                .is_some_and(|o| self.view.get(o).is_some() && !self.view.is_fenced(o) && !r.reported.contains(o))
        });
        if waiting_member || waiting_owner {
            return;
        }
        let Some(r) = self.recovery.take() else { return };
        let unconfirmed: Vec<ShardId> = self
            .map
            .iter()
            .filter(|(s, slot)| slot.owner.is_some() && !r.confirmed[s.index()])
            .map(|(s, _)| s)
            .collect();
        for shard in unconfirmed {
            if self.map.unassign(shard).unwrap_or(None).is_some() {
                self.changed.insert(shard);
            }
        }
    }

    /// Forgets fenced regions, releases shards of fenced owners and completes hand-offs whose
    /// owner is fenced.
    fn on_fenced(&mut self, now: u64) {
        let view = &self.view;
        self.regions.retain(|r| !region_gone(view, r));
        self.hosting.retain(|r| !region_gone(view, r));
        let fenced_owners: Vec<ShardId> = self
            .map
            .iter()
            .filter(|(s, slot)| {
                !self.hand_offs.contains_key(s) && slot.owner.as_ref().is_some_and(|o| view.is_fenced(o))
            })
            .map(|(s, _)| s)
            .collect();
        for shard in fenced_owners {
            if self.map.unassign(shard).unwrap_or(None).is_some() {
                self.changed.insert(shard);
            }
        }
        let shards: Vec<ShardId> = self.hand_offs.keys().copied().collect();
        for shard in shards {
            self.on_fenced_hand_off(now, shard);
        }
    }

    pub(super) fn emit(&mut self, event: DomainEvent) {
        self.commands.push_back(CoordinatorCommand::Emit(event));
    }

    pub(super) fn schedule_rebalance(&mut self, now: u64, reason: RebalanceReason) {
        if self.rebalance_at.is_none_or(|at| at > now) {
            self.rebalance_at = Some(now);
            self.rebalance_reason = reason;
        }
    }

    /// Every input ends here: plan if due, then persist and announce what changed.
    pub(super) fn after_input(&mut self, now: u64) {
        if self.is_idle() {
            return;
        }
        if self.rebalance_at.is_some_and(|at| at <= now) {
            // What this input changed goes out before the plan's first `BeginHandOff`: a home
            // queued earlier (a recovery's confirmations, an abandoned hand-off's current home)
            // must reach the regions before a new hand-off of its shard pauses them.
            self.flush_changes();
            self.plan_and_apply(now);
        }
        self.flush_changes();
    }

    /// Persists the changed entries, then announces the queued homes.
    fn flush_changes(&mut self) {
        if !self.changed.is_empty() {
            let changes = std::mem::take(&mut self.changed)
                .into_iter()
                .filter_map(|s| self.map.slot(s).map(|slot| (s, slot.clone())))
                .collect();
            self.persist_retry_at = None;
            let map = self.map.clone();
            self.commands.push_back(CoordinatorCommand::PersistShardMap { version: self.map.version(), changes, map });
        }
        // Never the home of a shard being handed off: a region takes any home as the end of the
        // hand-off's pause (welcomes and answers leave such shards out for that reason), and
        // would route towards the owner that is stopping again, after it acknowledged. The
        // hand-off announces the next home when it ends.
        let hand_offs = &self.hand_offs;
        self.announce.retain(|(shard, _)| !hand_offs.contains_key(shard));
        if !self.announce.is_empty() {
            let homes = std::mem::take(&mut self.announce);
            self.commands.push_back(CoordinatorCommand::AnnounceShardHomes { to: self.live_regions(), homes });
        }
    }

    pub(super) fn live_regions(&self) -> Vec<NodeId> {
        self.regions.iter().filter(|r| !region_gone(&self.view, r)).cloned().collect()
    }

    /// Allocates a shard directly (no live owner to hand off from) and queues its announcement.
    pub(super) fn assign(&mut self, shard: ShardId, to: NodeId) -> Option<ShardHome> {
        let epoch = self.map.assign(shard, to.clone(), self.term).ok()?;
        let home = ShardHome { owner: to, epoch };
        self.changed.insert(shard);
        self.announce.push((shard, home.clone()));
        Some(home)
    }
}

/// Whether the region of `node` can no longer answer: its member is stopped, or gone from the
/// view altogether (a member that left is forgotten once its tombstone expires; waiting for its
/// region's acknowledgement held every later hand-off until it timed out). A member that shows up
/// again is asked to register anew.
pub(super) fn region_gone(view: &MembershipView, node: &NodeId) -> bool {
    view.is_fenced(node) || view.get(node).is_none()
}

impl Engine for CoordinatorEngine {
    type Command = CoordinatorCommand;

    /// The next command for the driver, in order.
    fn poll_command(&mut self) -> Option<CoordinatorCommand> {
        self.commands.pop_front()
    }

    /// When [`handle_timeout`](Engine::handle_timeout) must be called next.
    fn poll_timeout(&self) -> Option<u64> {
        if self.stopped {
            return None;
        }
        if let Some(l) = &self.loading {
            return l.retry_at;
        }
        let hand_off = self.hand_offs.values().map(|h| h.next_deadline(&self.config)).min();
        let recovery = self.recovery.as_ref().map(|r| r.ask_again_at);
        [self.rebalance_at, hand_off, recovery, self.persist_retry_at].into_iter().flatten().min()
    }

    fn handle_timeout(&mut self, now: u64) {
        self.timers_due(now);
    }
}
