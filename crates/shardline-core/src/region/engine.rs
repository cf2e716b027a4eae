//! The region state machine: its state, what it tells its runtime, and its timers. How it routes
//! messages is in [`routing`]; how it follows the coordinator's homes, in [`homes`].

use std::collections::{BTreeSet, HashMap, VecDeque};

use super::command::{RegionCommand, RejectReason};
use super::shard_state::{Hosted, ShardState};
use crate::engine::Engine;
use crate::id::{NodeId, ShardId};
use crate::shard_map::{Epoch, ShardHome, Term};

mod homes;
mod remember;
mod routing;
mod sweeps;

pub use remember::{ClaimOutcome, RememberPace};

/// Settings of a region.
#[derive(Clone, Debug)]
pub struct RegionConfig {
    /// Number of shards of the entity type (must match the coordinator's).
    pub num_shards: u32,
    /// Most messages buffered in the region, all shards together (default 100,000). Over it,
    /// senders get [`RejectReason::Overloaded`].
    pub max_buffered: usize,
    /// First delay before asking the coordinator again after a bounce (default 10 ms); doubles
    /// up to `retry_max_ms` (default 1 s). Short: a bounce most often means the shard has just
    /// moved, and its new home is known to the coordinator a round trip later.
    pub retry_initial_ms: u64,
    /// Longest delay between two questions about one shard.
    pub retry_max_ms: u64,
    /// How often an unanswered registration is repeated (default 500 ms): a region registers
    /// when its node joins or the coordinator changes, and hosts nothing until it is answered.
    pub register_retry_ms: u64,
    /// False for a proxy region: it routes messages but never hosts shards.
    pub hosting: bool,
    /// How long a shard whose journal claim was refused is kept before it stops (default 1 s):
    /// the membership needs a moment to lead above the refused term, and one that cannot
    /// (leases on a store whose counter is behind the journal) would otherwise have the shard
    /// stopped and allocated again as fast as the round trips go.
    pub claim_refused_pause_ms: u64,
    /// How often the running entities of hosted shards are nudged to go back to being state
    /// when they got no message since the last nudge ([`RegionCommand::SweepLingering`]). None
    /// by default (never); the runtime uses [`LINGER_MS`](crate::host::LINGER_MS).
    pub linger_sweep_ms: Option<u64>,
    /// How long an entity may stay idle in memory before it is stopped
    /// ([`RegionCommand::PassivateIdle`]; None, the default: for as long as its shard is here).
    pub passivate_after_ms: Option<u64>,
    /// The type keeps a journal: each shard started here is claimed in it
    /// ([`RegionCommand::ClaimShard`]). False by default.
    pub journaled: bool,
    /// How long before a claim, or a read of the remembered entities, that the journal could not
    /// answer is asked again (default 1 s).
    pub claim_retry_ms: u64,
    /// The type remembers its entities: they restart when their shard starts here, at this pace
    /// (None by default; needs `journaled`).
    pub remember: Option<RememberPace>,
}

impl RegionConfig {
    /// Defaults for `num_shards` shards.
    pub fn new(num_shards: u32) -> Self {
        RegionConfig {
            num_shards,
            max_buffered: 100_000,
            retry_initial_ms: 10,
            retry_max_ms: 1_000,
            register_retry_ms: 500,
            hosting: true,
            claim_refused_pause_ms: 1_000,
            linger_sweep_ms: None,
            passivate_after_ms: None,
            journaled: false,
            claim_retry_ms: 1_000,
            remember: None,
        }
    }
}

/// Where a message for a shard goes right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Hosted here at this epoch.
    Local(Epoch),
    /// Hosted by that node at this epoch.
    Remote(NodeId, Epoch),
    /// Buffered: home unknown, moving, or an older destination still draining.
    Hold,
}

/// The region state machine; see the [module docs](super).
#[derive(Debug)]
pub struct RegionEngine<M> {
    config: RegionConfig,
    me: NodeId,
    coordinator: Option<NodeId>,
    term: Term,
    registered: bool,
    register_at: Option<u64>,
    shards: Vec<ShardState<M>>,
    buffered: usize,
    next_seq: u64,
    next_token: u64,
    timers: BTreeSet<(u64, ShardId)>,
    /// Shards whose journal claim was refused, with when they stop (`handle_claim_refused`).
    pub(super) refused: BTreeSet<(u64, ShardId, Epoch)>,
    /// When the next linger and passivation sweeps are due (0: at the first timer).
    pub(super) sweep_linger_at: Option<u64>,
    pub(super) sweep_idle_at: Option<u64>,
    commands: VecDeque<RegionCommand<M>>,
    fenced: bool,
    /// Claims and remembered entities of the shards started here.
    remembering: remember::Remembering,
    /// Incoming streams: (sender, shard) → (stream, next expected position).
    incoming: HashMap<(NodeId, ShardId), (u64, u64)>,
}

