//! A hosted shard's journal claim, and the restart of its remembered entities.
//!
//! When a shard of a journaled type starts here, the engine asks for its claim in the journal
//! ([`RegionCommand::ClaimShard`]) and learns the outcome ([`ClaimOutcome`]). A refused claim stops
//! the shard ([`RegionEngine::handle_claim_refused`]); a journal that could not answer is asked
//! again, so that the shard's remembered entities are not forgotten until the next move. Once
//! claimed, the engine reads the shard's remembered entities ([`RegionCommand::ReadRemembered`])
//! and wakes them ([`RegionCommand::WakeEntity`]) under two bounds:
//! - a pace per shard ([`RememberPace::per_second`]), so that one shard's many entities do not
//!   all recover in the same instant;
//! - a number of places across the region ([`RememberPace::at_once`]): an entity woken holds one
//!   until the driver says it recovered ([`RegionEngine::handle_woken`]). A node that takes over
//!   many shards at once (a failover) recovers them as fast as its journal answers, and never
//!   with more recoveries in flight than that: no herd, and an ask that arrives meanwhile is not
//!   queued behind thousands of replays.

use std::collections::{BTreeSet, HashSet, VecDeque};

use super::RegionEngine;
use crate::id::{EntityId, ShardId};
use crate::region::command::RegionCommand;
use crate::region::shard_state::Hosted;
use crate::shard_map::Epoch;

/// How remembered entities restart when their shard starts on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RememberPace {
    /// Most entities woken per second in one shard (at least 1).
    pub per_second: u32,
    /// Most entities recovering at once across the region's shards (at least 1).
    pub at_once: usize,
}

/// What became of a [`RegionCommand::ClaimShard`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The journal took the claim: the shard's writes go through at its epoch.
    Claimed,
    /// The journal holds a newer fence: this node may not write the shard at its epoch.
    Refused,
    /// The journal could not be asked (down, timed out): asked again after
    /// [`claim_retry_ms`](crate::RegionConfig::claim_retry_ms).
    Unavailable,
}

/// What a retry asks again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Retry {
    Claim,
    Read,
}

/// The remembered entities of one shard still to wake.
#[derive(Debug)]
struct Queue {
    shard: ShardId,
    epoch: Epoch,
    ids: VecDeque<EntityId>,
    /// When the first was woken, and how many since: the pace is kept as credit over that time,
    /// exact in milliseconds whatever the rate.
    began: u64,
    woken: u64,
}

impl Queue {
    /// When the next wake of this shard is due at `per_second`.
    fn due(&self, per_second: u32) -> u64 {
        let per_second = u64::from(per_second.max(1));
        self.began.saturating_add((self.woken.saturating_mul(1000)).div_ceil(per_second))
    }
}

/// The region's part that claims shards and restarts their remembered entities.
#[derive(Debug, Default)]
pub(super) struct Remembering {
    retries: BTreeSet<(u64, ShardId, Epoch, Retry)>,
    queues: VecDeque<Queue>,
    /// Woken, not yet recovered: each holds a place.
    waking: HashSet<(ShardId, Epoch, EntityId)>,
}

impl Remembering {
    /// When the next retry or wake is due; None when nothing waits or every place is taken.
    pub(super) fn next_due(&self, pace: Option<RememberPace>) -> Option<u64> {
        let retry = self.retries.first().map(|(t, ..)| *t);
        let wake = pace
            .filter(|p| self.waking.len() < p.at_once.max(1))
            .and_then(|p| self.queues.iter().map(|q| q.due(p.per_second)).min());
        retry.into_iter().chain(wake).min()
    }

    /// Forgets every claim and wake still to come (the node was fenced). Places held stay held
    /// until the driver says the entity is gone.
    pub(super) fn clear(&mut self) {
        self.retries.clear();
        self.queues.clear();
    }

    /// `shard` stays here at the newer epoch `to`: what waits for it goes on at `to`.
    pub(super) fn raise(&mut self, shard: ShardId, to: Epoch) {
        for q in self.queues.iter_mut().filter(|q| q.shard == shard) {
            q.epoch = to;
        }
        let moved: Vec<_> = self.retries.iter().filter(|r| r.1 == shard).copied().collect();
        for (at, _, _, what) in moved.iter().copied() {
            self.retries.insert((at, shard, to, what));
        }
        for r in moved {
            self.retries.remove(&r);
        }
    }

    /// Remembered entities waiting to be woken, all shards together.
    pub(super) fn waiting(&self) -> usize {
        self.queues.iter().map(|q| q.ids.len()).sum()
    }
}

impl<M> RegionEngine<M> {
    /// Asks for the claim of a shard just started here, when its type is journaled.
    pub(super) fn claim(&mut self, shard: ShardId, epoch: Epoch) {
        if self.config.journaled {
            self.commands.push_back(RegionCommand::ClaimShard { shard, epoch });
        }
    }

