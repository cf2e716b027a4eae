//! What a region knows and holds for one shard.

use std::collections::VecDeque;

use crate::id::NodeId;
use crate::shard_map::{Epoch, ShardHome, Term};

/// Whether this node hosts the shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hosted {
    No,
    Active(Epoch),
    /// Stopping for a hand-off: messages in progress finish, new ones bounce.
    Stopping(Epoch),
}

#[derive(Debug)]
pub(crate) struct ShardState<M> {
    /// Latest home accepted from the coordinator.
    pub home: Option<ShardHome>,
    /// Highest epoch seen; older homes are stale.
    pub seen: Epoch,
    pub hosted: Hosted,
    /// Highest epoch this node stopped the shard at: it never hosts it at that epoch again.
    pub stopped_at: Epoch,
    /// `BeginHandOff` received and no new home yet: buffer.
    pub paused: bool,
    /// `BeginHandOffAck` to send (for this term) once nothing is in flight to the owner.
    pub ack_pending: Option<Term>,
    /// Waiting for `FlushAck(token)` from this node.
    pub draining: Option<(NodeId, u64)>,
    /// Node we forwarded to since the last drain.
    pub dirty: Option<NodeId>,
    /// Our current outgoing stream for this shard (see `RegionMessage::Forward`), and the next
    /// position in it; `stream_open` is false when the next forward must start a new stream.
    pub stream: u64,
    pub position: u64,
    pub stream_open: bool,
    /// Re-asking the coordinator: attempt number and when.
    pub attempt: u32,
    pub ask_at: Option<u64>,
    /// State handed over for the allocation at this epoch, until it starts here.
    pub handover_in: Option<(Epoch, Vec<u8>)>,
    /// What this node handed over when it last stopped the shard (resent if asked again).
    pub handover_out: Option<(Epoch, Vec<u8>)>,
    /// Waiting messages with their sequence numbers, ascending.
    pub buffer: VecDeque<(u64, M)>,
}

impl<M> Default for ShardState<M> {
    fn default() -> Self {
        ShardState {
            home: None,
            seen: Epoch::ZERO,
            hosted: Hosted::No,
            stopped_at: Epoch::ZERO,
            paused: false,
            ack_pending: None,
            draining: None,
            dirty: None,
            stream: 0,
            position: 0,
            stream_open: false,
            attempt: 0,
            ask_at: None,
            handover_in: None,
            handover_out: None,
            buffer: VecDeque::new(),
        }
    }
}

impl<M> ShardState<M> {
    /// Puts a message back at its place by sequence number.
    pub fn reinsert(&mut self, seq: u64, msg: M) {
        let at = self.buffer.partition_point(|(s, _)| *s < seq);
        self.buffer.insert(at, (seq, msg));
    }

    /// Stamps the next forward: (stream, position).
    pub fn next_position(&mut self) -> (u64, u64) {
        if !self.stream_open {
            self.stream += 1;
            self.position = 0;
            self.stream_open = true;
        }
        self.position += 1;
        (self.stream, self.position)
    }

    /// Messages wait for a home: unknown, or paused by a hand-off. The coordinator answers
    /// questions about a shard only when no hand-off of it is running, so any answer ends a pause.
    pub fn needs_home(&self) -> bool {
        (self.home.is_none() || self.paused) && self.draining.is_none() && !self.buffer.is_empty()
    }

    pub fn hosted_epoch(&self) -> Option<Epoch> {
        match self.hosted {
            Hosted::No => None,
            Hosted::Active(e) | Hosted::Stopping(e) => Some(e),
        }
    }
}
