//! The split-brain resolver of gossip membership: once the set of unreachable members has stayed
//! the same for `stable_after`, a [`SplitBrainPolicy`] decides which side survives. The surviving
//! side downs the unreachable members; a member on the losing side downs itself (it stops its
//! shards and comes back as a new incarnation).
//!
//! Waiting for a stable set, not for each member's own timeout, is what makes both sides decide
//! over the same two sets: while a partition is still being discovered, members drift from
//! reachable to unreachable, and a decision then would be taken over different sets on each side.

use std::collections::BTreeSet;

use crate::id::NodeId;
use crate::membership::Member;
use crate::split_brain::{SplitBrainDecision, SplitBrainPolicy};

/// The resolver's state: the policy, and the unreachable set with since when it is unchanged.
#[derive(Debug)]
pub(super) struct Resolver {
    policy: SplitBrainPolicy,
    stable_after_ms: u64,
    unstable: Option<(BTreeSet<NodeId>, u64)>,
}

impl Resolver {
    /// None for a policy gossip alone cannot carry out (`LeaseMajority` needs a store).
    pub fn new(policy: SplitBrainPolicy, stable_after_ms: u64) -> Option<Resolver> {
        if matches!(policy, SplitBrainPolicy::LeaseMajority { .. }) {
            return None;
        }
        Some(Resolver { policy, stable_after_ms, unstable: None })
    }

    /// The members this node reaches (itself included) and those it does not, at `now`: the
    /// decision once the unreachable set has been the same for `stable_after`, None before (or
    /// with nobody unreachable).
    pub fn observe(&mut self, now: u64, reachable: &[Member], unreachable: &[Member]) -> Option<SplitBrainDecision> {
        let set: BTreeSet<NodeId> = unreachable.iter().map(|m| m.node.clone()).collect();
        if set.is_empty() {
            self.unstable = None;
            return None;
        }
        let since = match &self.unstable {
            Some((same, since)) if *same == set => *since,
            _ => {
                self.unstable = Some((set, now));
                now
            }
        };
        if now.saturating_sub(since) < self.stable_after_ms {
            return None;
        }
        self.unstable = None;
        // Proxies host nothing: they follow their side, and do not count.
        let hosts = |side: &[Member]| side.iter().filter(|m| !m.is_proxy()).cloned().collect::<Vec<_>>();
        let (r, u) = (hosts(reachable), hosts(unreachable));
        if u.is_empty() {
            return Some(SplitBrainDecision::DownUnreachable);
        }
        Some(self.policy.decide(&r, &u, None))
    }

    /// When the unreachable set will have been stable long enough.
    pub fn deadline(&self) -> Option<u64> {
        self.unstable.as_ref().map(|(_, since)| since + self.stable_after_ms)
    }
}
