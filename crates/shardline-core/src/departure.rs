//! A graceful leave, decided: hand the shards over while someone can take them, stop them here
//! when nobody can, then close in order ([`Departure::close_step`]): refuse what waited for shards
//! stopped here, drain what was forwarded, say goodbye, let the goodbye spread, close.
//!
//! A leaving node normally waits while the coordinator moves its shards to other members. Two
//! situations have nobody to move them to: no other member may host them (the last node of a
//! cluster, or every other one down or leaving), and no leader for a while (every other member
//! unreachable, or the store down). Waiting then ends only at the caller's timeout, with shards
//! still running; stopping them here instead is safe, since nobody else may host a shard of this
//! node before it has handed the shard off or is gone.
//!
//! A member that is still `Joining` (its status not heard yet) will usually be `Up` a moment
//! later: the leave waits for it, as long as it would wait for a leader, instead of stopping the
//! shards and losing what a hand-off would have carried over.

use crate::id::NodeId;
use crate::membership::{MemberStatus, MembershipView};

/// What a leaving node does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DepartureStep {
    /// Every shard is handed off or stopped: go on with [`Departure::close_step`].
    Done,
    /// The deadline passed with shards still here: the leave fails, and the node stays a member
    /// that is leaving (a later leave may finish it).
    TimedOut,
    /// Shards are still being handed over: look again later.
    Wait,
    /// Nobody can take the shards: stop them here.
    StopHere {
        /// Why, for the log.
        reason: StopReason,
        /// True the first time this is decided (log it once).
        first: bool,
    },
}

/// What a leaving node does once its shards are handed off or stopped, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closing {
    /// Shards were stopped here: messages that waited for their next home have none, and are
    /// refused as not processed.
    RefuseWaiting,
    /// Drain every destination this node forwarded to, so that nothing it sent is in flight.
    Flush,
    /// Look again later: the drains are not confirmed yet, or the goodbye is still spreading.
    Wait,
    /// Tell the membership this node is gone.
    Exit,
    /// Refuse everything from now on, stop coordinating, close the connections: the leave is
    /// over.
    Close,
}

/// Where the closing is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Start,
    Flushing,
    Settling,
    Exited(u64),
}

/// Why a leaving node stops its shards itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// No other member may host them (none `Joining` either, or not for
    /// [`Departure::leaderless_after_ms`]).
    NoSuccessor,
    /// No leader has coordinated for [`Departure::leaderless_after_ms`].
    NoLeader,
}

impl StopReason {
    /// The reason as a log line says it.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::NoSuccessor => "no other member may host",
            StopReason::NoLeader => "no leader to hand off to",
        }
    }
}

/// The decisions of one graceful leave.
///
/// ```
/// use shardline_core::{Departure, DepartureStep, Member, MemberStatus, MembershipView, NodeId, StopReason};
///
/// let me = NodeId::new("a", 1);
/// let mut view = MembershipView::new();
/// view.add(Member::new(me.clone(), 1).with_status(MemberStatus::Leaving)).unwrap();
/// let mut leave = Departure::new(5_000);
/// // The last node: nobody to hand off to.
/// assert_eq!(leave.step(0, &view, &me, true), DepartureStep::StopHere { reason: StopReason::NoSuccessor, first: true });
/// assert_eq!(leave.step(20, &view, &me, false), DepartureStep::Done);
/// assert!(leave.stopped_alone());
/// // Then the closing, in order.
/// use shardline_core::Closing;
/// assert_eq!(leave.close_step(20, false), Closing::RefuseWaiting);
/// assert_eq!(leave.close_step(20, false), Closing::Flush);
/// assert_eq!(leave.close_step(40, true), Closing::Exit);
/// assert_eq!(leave.close_step(40 + leave.goodbye_ms, true), Closing::Close);
/// ```
#[derive(Clone, Debug)]
pub struct Departure {
    /// How long without a leader before the shards stop here.
    pub leaderless_after_ms: u64,
    /// How long the goodbye is given to spread before the connections close (600 ms: a few
    /// gossip rounds).
    pub goodbye_ms: u64,
    /// When the leave gives up waiting: for the hand-offs (it fails), for the drains (it
    /// closes without them).
    deadline: u64,
    leaderless_since: Option<u64>,
    successorless_since: Option<u64>,
    stopped_alone: bool,
    phase: Phase,
}

impl Departure {
    /// A leave that stops its shards itself after `leaderless_after_ms` without a leader, and
    /// waits as long as it takes.
    pub fn new(leaderless_after_ms: u64) -> Self {
        Departure {
            leaderless_after_ms,
            goodbye_ms: 600,
            deadline: u64::MAX,
            leaderless_since: None,
            successorless_since: None,
            stopped_alone: false,
            phase: Phase::Start,
        }
    }

    /// The same leave, given up at `deadline` (a time on the clock `step` is given).
    pub fn until(mut self, deadline: u64) -> Self {
        self.deadline = deadline;
        self
    }

    /// The next step at `now`, given the view and whether this node still hosts a shard.
    pub fn step(&mut self, now: u64, view: &MembershipView, me: &NodeId, hosting: bool) -> DepartureStep {
        if !hosting {
            return DepartureStep::Done;
        }
        if now > self.deadline {
            return DepartureStep::TimedOut;
        }
        self.leaderless_since = match view.leader() {
            Some(_) => None,
            None => self.leaderless_since.or(Some(now)),
        };
        let leaderless = self.leaderless_since.is_some_and(|t| now.saturating_sub(t) >= self.leaderless_after_ms);
        // Entity types are not restricted to roles: any member that may host can take over.
        let successor = view.has_successor(me, None);
        self.successorless_since = if successor { None } else { self.successorless_since.or(Some(now)) };
        let joining = view.members().any(|m| &m.node != me && m.status == MemberStatus::Joining && !m.is_proxy());
        let waited = self.successorless_since.is_some_and(|t| now.saturating_sub(t) >= self.leaderless_after_ms);
        let reason = if !successor && (!joining || waited) {
            StopReason::NoSuccessor
        } else if leaderless {
            StopReason::NoLeader
        } else {
            return DepartureStep::Wait;
        };
        let first = !self.stopped_alone;
        self.stopped_alone = true;
        DepartureStep::StopHere { reason, first }
    }

    /// Whether this leave stopped shards itself (messages that arrived for them meanwhile have
    /// nowhere to go, and fail).
    pub fn stopped_alone(&self) -> bool {
        self.stopped_alone
    }

    /// The next step of the closing at `now`, once [`step`](Self::step) said
    /// [`Done`](DepartureStep::Done); `settled`: every drain is confirmed. The drains are waited
    /// for until the deadline, the goodbye for [`goodbye_ms`](Self::goodbye_ms); after
    /// [`Closing::Close`] the leave is over.
    pub fn close_step(&mut self, now: u64, settled: bool) -> Closing {
        match self.phase {
            Phase::Start => {
                self.phase = Phase::Flushing;
                if self.stopped_alone {
                    return Closing::RefuseWaiting;
                }
                self.close_step(now, settled)
            }
            Phase::Flushing => {
                self.phase = Phase::Settling;
                Closing::Flush
            }
            Phase::Settling if settled || now >= self.deadline => {
                self.phase = Phase::Exited(now);
                Closing::Exit
            }
            Phase::Settling => Closing::Wait,
            Phase::Exited(at) if now.saturating_sub(at) >= self.goodbye_ms => Closing::Close,
            Phase::Exited(_) => Closing::Wait,
        }
    }
}
