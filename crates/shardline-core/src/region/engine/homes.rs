//! Shard homes from the coordinator: registration, asking for a home, applying the homes it
//! announces (starting, stopping and handing off hosted shards), and a new coordinator.

use super::RegionEngine;
use crate::id::{NodeId, ShardId};
use crate::protocol::{ToCoordinator, ToRegion};
use crate::region::command::RegionCommand;
use crate::region::shard_state::Hosted;
use crate::shard_map::{Epoch, ShardHome, Term};

impl<M> RegionEngine<M> {
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
                // The coordinator asks: it started, or it forgot this region (a region that
                // registered before its node was in the coordinator's view, say). Registered or
                // not, answer, unless a registration is already on its way.
                if self.registered || self.register_at.is_none() {
                    self.registered = false;
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
            ToRegion::HandedState { shard, epoch, data, .. } => {
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

    /// The journal refused this node's claim of `shard` at `epoch`: a newer fence stands, set by
    /// a cluster led apart from this one or by this one before every member restarted. Hosted on,
    /// the shard would serve nothing (the journal refuses every write at `epoch`) and stay so for
    /// good, since its owner lives and the coordinator never moves it. It stops as for a hand-off
    /// and is reported stopped: the coordinator frees it and allocates it at a new epoch, which
    /// the journal takes once the coordinator's term is above the fence (the membership outbids
    /// a term it never heard of). It stops after
    /// [`claim_refused_pause_ms`](crate::RegionConfig::claim_refused_pause_ms).
    pub fn handle_claim_refused(&mut self, now: u64, shard: ShardId, epoch: Epoch) {
        let Some(s) = self.shards.get(shard.index()) else { return };
        if s.hosted == Hosted::Active(epoch) && !self.fenced {
            self.refused.insert((now.saturating_add(self.config.claim_refused_pause_ms), shard, epoch));
        }
    }

    /// The pause after a refused claim is over: the shard stops, unless it moved on meanwhile.
    pub(super) fn stop_refused(&mut self, shard: ShardId, epoch: Epoch) {
        let Some(s) = self.shards.get_mut(shard.index()) else { return };
        if s.hosted == Hosted::Active(epoch) {
            s.hosted = Hosted::Stopping(epoch);
            self.commands.push_back(RegionCommand::StopShard { shard, epoch, fenced: false });
        }
    }

    pub(super) fn set_ask(&mut self, shard: ShardId, at: u64) {
        let s = &mut self.shards[shard.index()];
        if let Some(old) = s.ask_at.replace(at) {
            self.timers.remove(&(old, shard));
        }
        self.timers.insert((at, shard));
    }

    /// Asks the coordinator for a shard's home, and schedules a repeat.
    pub(super) fn ask(&mut self, now: u64, shard: ShardId) {
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

    pub(super) fn apply_home(&mut self, now: u64, shard: ShardId, home: ShardHome) {
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
                self.remembering.raise(shard, home.epoch);
                self.commands.push_back(RegionCommand::RaiseEpoch { shard, from: e, to: home.epoch });
            }
            Hosted::No if home.owner == me => {
                s.hosted = Hosted::Active(home.epoch);
                let handover = s.handover_in.take().filter(|(e, _)| *e == home.epoch).map(|(_, d)| d);
                self.commands.push_back(RegionCommand::StartShard { shard, epoch: home.epoch, handover });
                self.claim(shard, home.epoch);
            }
            _ => {}
        }
        self.shards[shard.index()].home = Some(home);
        self.pump(now, shard);
    }

    pub(super) fn adopt_coordinator(&mut self, now: u64, node: NodeId, term: Term) {
        self.coordinator = Some(node);
        self.term = term;
        self.registered = false;
        self.register(now);
    }

    pub(super) fn register(&mut self, now: u64) {
        if self.coordinator.is_none() || self.fenced {
            return;
        }
        let hosted = self.hosted();
        let hosting = self.config.hosting;
        self.send_coordinator(ToCoordinator::Register { term: self.term, hosted, hosting });
        self.register_at = Some(now + self.config.register_retry_ms);
    }

    pub(super) fn send_coordinator(&mut self, msg: ToCoordinator) {
        if let Some(to) = self.coordinator.clone() {
            self.commands.push_back(RegionCommand::SendToCoordinator { to, msg });
        }
    }
}
