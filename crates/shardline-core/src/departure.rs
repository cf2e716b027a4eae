//! A graceful leave, decided: hand the shards over while someone can take them, stop them here
//! when nobody can.
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
    /// Every shard is handed off or stopped: go on with the exit.
    Done,
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
/// ```
#[derive(Clone, Debug)]
pub struct Departure {
    /// How long without a leader before the shards stop here.
    pub leaderless_after_ms: u64,
    leaderless_since: Option<u64>,
    successorless_since: Option<u64>,
    stopped_alone: bool,
}

impl Departure {
    /// A leave that stops its shards itself after `leaderless_after_ms` without a leader.
    pub fn new(leaderless_after_ms: u64) -> Self {
        Departure { leaderless_after_ms, leaderless_since: None, successorless_since: None, stopped_alone: false }
    }

    /// The next step at `now`, given the view and whether this node still hosts a shard.
    pub fn step(&mut self, now: u64, view: &MembershipView, me: &NodeId, hosting: bool) -> DepartureStep {
        if !hosting {
            return DepartureStep::Done;
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
}
