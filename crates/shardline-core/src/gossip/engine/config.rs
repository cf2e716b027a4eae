//! The settings of gossip membership and their defaults: SWIM's pace, the split-brain
//! resolver, the windows that bound hosting, and the fault switches of the simulation. Apart
//! from the engine because choosing them, and why the defaults are what they are, concerns
//! whoever configures a node, not how the engine runs.

use crate::shard_map::Term;
use crate::split_brain::SplitBrainPolicy;

/// Settings of gossip membership (milliseconds).
#[derive(Clone, Debug)]
pub struct GossipConfig {
    /// How often a random member is probed (SWIM's protocol period).
    pub probe_period_ms: u64,
    /// How long a probe waits for its answer before asking others to probe indirectly.
    pub probe_rtt_ms: u64,
    /// How long a suspected member has to refute before it is down.
    pub suspect_to_down_ms: u64,
    /// How long a down member stays in the view (its tombstone).
    pub remove_down_after_ms: u64,
    /// How often members gossip updates to a few others.
    pub gossip_every_ms: u64,
    /// How often this node announces itself to seeds and down members (joining, and merging
    /// after a partition heals).
    pub announce_every_ms: u64,
    /// How often this node repeats its status, so that members who joined since learn it.
    pub status_every_ms: u64,
    /// Terms start above this (a cluster restarted on a journal whose fences reached it). Above
    /// zero, a cluster ran before: the first seed then starts one as a node that rejoins does
    /// (see [`rejoin`](Self::rejoin)), and the only seed waits two announce periods for the
    /// members that outlived it. A fence found above the cluster's terms later is handled by
    /// [`GossipEngine::handle_fenced_above`](super::GossipEngine::handle_fenced_above).
    pub term_floor: Term,
    /// How long the first seed tries the other seeds before it starts a cluster alone (a
    /// restarted first seed must rejoin, not start a second cluster).
    pub bootstrap_grace_ms: u64,
    /// This node comes back as a new incarnation after being declared down (or restarts: a
    /// `term_floor` above zero says the same). As the first seed it starts no cluster while it
    /// reaches nobody: the cluster that downed it (or that it lost a partition to) may be just
    /// out of reach, through a one-way cut or a partition that has not healed, and it would lead
    /// a second one, which the first has downed. Once it reaches members, has heard every one's
    /// status, and none of them is part of a formed cluster, every member has restarted (each side may have downed itself),
    /// and it forms one again after its grace.
    pub rejoin: bool,
    /// How a partition is resolved (default: `KeepMajority`). None: it is not — each side
    /// declares the other down once suspicion runs out, and both go on (see
    /// [`without_split_brain`](Self::without_split_brain)). `LeaseMajority` needs a store and
    /// is refused here.
    pub split_brain: Option<SplitBrainPolicy>,
    /// How long the set of unreachable members must stay the same before the resolver decides;
    /// never less than a probe period per member (plus one probe's wait), the longest a member
    /// can go unprobed.
    pub stable_after_ms: u64,
    /// With a resolver: how long a downed member is still shown unreachable rather than down
    /// (nobody takes its shards over yet), so that its own side has stopped them first; one probe
    /// period per member is added to it (see
    /// [`GossipEngine::down_margin_ms`](super::GossipEngine::down_margin_ms)).
    pub down_margin_ms: u64,
    /// Breaks the protocol: downed members count as down at once, without the margin that lets
    /// their side stop first. Exists so the simulation can prove it catches such a bug.
    #[cfg(feature = "fault-injection")]
    pub fault_no_down_margin: bool,
    /// Breaks the protocol: a member whose address does not answer counts as gone, as if its
    /// host had refused the connection. Exists so the simulations can prove they catch it.
    #[cfg(feature = "fault-injection")]
    pub fault_silence_proves_gone: bool,
    /// Breaks the protocol: this node may host whether or not a majority answers it (see
    /// [`GossipEngine::hosting_until`](super::GossipEngine::hosting_until)), so a paused or
    /// cut-off node runs on. Exists so the simulations can prove they catch it.
    #[cfg(feature = "fault-injection")]
    pub fault_host_without_majority: bool,
}