impl<M> RegionEngine<M> {
    /// A region of node `me` that knows no coordinator yet.
    pub fn new(config: RegionConfig, me: NodeId) -> Self {
        let shards = (0..config.num_shards.max(1)).map(|_| ShardState::default()).collect();
        // The first sweeps at the first timer; a proxy hosts nothing to sweep.
        let sweep_linger_at = config.linger_sweep_ms.filter(|_| config.hosting).map(|_| 0);
        let sweep_idle_at = config.passivate_after_ms.filter(|_| config.hosting).map(|_| 0);
        RegionEngine {
            config,
            me,
            coordinator: None,
            term: 0,
            registered: false,
            register_at: None,
            shards,
            buffered: 0,
            next_seq: 0,
            next_token: 0,
            timers: BTreeSet::new(),
            refused: BTreeSet::new(),
            sweep_linger_at,
            sweep_idle_at,
            commands: VecDeque::new(),
            fenced: false,
            remembering: Default::default(),
            incoming: HashMap::new(),
        }
    }

    /// This region's node.
    pub fn node(&self) -> &NodeId {
        &self.me
    }

    /// The coordinator it follows, and its term.
    pub fn coordinator(&self) -> Option<(&NodeId, Term)> {
        self.coordinator.as_ref().map(|c| (c, self.term))
    }

    /// Whether the current coordinator has welcomed this region.
    pub fn is_registered(&self) -> bool {
        self.registered
    }

    /// Whether the node was fenced (it must restart as a new incarnation).
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// Where a message for `shard` would go now.
    pub fn route(&self, shard: ShardId) -> Route {
        match self.shards.get(shard.index()) {
            Some(s) => self.target(s),
            None => Route::Hold,
        }
    }

    /// The epoch `shard` is hosted at when a message sent to it now would go straight to this
    /// node's entities, with nothing buffered ahead of it; None otherwise.
    ///
    /// This is what lets a driver route messages for the shards it hosts without taking the
    /// engine's lock: such a `handle_send` changes no state and emits only
    /// `Deliver { shard, epoch }`, so the driver may deliver itself. It must then refresh its
    /// copy after every input that can change the answer, under the same lock as the input:
    /// all of them except `handle_send` and a `Forward` from another region. A stale `Some`
    /// read just before a change is harmless (the message reaches the entities before the shard
    /// stops); a stale `Some` read after a message of the same sender was buffered never
    /// happens, since the refresh comes first.
    pub fn local_epoch(&self, shard: ShardId) -> Option<Epoch> {
        let s = self.shards.get(shard.index())?;
        match self.target(s) {
            Route::Local(epoch) if !self.fenced && s.buffer.is_empty() => Some(epoch),
            _ => None,
        }
    }

    /// The latest home known for `shard`.
    pub fn home(&self, shard: ShardId) -> Option<&ShardHome> {
        self.shards.get(shard.index()).and_then(|s| s.home.as_ref())
    }

    /// Shards hosted here (active or stopping), with their epochs.
    pub fn hosted(&self) -> Vec<(ShardId, Epoch)> {
        self.shards.iter().enumerate().filter_map(|(i, s)| s.hosted_epoch().map(|e| (ShardId(i as u32), e))).collect()
    }

    /// Whether `shard` is hosted here and accepting messages.
    pub fn is_active(&self, shard: ShardId) -> bool {
        self.shards.get(shard.index()).is_some_and(|s| matches!(s.hosted, Hosted::Active(_)))
    }

    /// Whether `shard` is hosted here (active or stopping).
    pub fn hosts(&self, shard: ShardId) -> bool {
        self.shards.get(shard.index()).is_some_and(|s| s.hosted != Hosted::No)
    }

    /// This node left the cluster: every message still waiting for its shard's home is refused
    /// ([`RejectReason::Left`]), not processed, so its sender may try again elsewhere.
    pub fn handle_left(&mut self, _now: u64) {
        for (shard, msg) in self.take_buffered() {
            self.commands.push_back(RegionCommand::Reject { shard, msg, reason: RejectReason::Left });
        }
    }

    /// Takes every buffered message out, as a crash loses them (the simulation's crashes).
    pub fn take_buffered(&mut self) -> Vec<(ShardId, M)> {
        self.buffered = 0;
        let mut out = Vec::new();
        for (i, s) in self.shards.iter_mut().enumerate() {
            out.extend(s.buffer.drain(..).map(|(_, m)| (ShardId(i as u32), m)));
        }
        out
    }

