//! Hand-offs in flight: the acknowledgements, the stop, the timeouts.

use std::collections::BTreeSet;

use super::command::CoordinatorCommand;
use super::engine::{CoordinatorConfig, CoordinatorEngine};
use crate::events::DomainEvent;
use crate::id::{NodeId, ShardId};
use crate::shard_map::{Epoch, Term};

/// A planned move of one shard from a live owner.
#[derive(Debug)]
pub(crate) struct HandOff {
    pub from: NodeId,
    pub to: NodeId,
    pub phase: Phase,
    pub started: u64,
    pub next_resend: u64,
    pub reported_slow: bool,
}

#[derive(Debug)]
pub(crate) enum Phase {
    /// Waiting for every region to stop routing the shard.
    Begin { pending: BTreeSet<NodeId> },
    /// Waiting for the owner to stop it.
    Stopping,
}

impl HandOff {
    pub fn next_deadline(&self, config: &CoordinatorConfig) -> u64 {
        let timeout = self.started + config.hand_off_timeout_ms;
        match self.phase {
            Phase::Begin { .. } => self.next_resend.min(timeout),
            Phase::Stopping if !self.reported_slow => self.next_resend.min(timeout),
            Phase::Stopping => self.next_resend,
        }
    }
}

impl CoordinatorEngine {
    /// The hand-offs in progress with their ends: `(shard, from, to)`, ordered by shard.
    pub fn hand_off_moves(&self) -> impl Iterator<Item = (ShardId, &NodeId, &NodeId)> + '_ {
        self.hand_offs.iter().map(|(s, h)| (*s, &h.from, &h.to))
    }

    /// Starts moving `shard` from its live owner `from` to `to`.
    pub(super) fn start_hand_off(&mut self, now: u64, shard: ShardId, from: NodeId, to: NodeId) {
        let pending: BTreeSet<NodeId> = self.live_regions().into_iter().collect();
        self.commands.push_back(CoordinatorCommand::SendBeginHandOff { to: pending.iter().cloned().collect(), shard });
        let ho = HandOff {
            from,
            to,
            phase: Phase::Begin { pending },
            started: now,
            next_resend: now + self.config.resend_interval_ms,
            reported_slow: false,
        };
        self.hand_offs.insert(shard, ho);
        self.advance(now, shard);
    }

    /// A region stopped routing `shard`.
    pub fn handle_begin_hand_off_ack(&mut self, now: u64, from: &NodeId, term: Term, shard: ShardId) {
        if self.is_idle() || term != self.term {
            return;
        }
        if let Some(HandOff { phase: Phase::Begin { pending }, .. }) = self.hand_offs.get_mut(&shard) {
            pending.remove(from);
        }
        self.advance(now, shard);
        self.after_input(now);
    }

    /// A region stopped `shard`, hosted at `epoch`. Accepted from any term: it is a fact about the
    /// region, which never hosts the shard at that epoch again.
    /// `handover` is the entities' state for the next owner, if the region sent any.
    pub fn handle_shard_stopped(
        &mut self,
        now: u64,
        from: &NodeId,
        shard: ShardId,
        epoch: Epoch,
        handover: Option<Vec<u8>>,
    ) {
        if self.is_idle() {
            return;
        }
        let Some(slot) = self.map.slot(shard) else { return };
        if slot.owner.as_ref() != Some(from) || slot.epoch != epoch {
            return;
        }
        if self.hand_offs.get(&shard).is_some_and(|h| &h.from == from) {
            self.complete(now, shard, handover);
        } else {
            // Stopped without a hand-off of ours (one of an earlier coordinator): it is free.
            if self.map.unassign(shard).unwrap_or(None).is_some() {
                self.changed.insert(shard);
            }
            self.schedule_rebalance(now, crate::events::RebalanceReason::Membership);
        }
        self.after_input(now);
    }

    /// Timers: re-send, abandon hand-offs that regions did not acknowledge in time, report slow
    /// owners, and plan when due ([`Engine::handle_timeout`](crate::Engine::handle_timeout)).
    pub(super) fn timers_due(&mut self, now: u64) {
        if self.stopped {
            return;
        }
        if self.loading.is_some() {
            self.load_again_if_due(now);
            return;
        }
        self.persist_again_if_due(now);
        self.ask_silent_members(now);
        let shards: Vec<ShardId> = self.hand_offs.keys().copied().collect();
        for shard in shards {
            let Some(ho) = self.hand_offs.get_mut(&shard) else { continue };
            let timed_out = now >= ho.started + self.config.hand_off_timeout_ms;
            let resend = now >= ho.next_resend;
            if resend {
                ho.next_resend = now + self.config.resend_interval_ms;
            }
            match &ho.phase {
                Phase::Begin { .. } if timed_out => {
                    // Nobody was told to stop: re-announcing the current home unblocks everyone.
                    let owner = ho.from.clone();
                    self.hand_offs.remove(&shard);
                    self.emit(DomainEvent::HandOffTimedOut { shard, owner, abandoned: true });
                    if let Some(home) = self.map.home(shard) {
                        self.announce.push((shard, home));
                    }
                    self.end_round_if_idle(now);
                }
                Phase::Begin { pending } if resend => {
                    let to = pending.iter().cloned().collect();
                    self.commands.push_back(CoordinatorCommand::SendBeginHandOff { to, shard });
                }
                Phase::Stopping => {
                    let owner = ho.from.clone();
                    if timed_out && !ho.reported_slow {
                        ho.reported_slow = true;
                        self.emit(DomainEvent::HandOffTimedOut { shard, owner: owner.clone(), abandoned: false });
                    }
                    if resend {
                        if let Some(slot) = self.map.slot(shard) {
                            let epoch = slot.epoch;
                            self.commands.push_back(CoordinatorCommand::SendHandOff { to: owner, shard, epoch });
                        }
                    }
                }
                Phase::Begin { .. } => {}
            }
        }
        self.after_input(now);
    }

    /// Moves a hand-off forward when its current phase is done.
    fn advance(&mut self, now: u64, shard: ShardId) {
        let Some(ho) = self.hand_offs.get_mut(&shard) else { return };
        let Phase::Begin { pending } = &ho.phase else { return };
        if !pending.is_empty() {
            return;
        }
        ho.phase = Phase::Stopping;
        ho.next_resend = now + self.config.resend_interval_ms;
        let to = ho.from.clone();
        let epoch = self.map.slot(shard).map(|s| s.epoch).unwrap_or_default();
        self.commands.push_back(CoordinatorCommand::SendHandOff { to, shard, epoch });
        #[cfg(feature = "fault-injection")]
        if self.config.fault_skip_wait_for_shard_stopped {
            self.complete(now, shard, None);
        }
    }

    /// A region or the owner of a hand-off was fenced.
    pub(super) fn on_fenced_hand_off(&mut self, now: u64, shard: ShardId) {
        let Some(ho) = self.hand_offs.get_mut(&shard) else { return };
        if self.view.is_fenced(&ho.from) {
            // The owner is known stopped: the move may complete without ShardStopped.
            self.complete(now, shard, None);
            return;
        }
        if let Phase::Begin { pending } = &mut ho.phase {
            let view = &self.view;
            pending.retain(|r| !super::engine::region_gone(view, r));
        }
        self.advance(now, shard);
    }

    /// Records the move: S → (to, new epoch), or back to the pool when `to` can no longer host
    /// (or the shard has no epoch left: see `Epoch::next`).
    fn complete(&mut self, now: u64, shard: ShardId, handover: Option<Vec<u8>>) {
        let Some(ho) = self.hand_offs.remove(&shard) else { return };
        let role = self.config.role.clone();
        let to_ok = self.hosting.contains(&ho.to) && self.view.get(&ho.to).is_some_and(|m| m.may_host(role.as_deref()));
        let epoch = self.map.slot(shard).and_then(|s| s.epoch.next(self.term));
        if let (true, Some(epoch)) = (to_ok, epoch) {
            if let Some(data) = handover {
                self.commands.push_back(CoordinatorCommand::SendHandedState { to: ho.to.clone(), shard, epoch, data });
            }
            if let Some(home) = self.assign(shard, ho.to) {
                self.emit(DomainEvent::ShardMigrated { shard, from: ho.from, to: home });
            }
        } else if self.map.unassign(shard).unwrap_or(None).is_some() {
            self.changed.insert(shard);
        }
        if let Some(moved) = &mut self.round {
            *moved += 1;
        }
        self.end_round_if_idle(now);
    }

    fn end_round_if_idle(&mut self, now: u64) {
        if !self.hand_offs.is_empty() {
            return;
        }
        if let Some(moved) = self.round.take() {
            self.emit(DomainEvent::RebalancingCompleted { term: self.term, moved });
        }
        // The next round (or the allocation of freed shards) follows at once.
        self.schedule_rebalance(now, crate::events::RebalanceReason::Membership);
    }
}