    /// The outcome of a [`RegionCommand::ClaimShard`]. Claimed: the shard's remembered entities
    /// are read, when the type remembers them. Refused: as
    /// [`handle_claim_refused`](Self::handle_claim_refused). Unavailable: asked again after
    /// [`claim_retry_ms`](crate::RegionConfig::claim_retry_ms), for as long as the shard is hosted
    /// here at `epoch`.
    pub fn handle_claimed(&mut self, now: u64, shard: ShardId, epoch: Epoch, outcome: ClaimOutcome) {
        if !self.hosts_at(shard, epoch) {
            return;
        }
        match outcome {
            ClaimOutcome::Refused => self.handle_claim_refused(now, shard, epoch),
            ClaimOutcome::Unavailable => self.retry(now, shard, epoch, Retry::Claim),
            ClaimOutcome::Claimed if self.config.remember.is_some() => {
                self.commands.push_back(RegionCommand::ReadRemembered { shard, epoch });
            }
            ClaimOutcome::Claimed => {}
        }
    }

    /// The remembered entities of `shard`, read for its start at `epoch`; None when they could
    /// not be read (asked again after [`claim_retry_ms`](crate::RegionConfig::claim_retry_ms)).
    /// They are woken at the type's [`RememberPace`].
    pub fn handle_remembered(&mut self, now: u64, shard: ShardId, epoch: Epoch, ids: Option<Vec<EntityId>>) {
        if !self.hosts_at(shard, epoch) || self.config.remember.is_none() {
            return;
        }
        let Some(ids) = ids else { return self.retry(now, shard, epoch, Retry::Read) };
        let remembering = &mut self.remembering;
        remembering.queues.retain(|q| q.shard != shard);
        if !ids.is_empty() {
            remembering.queues.push_back(Queue { shard, epoch, ids: ids.into(), began: now, woken: 0 });
        }
        self.wake_due(now);
    }

    /// An entity woken by [`RegionCommand::WakeEntity`] recovered, or will not (its shard
    /// stopped, it was in memory already, its task ended): its place goes to the next one.
    pub fn handle_woken(&mut self, now: u64, shard: ShardId, epoch: Epoch, id: &EntityId) {
        if self.remembering.waking.remove(&(shard, epoch, id.clone())) {
            self.wake_due(now);
        }
    }

    /// Remembered entities woken and not yet recovered, all shards together.
    pub fn waking(&self) -> usize {
        self.remembering.waking.len()
    }

    /// Remembered entities read and not yet woken, all shards together.
    pub fn remembered_waiting(&self) -> usize {
        self.remembering.waiting()
    }

    fn hosts_at(&self, shard: ShardId, epoch: Epoch) -> bool {
        !self.fenced && self.shards.get(shard.index()).is_some_and(|s| s.hosted == Hosted::Active(epoch))
    }

    fn retry(&mut self, now: u64, shard: ShardId, epoch: Epoch, what: Retry) {
        let at = now.saturating_add(self.config.claim_retry_ms.max(1));
        self.remembering.retries.insert((at, shard, epoch, what));
    }

    /// Retries and wakes that are due (from `handle_timeout`).
    pub(super) fn remember_if_due(&mut self, now: u64) {
        while let Some(&(t, shard, epoch, what)) = self.remembering.retries.first() {
            if t > now {
                break;
            }
            self.remembering.retries.pop_first();
            if self.hosts_at(shard, epoch) {
                self.commands.push_back(match what {
                    Retry::Claim => RegionCommand::ClaimShard { shard, epoch },
                    Retry::Read => RegionCommand::ReadRemembered { shard, epoch },
                });
            }
        }
        self.wake_due(now);
    }

    /// Wakes what the pace and the places allow, one shard after the other so that no shard
    /// waits for another's whole list.
    fn wake_due(&mut self, now: u64) {
        let Some(pace) = self.config.remember else { return };
        let at_once = pace.at_once.max(1);
        let mut idle = 0;
        while self.remembering.waking.len() < at_once && idle < self.remembering.queues.len() {
            let Some(mut q) = self.remembering.queues.pop_front() else { break };
            if !self.hosts_at(q.shard, q.epoch) {
                // No longer hosted at the epoch it was read for: it wakes nothing more. Dropped
                // when its turn comes, not by a walk over every queue on every wake.
                continue;
            }
            if q.due(pace.per_second) > now {
                idle += 1;
                self.remembering.queues.push_back(q);
                continue;
            }
            idle = 0;
            let Some(id) = q.ids.pop_front() else { continue };
            q.woken += 1;
            self.remembering.waking.insert((q.shard, q.epoch, id.clone()));
            self.commands.push_back(RegionCommand::WakeEntity { shard: q.shard, epoch: q.epoch, id });
            if !q.ids.is_empty() {
                self.remembering.queues.push_back(q);
            }
        }
    }
}
