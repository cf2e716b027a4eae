//! The region state machine.

use std::collections::{BTreeSet, HashMap, VecDeque};

use super::command::{RegionCommand, RejectReason};
use super::shard_state::{Hosted, ShardState};
use crate::id::{NodeId, ShardId};
use crate::protocol::{BounceReason, RegionMessage, ToCoordinator, ToRegion};
use crate::shard_map::{Epoch, ShardHome, Term};

/// Settings of a region.
#[derive(Clone, Debug)]
pub struct RegionConfig {
    /// Number of shards of the entity type (must match the coordinator's).
    pub num_shards: u32,
    /// Most messages buffered in the region, all shards together (default 100,000). Over it,
    /// senders get [`RejectReason::Overloaded`].
    pub max_buffered: usize,
    /// First delay before asking the coordinator again after a bounce (default 25 ms); doubles
    /// up to `retry_max_ms` (default 2 s).
    pub retry_initial_ms: u64,
    /// Longest delay between two questions about one shard.
    pub retry_max_ms: u64,
    /// How often an unanswered registration is repeated (default 1 s).
    pub register_retry_ms: u64,
    /// False for a proxy region: it routes messages but never hosts shards.
    pub hosting: bool,
}

impl RegionConfig {
    /// Defaults for `num_shards` shards.
    pub fn new(num_shards: u32) -> Self {
        RegionConfig {
            num_shards,
            max_buffered: 100_000,
            retry_initial_ms: 25,
            retry_max_ms: 2_000,
            register_retry_ms: 1_000,
            hosting: true,
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
    commands: VecDeque<RegionCommand<M>>,
    fenced: bool,
    /// Incoming streams: (sender, shard) → (stream, next expected position).
    incoming: HashMap<(NodeId, ShardId), (u64, u64)>,
}

impl<M> RegionEngine<M> {
    /// A region of node `me` that knows no coordinator yet.
    pub fn new(config: RegionConfig, me: NodeId) -> Self {
        let shards = (0..config.num_shards.max(1)).map(|_| ShardState::default()).collect();
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
            commands: VecDeque::new(),
            fenced: false,
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

    /// Takes every buffered message out (e.g. to fail them when the node shuts down).
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

    /// The next command for the driver, in order.
    pub fn poll_command(&mut self) -> Option<RegionCommand<M>> {
        self.commands.pop_front()
    }

    /// All pending commands.
    pub fn drain_commands(&mut self) -> impl Iterator<Item = RegionCommand<M>> + '_ {
        self.commands.drain(..)
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next.
    pub fn poll_timeout(&self) -> Option<u64> {
        let t = self.timers.first().map(|(t, _)| *t);
        match (t, self.register_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A local caller sends `msg` to an entity of `shard`.
    pub fn handle_send(&mut self, now: u64, shard: ShardId, msg: M) {
        if self.fenced || shard.index() >= self.shards.len() {
            self.commands.push_back(RegionCommand::Reject { shard, msg, reason: RejectReason::Unavailable });
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let s = &self.shards[shard.index()];
        match self.target(s) {
            Route::Local(epoch) => self.commands.push_back(RegionCommand::Deliver { shard, epoch, msg }),
            Route::Remote(to, epoch) => {
                let s = &mut self.shards[shard.index()];
                s.dirty = Some(to.clone());
                let (stream, position) = s.next_position();
                self.commands.push_back(RegionCommand::SendToRegion {
                    to,
                    msg: RegionMessage::Forward { shard, epoch, seq, stream, position, msg },
                });
            }
            Route::Hold => {
                if self.buffered >= self.config.max_buffered {
                    self.commands.push_back(RegionCommand::Reject { shard, msg, reason: RejectReason::Overloaded });
                    return;
                }
                self.buffered += 1;
                self.shards[shard.index()].buffer.push_back((seq, msg));
                self.pump(now, shard);
            }
        }
    }

    /// A message from another region.
    pub fn handle_region_message(&mut self, now: u64, from: &NodeId, msg: RegionMessage<M>) {
        match msg {
            RegionMessage::Forward { shard, epoch: _, seq, stream, position, msg } => {
                let expected = self.incoming.get(&(from.clone(), shard)).copied().unwrap_or((0, 1));
                let in_order = match stream.cmp(&expected.0) {
                    std::cmp::Ordering::Equal => position == expected.1,
                    std::cmp::Ordering::Greater => position == 1,
                    std::cmp::Ordering::Less => false,
                };
                let reason = match self.shards.get(shard.index()) {
                    Some(s) if !self.fenced => match s.hosted {
                        Hosted::Active(epoch) if in_order => {
                            self.incoming.insert((from.clone(), shard), (stream, position + 1));
                            self.commands.push_back(RegionCommand::Deliver { shard, epoch, msg });
                            return;
                        }
                        // An earlier message of this stream is on its way back: so is this one.
                        Hosted::Active(_) => BounceReason::RebalanceInProgress,
                        Hosted::Stopping(_) => BounceReason::RebalanceInProgress,
                        Hosted::No if s.paused => BounceReason::RebalanceInProgress,
                        Hosted::No => BounceReason::NotOwner,
                    },
                    _ => BounceReason::NotOwner,
                };
                self.send_region(from.clone(), RegionMessage::Bounce { shard, seq, reason, msg });
            }
            RegionMessage::Bounce { shard, seq, reason: _, msg } => self.take_back(now, from, shard, seq, msg),
            RegionMessage::Flush { shard, token } => {
                // Everything `from` sent before the marker has been handled: answer now.
                self.send_region(from.clone(), RegionMessage::FlushAck { shard, token });
            }
            RegionMessage::FlushAck { shard, token } => {
                let done = self
                    .shards
                    .get(shard.index())
                    .is_some_and(|s| s.draining.as_ref().is_some_and(|(n, t)| n == from && *t == token));
                if done {
                    self.shards[shard.index()].draining = None;
                    self.pump(now, shard);
                }
            }
        }
    }

    /// The transport could not write a message to `to` at all (no connection): it was not
    /// processed, so it is taken back like a bounce.
    pub fn handle_undeliverable(&mut self, now: u64, to: &NodeId, msg: RegionMessage<M>) {
        match msg {
            RegionMessage::Forward { shard, seq, msg, .. } => self.take_back(now, to, shard, seq, msg),
            RegionMessage::Flush { shard, token } => {
                self.handle_region_message(now, to, RegionMessage::FlushAck { shard, token })
            }
            // The sender of a bounced message is unreachable: it already knows its message may be
            // lost (its link broke). Nothing else to do.
            RegionMessage::Bounce { .. } | RegionMessage::FlushAck { .. } => {}
        }
    }

    /// The queue towards `to` was full, so `msg` was not sent: it goes back into the buffer at
    /// its place, and the shard drains `to` before it sends anything again. The drain's marker
    /// is answered once `to` has handled everything sent before it, which paces the sender to
    /// what the peer can take, and the next forward starts a new stream, so nothing sent after
    /// the marker can overtake the message taken back.
    pub fn handle_send_queue_full(&mut self, now: u64, to: &NodeId, msg: RegionMessage<M>) {
        match msg {
            RegionMessage::Forward { shard, seq, msg, .. } => {
                let Some(s) = self.shards.get_mut(shard.index()) else { return };
                s.reinsert(seq, msg);
                s.stream_open = false;
                self.buffered += 1;
                if s.draining.is_none() {
                    s.dirty = None;
                    self.start_drain(shard, to.clone());
                }
            }
            // Only forwards are ever refused for a full queue (the driver waits for room for the
            // rest); anything else is handled as undeliverable.
            other => self.handle_undeliverable(now, to, other),
        }
    }

    /// The connection to `peer` broke: a drain marker in flight on it is lost, so each drain
    /// towards `peer` starts again with a new marker. That marker comes back (undeliverable) or
    /// is answered only after every earlier message to `peer` has come back or arrived, which a
    /// mere "link down" cannot promise. A broken link to the coordinator means announcements may
    /// have been lost: register again to get every home.
    pub fn handle_link_down(&mut self, now: u64, peer: &NodeId) {
        for i in 0..self.shards.len() {
            if self.shards[i].draining.as_ref().is_some_and(|(n, _)| n == peer) {
                self.start_drain(ShardId(i as u32), peer.clone());
            }
        }
        if self.coordinator.as_ref() == Some(peer) {
            self.registered = false;
            self.register(now);
        }
    }

    /// The membership provider names the leader (where the coordinator runs) and its term.
    pub fn handle_coordinator_changed(&mut self, now: u64, node: NodeId, term: Term) {
        if self.fenced || term < self.term || (term == self.term && self.coordinator.as_ref() == Some(&node)) {
            return;
        }
        self.adopt_coordinator(now, node, term);
    }

    /// A message from the coordinator on `from`.
    pub fn handle_coordinator_message(&mut self, now: u64, from: &NodeId, msg: ToRegion) {
        let term = msg.term();
        if self.fenced || term < self.term {
            return;
        }
        if term > self.term || self.coordinator.is_none() {
            self.adopt_coordinator(now, from.clone(), term);
        }
        match msg {
            ToRegion::CoordinatorStarted { .. } => {
                if !self.registered && self.register_at.is_none() {
                    self.register(now);
                }
            }
            ToRegion::Welcome { homes, .. } => {
                self.registered = true;
                self.register_at = None;
                for (shard, home) in homes {
                    self.apply_home(now, shard, home);
                }
                for i in 0..self.shards.len() {
                    self.pump(now, ShardId(i as u32));
                }
            }
            ToRegion::ShardHomes { homes, .. } => {
                for (shard, home) in homes {
                    self.apply_home(now, shard, home);
                }
            }
            ToRegion::BeginHandOff { shard, term } => {
                if let Some(s) = self.shards.get_mut(shard.index()) {
                    s.paused = true;
                    s.ack_pending = Some(term);
                    self.pump(now, shard);
                }
            }
            ToRegion::Handover { shard, epoch, data, .. } => {
                if let Some(s) = self.shards.get_mut(shard.index()) {
                    if epoch > s.seen {
                        s.handover_in = Some((epoch, data));
                    }
                }
            }
            ToRegion::HandOff { shard, epoch, term } => {
                let Some(s) = self.shards.get_mut(shard.index()) else { return };
                match s.hosted {
                    Hosted::Active(e) if e == epoch => {
                        s.hosted = Hosted::Stopping(e);
                        self.commands.push_back(RegionCommand::StopShard { shard, epoch: e, fenced: false });
                    }
                    Hosted::Stopping(e) if e == epoch => {}
                    _ => {
                        let handover = s.handover_out.as_ref().filter(|(e, _)| *e == epoch).map(|(_, d)| d.clone());
                        self.send_coordinator(ToCoordinator::ShardStopped { term, shard, epoch, handover })
                    }
                }
            }
        }
    }

    /// The driver stopped every entity of `shard` (after [`RegionCommand::StopShard`]);
    /// `handover` is their state for the next owner, if the entity type hands state over.
    pub fn handle_shard_stopped(&mut self, now: u64, shard: ShardId, handover: Option<Vec<u8>>) {
        let Some(s) = self.shards.get_mut(shard.index()) else { return };
        if let Hosted::Stopping(epoch) = s.hosted {
            s.hosted = Hosted::No;
            s.stopped_at = s.stopped_at.max(epoch);
            s.handover_out = handover.clone().map(|d| (epoch, d));
            let term = self.term;
            self.send_coordinator(ToCoordinator::ShardStopped { term, shard, epoch, handover });
            self.pump(now, shard);
        }
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
        self.register_at = None;
    }

    /// Timers: repeat unanswered questions to the coordinator.
    pub fn handle_timeout(&mut self, now: u64) {
        if self.fenced {
            return;
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
        if self.register_at.is_some_and(|t| t <= now) && !self.registered {
            self.register(now);
        }
    }

    fn target(&self, s: &ShardState<M>) -> Route {
        if s.paused || s.draining.is_some() {
            return Route::Hold;
        }
        match &s.home {
            Some(h) if h.owner == self.me => match s.hosted {
                Hosted::Active(e) => Route::Local(e),
                _ => Route::Hold,
            },
            Some(h) => Route::Remote(h.owner.clone(), h.epoch),
            None => Route::Hold,
        }
    }

    /// Moves a shard's buffer forward as far as its state allows: drain a previous destination,
    /// flush to the current one, ask for an unknown home, acknowledge a pending hand-off.
    fn pump(&mut self, now: u64, shard: ShardId) {
        let i = shard.index();
        let target = self.target(&self.shards[i]);
        let s = &mut self.shards[i];
        if let Some(old) = s.dirty.clone() {
            if !matches!(&target, Route::Remote(to, _) if *to == old) && s.draining.is_none() {
                s.dirty = None;
                self.start_drain(shard, old);
                return;
            }
        }
        match target {
            Route::Local(epoch) => {
                self.buffered -= s.buffer.len();
                for (_, msg) in s.buffer.drain(..) {
                    self.commands.push_back(RegionCommand::Deliver { shard, epoch, msg });
                }
            }
            Route::Remote(to, epoch) => {
                if !s.buffer.is_empty() {
                    s.dirty = Some(to.clone());
                    self.buffered -= s.buffer.len();
                    for (seq, msg) in std::mem::take(&mut s.buffer) {
                        let (stream, position) = s.next_position();
                        self.commands.push_back(RegionCommand::SendToRegion {
                            to: to.clone(),
                            msg: RegionMessage::Forward { shard, epoch, seq, stream, position, msg },
                        });
                    }
                }
            }
            Route::Hold => {
                if s.ask_at.is_none() && s.needs_home() {
                    if s.paused {
                        // The announcement ending the hand-off may get lost: ask later.
                        let delay = self.config.retry_max_ms;
                        self.set_ask(shard, now + delay);
                    } else {
                        self.ask(now, shard);
                    }
                }
            }
        }
        let s = &mut self.shards[i];
        if s.draining.is_none() && s.dirty.is_none() {
            if let Some(term) = s.ack_pending.take() {
                self.send_coordinator(ToCoordinator::BeginHandOffAck { term, shard });
            }
        }
    }

    /// Sends a `Flush` marker to `old`; the shard holds its messages until `FlushAck`.
    fn start_drain(&mut self, shard: ShardId, old: NodeId) {
        let token = self.next_token;
        self.next_token += 1;
        let s = &mut self.shards[shard.index()];
        s.draining = Some((old.clone(), token));
        s.stream_open = false;
        self.send_region(old, RegionMessage::Flush { shard, token });
    }

    /// A message we sent came back unprocessed (bounce or undeliverable).
    fn take_back(&mut self, now: u64, from: &NodeId, shard: ShardId, seq: u64, msg: M) {
        let Some(s) = self.shards.get_mut(shard.index()) else { return };
        s.reinsert(seq, msg);
        s.stream_open = false;
        self.buffered += 1;
        if s.home.as_ref().is_some_and(|h| &h.owner == from) {
            // Its home is wrong or not ready yet: ask again, after a backoff.
            s.home = None;
            let delay = (self.config.retry_initial_ms << s.attempt.min(16)).min(self.config.retry_max_ms);
            s.attempt = s.attempt.saturating_add(1);
            self.set_ask(shard, now + delay);
        }
        self.pump(now, shard);
    }

    fn set_ask(&mut self, shard: ShardId, at: u64) {
        let s = &mut self.shards[shard.index()];
        if let Some(old) = s.ask_at.replace(at) {
            self.timers.remove(&(old, shard));
        }
        self.timers.insert((at, shard));
    }

    /// Asks the coordinator for a shard's home, and schedules a repeat.
    fn ask(&mut self, now: u64, shard: ShardId) {
        let s = &mut self.shards[shard.index()];
        if !s.needs_home() || self.coordinator.is_none() {
            // Without a coordinator the question waits for `Welcome`, which asks at once.
            return;
        }
        let delay = (self.config.retry_initial_ms << s.attempt.min(16)).min(self.config.retry_max_ms).max(1);
        s.attempt = s.attempt.saturating_add(1);
        self.set_ask(shard, now + delay);
        self.send_coordinator(ToCoordinator::GetShardHome { shard });
    }

    fn apply_home(&mut self, now: u64, shard: ShardId, home: ShardHome) {
        let me = self.me.clone();
        let Some(s) = self.shards.get_mut(shard.index()) else { return };
        if home.epoch < s.seen {
            return;
        }
        if home.owner == me && home.epoch <= s.stopped_at {
            // We stopped it at that epoch: say so again, so the coordinator frees the shard.
            let term = self.term;
            let handover = s.handover_out.as_ref().filter(|(e, _)| *e == home.epoch).map(|(_, d)| d.clone());
            self.send_coordinator(ToCoordinator::ShardStopped { term, shard, epoch: home.epoch, handover });
            return;
        }
        if home.epoch > s.seen {
            // A genuinely new home: questions about the old one start their backoff afresh.
            s.attempt = 0;
        }
        s.seen = home.epoch;
        s.paused = false;
        s.ack_pending = None;
        if let Some(at) = s.ask_at.take() {
            self.timers.remove(&(at, shard));
        }
        let s = &mut self.shards[shard.index()];
        match s.hosted {
            Hosted::Active(e) if home.owner != me => {
                // The coordinator moved it without a hand-off from us: stop at once.
                s.hosted = Hosted::No;
                s.stopped_at = s.stopped_at.max(e);
                self.commands.push_back(RegionCommand::StopShard { shard, epoch: e, fenced: true });
            }
            Hosted::Active(e) if e < home.epoch => {
                s.hosted = Hosted::Active(home.epoch);
                self.commands.push_back(RegionCommand::RaiseEpoch { shard, from: e, to: home.epoch });
            }
            Hosted::No if home.owner == me => {
                s.hosted = Hosted::Active(home.epoch);
                let handover = s.handover_in.take().filter(|(e, _)| *e == home.epoch).map(|(_, d)| d);
                self.commands.push_back(RegionCommand::StartShard { shard, epoch: home.epoch, handover });
            }
            _ => {}
        }
        self.shards[shard.index()].home = Some(home);
        self.pump(now, shard);
    }

    fn adopt_coordinator(&mut self, now: u64, node: NodeId, term: Term) {
        self.coordinator = Some(node);
        self.term = term;
        self.registered = false;
        self.register(now);
    }

    fn register(&mut self, now: u64) {
        if self.coordinator.is_none() || self.fenced {
            return;
        }
        let hosted = self.hosted();
        let hosting = self.config.hosting;
        self.send_coordinator(ToCoordinator::Register { term: self.term, hosted, hosting });
        self.register_at = Some(now + self.config.register_retry_ms);
    }

    fn send_coordinator(&mut self, msg: ToCoordinator) {
        if let Some(to) = self.coordinator.clone() {
            self.commands.push_back(RegionCommand::SendToCoordinator { to, msg });
        }
    }

    fn send_region(&mut self, to: NodeId, msg: RegionMessage<M>) {
        self.commands.push_back(RegionCommand::SendToRegion { to, msg });
    }
}