    /// Drains every destination this region forwarded to, so that once [`is_settled`](Self::is_settled)
    /// holds, nothing it sent is still in flight (graceful shutdown).
    pub fn flush_all(&mut self, _now: u64) {
        for i in 0..self.shards.len() {
            if self.shards[i].draining.is_none() {
                if let Some(old) = self.shards[i].dirty.take() {
                    self.start_drain(ShardId(i as u32), old);
                }
            }
        }
    }

    /// Quiet, and nothing forwarded is unconfirmed.
    pub fn is_settled(&self) -> bool {
        self.is_quiet() && self.shards.iter().all(|s| s.dirty.is_none())
    }

    /// Messages waiting in buffers.
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    /// Whether nothing is buffered, draining, or waiting for an acknowledgement.
    pub fn is_quiet(&self) -> bool {
        self.buffered == 0 && self.shards.iter().all(|s| s.draining.is_none() && s.ack_pending.is_none())
    }

    /// This node leaves and no other member can take its shards (it is the last one, or every
    /// other is gone): stop every hosted shard without a hand-off. Unlike
    /// [`handle_fenced`](Self::handle_fenced) the stop is graceful: messages already delivered
    /// are processed and the entities' stop hooks run. Messages that arrive meanwhile wait in the
    /// buffer, which the leaving node fails as not processed. Each shard is then stopped at its
    /// epoch: this node never hosts it at that epoch again.
    pub fn handle_stop_all(&mut self, _now: u64) {
        for (i, s) in self.shards.iter_mut().enumerate() {
            if let Hosted::Active(epoch) = s.hosted {
                s.hosted = Hosted::Stopping(epoch);
                self.commands.push_back(RegionCommand::StopShard { shard: ShardId(i as u32), epoch, fenced: false });
            }
        }
    }

    /// This node lost its right to host (lease lost, downed by the split-brain resolver): stop
    /// every shard at once and refuse everything from now on. The node must restart as a new
    /// incarnation.
    pub fn handle_fenced(&mut self, _now: u64) {
        if self.fenced {
            return;
        }
        self.fenced = true;
        for i in 0..self.shards.len() {
            let shard = ShardId(i as u32);
            let s = &mut self.shards[i];
            if let Some(epoch) = s.hosted_epoch() {
                s.hosted = Hosted::No;
                s.stopped_at = s.stopped_at.max(epoch);
                self.commands.push_back(RegionCommand::StopShard { shard, epoch, fenced: true });
            }
            for (_, msg) in std::mem::take(&mut self.shards[i].buffer) {
                self.commands.push_back(RegionCommand::Reject { shard, msg, reason: RejectReason::Unavailable });
            }
        }
        self.buffered = 0;
        self.timers.clear();
        self.refused.clear();
        self.remembering.clear();
        self.sweep_linger_at = None;
        self.sweep_idle_at = None;
        self.register_at = None;
    }
}

impl<M> Engine for RegionEngine<M> {
    type Command = RegionCommand<M>;

    /// The next command for the driver, in order.
    fn poll_command(&mut self) -> Option<RegionCommand<M>> {
        self.commands.pop_front()
    }

    /// When [`handle_timeout`](Engine::handle_timeout) must be called next.
    fn poll_timeout(&self) -> Option<u64> {
        if self.fenced {
            // A fenced region does nothing on a timeout (`handle_timeout`), so it asks for none.
            return None;
        }
        let ask = self.timers.first().map(|(t, _)| *t);
        let refused = self.refused.first().map(|(t, _, _)| *t);
        let remember = self.remembering.next_due(self.config.remember);
        [ask, self.register_at, refused, self.sweep_linger_at, self.sweep_idle_at, remember].into_iter().flatten().min()
    }

    /// Timers: repeat unanswered questions to the coordinator and to the journal, stop shards
    /// whose claim was refused, wake remembered entities.
    fn handle_timeout(&mut self, now: u64) {
        if self.fenced {
            return;
        }
        self.sweep_if_due(now);
        self.remember_if_due(now);
        while let Some(&(t, shard, epoch)) = self.refused.first() {
            if t > now {
                break;
            }
            self.refused.pop_first();
            self.stop_refused(shard, epoch);
        }
        while let Some(&(t, shard)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            let s = &mut self.shards[shard.index()];
            if s.ask_at == Some(t) {
                s.ask_at = None;
                self.ask(now, shard);
            }
        }
        if self.register_at.is_some_and(|t| t <= now) {
            // Taken first: `register` sets the next one only when it sends, and a deadline that
            // stayed due would have the driver call this again at once, forever.
            self.register_at = None;
            if !self.registered {
                self.register(now);
            }
        }
    }
}
