//! Messages to shards: where each goes now (here, a peer, or held), buffering while a home is
//! unknown or moving, per-shard streams to peers, drains, and what comes back undelivered.

use super::{RegionEngine, Route};
use crate::id::{NodeId, ShardId};
use crate::protocol::{BounceReason, RegionMessage, ToCoordinator};
use crate::region::command::{RegionCommand, RejectReason, SendFailure};
use crate::region::shard_state::{Hosted, ShardState};

impl<M> RegionEngine<M> {
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

    /// A [`RegionCommand::SendToRegion`] to `to` failed. A forward is taken back: into the
    /// buffer at its place, and the shard drains `to` before it sends anything there again
    /// ([`handle_send_queue_full`](Self::handle_send_queue_full)); every forward still queued
    /// for `to` behind it comes back with it, or it would overtake the one taken back. A drain
    /// marker, its answer or a bounce that met a full queue waits for room instead
    /// ([`RegionCommand::SendToRegionWhenReady`]): none of them may be lost.
    pub fn handle_send_failed(&mut self, now: u64, to: &NodeId, msg: RegionMessage<M>, why: SendFailure) {
        match (why, msg) {
            (SendFailure::NoConnection, msg) => self.handle_undeliverable(now, to, msg),
            (SendFailure::QueueFull, msg @ RegionMessage::Forward { .. }) => {
                self.handle_send_queue_full(now, to, msg);
                let queued = std::mem::take(&mut self.commands);
                let mut behind = Vec::new();
                for cmd in queued {
                    match cmd {
                        RegionCommand::SendToRegion { to: t, msg: msg @ RegionMessage::Forward { .. } } if &t == to => {
                            behind.push(msg)
                        }
                        cmd => self.commands.push_back(cmd),
                    }
                }
                for msg in behind {
                    self.handle_send_queue_full(now, to, msg);
                }
            }
            (SendFailure::QueueFull, msg) => {
                self.commands.push_back(RegionCommand::SendToRegionWhenReady { to: to.clone(), msg })
            }
        }
    }

    /// The transport could not write a message to `to` at all (no connection): it was not
    /// processed, so it is taken back like a bounce.
    pub fn handle_undeliverable(&mut self, now: u64, to: &NodeId, msg: RegionMessage<M>) {
        if self.fenced {
            self.reject_fenced(msg);
            return;
        }
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
        if self.fenced {
            self.reject_fenced(msg);
            return;
        }
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

    /// A message that comes back to a fenced region fails as not processed: a fenced region
    /// buffers nothing (it would wait for a home it never asks for again).
    fn reject_fenced(&mut self, msg: RegionMessage<M>) {
        if let RegionMessage::Forward { shard, msg, .. } = msg {
            self.commands.push_back(RegionCommand::Reject { shard, msg, reason: RejectReason::Unavailable });
        }
    }

    pub(super) fn target(&self, s: &ShardState<M>) -> Route {
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
    pub(super) fn pump(&mut self, now: u64, shard: ShardId) {
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
    pub(super) fn start_drain(&mut self, shard: ShardId, old: NodeId) {
        let token = self.next_token;
        self.next_token += 1;
        let s = &mut self.shards[shard.index()];
        s.draining = Some((old.clone(), token));
        s.stream_open = false;
        self.send_region(old, RegionMessage::Flush { shard, token });
    }

    /// A message we sent came back unprocessed (bounce or undeliverable).
    pub(super) fn take_back(&mut self, now: u64, from: &NodeId, shard: ShardId, seq: u64, msg: M) {
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

    pub(super) fn send_region(&mut self, to: NodeId, msg: RegionMessage<M>) {
        self.commands.push_back(RegionCommand::SendToRegion { to, msg });
    }
}
