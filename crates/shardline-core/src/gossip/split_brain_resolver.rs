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
//!
//! A set that never settles must not keep a node from deciding forever: the other side may have
//! decided and will take this side's shards once its margin ends. A node whose unreachable set
//! has kept changing for the window and `unstable_ms` more (the time the whole other side
//! takes to fall silent, and three quarters of `stable_after`) since it first saw anyone unreachable
//! downs itself, whichever side it is on (Akka's `down-all-when-unstable`); the engine's down
//! margin covers that bound, so the whole losing side has stopped before anyone takes over. The
//! simulation found the case: a node alone on its side, regrouped by a second partition before
//! its set had settled, never decided, and the other side took it over while it ran.

use std::collections::BTreeSet;

use crate::id::NodeId;
use crate::membership::Member;
use crate::split_brain::{SplitBrainDecision, SplitBrainPolicy};

/// What the resolver concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Resolution {
    /// The set was stable for the window: the policy decided.
    Decided(SplitBrainDecision),
    /// The set kept changing for too long (for `unstable_ms` since this node first saw anyone
    /// unreachable): this node downs itself.
    Unstable {
        /// Since when, in ms, anyone has been unreachable.
        unstable_ms: u64,
    },
}

/// The resolver's state: the policy, and the unreachable set with since when it is unchanged.
#[derive(Debug)]
pub(super) struct Resolver {
    policy: SplitBrainPolicy,
    /// How long past the window a set may keep changing before this node downs itself.
    unstable_ms: u64,
    /// The window of the latest observation (the engine's `unstable_ms` likewise).
    window_ms: u64,
    unstable: Option<(BTreeSet<NodeId>, u64)>,
    /// Since when anyone has been unreachable (without a decision since).
    first_unreachable: Option<u64>,
}

impl Resolver {
    /// None for a policy gossip alone cannot carry out (`LeaseMajority` needs a store).
    pub fn new(policy: SplitBrainPolicy) -> Option<Resolver> {
        if matches!(policy, SplitBrainPolicy::LeaseMajority { .. }) {
            return None;
        }
        Some(Resolver { policy, unstable_ms: 0, window_ms: 0, unstable: None, first_unreachable: None })
    }

    /// Since when anyone has been unreachable, without a decision since.
    pub fn first_unreachable(&self) -> Option<u64> {
        self.first_unreachable
    }

    /// The unreachable set as last observed, when anyone is unreachable.
    pub fn unreachable(&self) -> Option<&BTreeSet<NodeId>> {
        self.unstable.as_ref().map(|(set, _)| set)
    }

    /// The members this node reaches (itself included) and those it does not, at `now`: the
    /// decision once the unreachable set has been the same for `window_ms`, None before (or with
    /// nobody unreachable). Members in `recent` (known too briefly to be known on both sides)
    /// do not count on this side. A set still changing `unstable_ms` after the window since
    /// anyone first became unreachable ends in [`Resolution::Unstable`]. `cut_off`: this node
    /// hears nothing from any member: it then loses a tie (see `tie_lost_when_cut_off`).
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        now: u64,
        window_ms: u64,
        unstable_ms: u64,
        reachable: &[Member],
        unreachable: &[Member],
        recent: &BTreeSet<NodeId>,
        cut_off: bool,
    ) -> Option<Resolution> {
        self.window_ms = window_ms;
        self.unstable_ms = unstable_ms;
        let set: BTreeSet<NodeId> = unreachable.iter().map(|m| m.node.clone()).collect();
        if set.is_empty() {
            self.unstable = None;
            self.first_unreachable = None;
            return None;
        }
        let first = *self.first_unreachable.get_or_insert(now);
        let since = match &self.unstable {
            Some((same, since)) if *same == set => *since,
            _ => {
                self.unstable = Some((set, now));
                now
            }
        };
        if now.saturating_sub(since) < self.window_ms {
            let unstable_ms = now.saturating_sub(first);
            if unstable_ms < self.window_ms + self.unstable_ms {
                return None;
            }
            self.reset();
            return Some(Resolution::Unstable { unstable_ms });
        }
        self.reset();
        // Proxies host nothing: they follow their side, and do not count.
        let hosts = |side: &[Member]| side.iter().filter(|m| !m.is_proxy()).cloned().collect::<Vec<_>>();
        let mut r = hosts(reachable);
        r.retain(|m| !recent.contains(&m.node));
        let u = hosts(unreachable);
        if u.is_empty() {
            return Some(Resolution::Decided(SplitBrainDecision::DownUnreachable));
        }
        // Nobody on this side counts (all joined too recently): the side cannot claim anything.
        if r.is_empty() {
            return Some(Resolution::Decided(SplitBrainDecision::DownReachable));
        }
        if cut_off && self.tie_lost_when_cut_off(&r, &u) {
            return Some(Resolution::Decided(SplitBrainDecision::DownReachable));
        }
        Some(Resolution::Decided(self.policy.decide(&r, &u, None)))
    }

    /// A node that hears nothing from any member never wins a tie of `KeepMajority`: it downs
    /// itself. Silence proves nothing: from inside, "everything sent to me is lost" (a one-way
    /// cut) looks the same as "the others crashed", and with its inbound cut the other side
    /// still hears it, never finds itself on a losing side and keeps running, downed by a
    /// leader it outranks by the tie-break alone (the simulation found a leader that downed the
    /// member it could not hear, which then led with another). Cut off, a node is alone against
    /// everyone, so this only matters with two hosts. The cost: a two-member cluster whose other
    /// member crashed (or that is partitioned both ways) goes down entirely, since the survivor
    /// hears nothing.
    fn tie_lost_when_cut_off(&self, reachable: &[Member], unreachable: &[Member]) -> bool {
        matches!(self.policy, SplitBrainPolicy::KeepMajority) && reachable.len() == unreachable.len()
    }

    /// A decision was not carried out (see the engine's deferral): the set must be stable for a
    /// new window, and the time since anyone became unreachable still runs from `first`.
    pub fn defer(&mut self, first: u64) {
        self.unstable = None;
        self.first_unreachable = Some(first);
    }

    fn reset(&mut self) {
        self.unstable = None;
        self.first_unreachable = None;
    }

    /// When the unreachable set will have been stable long enough, or unstable too long.
    pub fn deadline(&self) -> Option<u64> {
        let stable = self.unstable.as_ref().map(|(_, since)| since + self.window_ms);
        let unstable = self.first_unreachable.map(|first| first + self.window_ms + self.unstable_ms);
        stable.into_iter().chain(unstable).min()
    }
}