impl GossipConfig {
    /// The defaults with a split-brain resolver of `policy`, decided after `stable_after_ms`
    /// (also the down margin).
    ///
    /// ```
    /// use shardline_core::gossip::GossipConfig;
    /// use shardline_core::SplitBrainPolicy;
    ///
    /// let c = GossipConfig::with_split_brain(SplitBrainPolicy::KeepOldest { down_if_alone: true }, 7_000);
    /// assert_eq!((c.probe_period_ms, c.stable_after_ms, c.down_margin_ms), (1_000, 7_000, 7_000));
    /// ```
    pub fn with_split_brain(policy: SplitBrainPolicy, stable_after_ms: u64) -> Self {
        GossipConfig {
            split_brain: Some(policy),
            stable_after_ms,
            down_margin_ms: stable_after_ms,
            ..GossipConfig::default()
        }
    }

    /// No split-brain resolver (the explicit opt-out, `--split-brain off`): each side of a
    /// partition declares the other down once suspicion runs out (2 s after a missed probe) and
    /// both go on, so **a partition hosts the same shards on both sides**, and a paused member
    /// runs on when it wakes until it hears it was downed. SWIM runs at a faster pace (a probe
    /// every 500 ms, 250 ms for an answer), so a crash is repaired in about 3 s. For development
    /// and for clusters that must never stop a side, whatever it costs.
    ///
    /// ```
    /// use shardline_core::gossip::GossipConfig;
    ///
    /// let c = GossipConfig::without_split_brain();
    /// assert!(c.split_brain.is_none());
    /// assert_eq!((c.probe_period_ms, c.suspect_to_down_ms), (500, 2_000));
    /// ```
    pub fn without_split_brain() -> Self {
        GossipConfig {
            // A crash is repaired in about 3 s: probed within half a second, suspected after the
            // probe's wait and the indirect probes, down two seconds later unless refuted.
            probe_period_ms: 500,
            probe_rtt_ms: 250,
            suspect_to_down_ms: 2_000,
            split_brain: None,
            ..GossipConfig::default()
        }
    }
}

/// Safe by default: the `KeepMajority` resolver with a 5 s stable-after and down margin, and
/// SWIM at a probe a second (500 ms for an answer). A partition keeps the larger side (on a
/// tie, the side with the oldest member), and the other side stops its shards before they are
/// taken over (about 20 s on a few members). A crashed process whose host still answers is
/// proven gone by its refused address and replaced in about the time it takes to suspect it
/// (see [`AddressAnswer`](super::AddressAnswer)). The resolver's decisions wait for the stable
/// window and a margin anyway, so faster probing buys nothing there; and the simulation found
/// that with the faster pace a member that had only partly joined before a partition could keep
/// its tiny side.
impl Default for GossipConfig {
    fn default() -> Self {
        GossipConfig {
            probe_period_ms: 1_000,
            probe_rtt_ms: 500,
            suspect_to_down_ms: 4_000,
            remove_down_after_ms: 60_000,
            gossip_every_ms: 200,
            announce_every_ms: 2_000,
            status_every_ms: 1_000,
            term_floor: 0,
            bootstrap_grace_ms: 1_500,
            rejoin: false,
            split_brain: Some(SplitBrainPolicy::KeepMajority),
            stable_after_ms: 5_000,
            down_margin_ms: 5_000,
            #[cfg(feature = "fault-injection")]
            fault_no_down_margin: false,
            #[cfg(feature = "fault-injection")]
            fault_silence_proves_gone: false,
            #[cfg(feature = "fault-injection")]
            fault_host_without_majority: false,
        }
    }
}
