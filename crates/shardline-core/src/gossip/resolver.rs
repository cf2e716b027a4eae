//! The split-brain resolver of gossip membership: once the set of unreachable members has stayed
//! the same for `stable_after`, a [`SplitBrainPolicy`] decides which side survives. The surviving
//! side downs the unreachable members; a member on the losing side downs itself (it stops its
//! shards and comes back as a new incarnation).
//!
//! Waiting for a stable set, not for each member's own timeout, is what makes both sides decide
//! over the same two sets: while a partition is still being discovered, members drift from
//! reachable to unreachable, and a decision then would be taken over different sets on each side.
//! SWIM probes one member per period, so a member cut off from this node may go unprobed for as
//! many periods as there are members: the set only counts as stable after at least that long
//! (the engine passes the window). A 2 s window on six members let a side of two, which had not
//! yet probed one member of the other side, count it as its own, find itself the majority, and
//! down the real majority (a real partition test found it).

use std::collections::BTreeSet;

use crate::id::NodeId;
use crate::membership::Member;
use crate::split_brain::{SplitBrainDecision, SplitBrainPolicy};

/// The resolver's state: the policy, and the unreachable set with since when it is unchanged.
#[derive(Debug)]
pub(super) struct Resolver {
    policy: SplitBrainPolicy,
    /// The window of the latest observation.
    window_ms: u64,
    unstable: Option<(BTreeSet<NodeId>, u64)>,
    /// The members known when some member first became unreachable (and none has been
    /// reachable-only since): only they count in the decision.
    known_at_start: Option<BTreeSet<NodeId>>,
}

impl Resolver {
    /// None for a policy gossip alone cannot carry out (`LeaseMajority` needs a store).
    pub fn new(policy: SplitBrainPolicy) -> Option<Resolver> {
        if matches!(policy, SplitBrainPolicy::LeaseMajority { .. }) {
            return None;
        }
        Some(Resolver { policy, window_ms: 0, unstable: None, known_at_start: None })
    }

    /// The members this node reaches (itself included) and those it does not, at `now`: the
    /// decision once the unreachable set has been the same for `window_ms`, None before (or with
    /// nobody unreachable).
    pub fn observe(
        &mut self,
        now: u64,
        window_ms: u64,
        reachable: &[Member],
        unreachable: &[Member],
    ) -> Option<SplitBrainDecision> {
        self.window_ms = window_ms;
        let set: BTreeSet<NodeId> = unreachable.iter().map(|m| m.node.clone()).collect();
        if set.is_empty() {
            self.unstable = None;
            self.known_at_start = None;
            return None;
        }
        // A member that joined one side while the other was unreachable is unknown to the other
        // side: counted on one side only, it could make both sides a majority (the world found
        // two sides that each kept themselves that way). Count the members known at the start.
        let known = self
            .known_at_start
            .get_or_insert_with(|| reachable.iter().chain(unreachable).map(|m| m.node.clone()).collect())
            .clone();
        let since = match &self.unstable {
            Some((same, since)) if *same == set => *since,
            _ => {
                self.unstable = Some((set, now));
                now
            }
        };
        if now.saturating_sub(since) < self.window_ms {
            return None;
        }
        self.unstable = None;
        self.known_at_start = None;
        // Proxies host nothing: they follow their side, and do not count.
        let hosts = |side: &[Member]| {
            side.iter().filter(|m| !m.is_proxy() && known.contains(&m.node)).cloned().collect::<Vec<_>>()
        };
        let (r, u) = (hosts(reachable), hosts(unreachable));
        if u.is_empty() {
            return Some(SplitBrainDecision::DownUnreachable);
        }
        Some(self.policy.decide(&r, &u, None))
    }

    /// When the unreachable set will have been stable long enough.
    pub fn deadline(&self) -> Option<u64> {
        self.unstable.as_ref().map(|(_, since)| since + self.window_ms)
    }
}
