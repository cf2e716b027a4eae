//! Split-brain policies: when a set of members is unreachable, which side survives.
//!
//! Each policy is a pure decision over the members this node can reach (itself included) and
//! those it cannot. The losing side downs itself: its nodes stop their shards and restart as new
//! incarnations; the winning side downs the unreachable members, which fences them.
//!
//! ```
//! use shardline_core::{Member, MemberStatus, NodeId, SplitBrainDecision, SplitBrainPolicy};
//! let m = |n: &str, age| Member::new(NodeId::new(n, 1), age).with_status(MemberStatus::Up);
//! let (a, b, c) = (m("a", 0), m("b", 1), m("c", 2));
//! let d = SplitBrainPolicy::KeepMajority.decide(&[a, b], &[c], None);
//! assert_eq!(d, SplitBrainDecision::DownUnreachable);
//! ```

use crate::membership::Member;

/// A split-brain resolution strategy.
#[derive(Clone, Debug, PartialEq)]
pub enum SplitBrainPolicy {
    /// The side with more members survives; on a tie, the side holding the lowest address.
    KeepMajority,
    /// The side with the oldest member survives. With `down_if_alone`, an oldest member cut off
    /// alone from all the others is the one downed.
    KeepOldest {
        /// Down the oldest if it is alone on its side.
        down_if_alone: bool,
    },
    /// A side survives only if it has at least `quorum` members.
    StaticQuorum {
        /// Minimum side size.
        quorum: usize,
    },
    /// The side that acquires a lease in the coordination store survives. The smaller a side,
    /// the longer it waits before trying, so the majority side usually wins (Endless).
    LeaseMajority {
        /// Wait of a side as large as the other; it scales with `unreachable / reachable`.
        acquire_delay_ms: u64,
    },
}

/// What this node's side must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SplitBrainDecision {
    /// This side survives: down every unreachable member.
    DownUnreachable,
    /// This side loses: down the reachable members, this node included.
    DownReachable,
    /// Try to acquire the lease after this delay, then decide again with the result.
    AcquireLease {
        /// Delay before trying, in milliseconds.
        delay_ms: u64,
    },
}

impl SplitBrainPolicy {
    /// Decides for the side made of `reachable` (this node included) against `unreachable`.
    /// `lease` is the outcome of the lease acquisition, for `LeaseMajority`.
    pub fn decide(&self, reachable: &[Member], unreachable: &[Member], lease: Option<bool>) -> SplitBrainDecision {
        use SplitBrainDecision::*;
        if unreachable.is_empty() {
            return DownUnreachable;
        }
        if reachable.is_empty() {
            return DownReachable;
        }
        let survive = |yes: bool| if yes { DownUnreachable } else { DownReachable };
        match self {
            SplitBrainPolicy::KeepMajority => {
                let (r, u) = (reachable.len(), unreachable.len());
                if r != u {
                    return survive(r > u);
                }
                let lowest = |side: &[Member]| side.iter().map(|m| &m.node).min().cloned();
                survive(lowest(reachable) < lowest(unreachable))
            }
            SplitBrainPolicy::KeepOldest { down_if_alone } => {
                let oldest = |side: &[Member]| side.iter().map(|m| (m.up_number, m.node.clone())).min();
                let here = oldest(reachable) < oldest(unreachable);
                if *down_if_alone {
                    if here && reachable.len() == 1 && unreachable.len() > 1 {
                        return DownReachable;
                    }
                    if !here && unreachable.len() == 1 && reachable.len() > 1 {
                        return DownUnreachable;
                    }
                }
                survive(here)
            }
            SplitBrainPolicy::StaticQuorum { quorum } => survive(reachable.len() >= *quorum),
            SplitBrainPolicy::LeaseMajority { acquire_delay_ms } => match lease {
                Some(acquired) => survive(acquired),
                None => {
                    let ratio = unreachable.len() as f64 / reachable.len() as f64;
                    let delay =
                        if reachable.len() > unreachable.len() { 0.0 } else { *acquire_delay_ms as f64 * ratio };
                    AcquireLease { delay_ms: delay.round() as u64 }
                }
            },
        }
    }
}
