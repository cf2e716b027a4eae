//! `Seeds`: nodes join through seed addresses and gossip membership with every heartbeat.
//!
//! - The leader is the oldest `Up` member this node can reach (proxies excluded); its term is
//!   one more than any term it has seen, and travels in gossip.
//! - Every heartbeat feeds a phi-accrual detector per member. A member it suspects is
//!   unreachable in the view (the coordinator then rebalances nothing and begins no hand-off
//!   with it); the leader declares a member `Down` when it has not been heard from for
//!   `down_after` (default 5 s).
//! - A node that learns it was declared `Down` stops hosting (fenced) and must restart.
//!
//! **No split-brain protection.** Two sides of a partition each elect a leader and each declare
//! the other down, so a shard can end up hosted on both sides. Use `Seeds` for development and
//! single-host clusters; production clusters use a lease provider (etcd or NATS).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shardline_core::{Member, MemberStatus, MembershipView, NodeId, PhiAccrualConfig, PhiAccrualDetector};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::{BoxFuture, ClusterView, Control, ControlHandle, MembershipHandle, MembershipProvider, ProviderContext};
use crate::error::ConfigError;
use crate::transport::Frame;

/// Settings of the seed-node provider.
#[derive(Clone, Debug)]
pub struct SeedsConfig {
    /// How often members gossip (and so heartbeat) (default 500 ms).
    pub heartbeat_interval: Duration,
    /// Silence after which the leader declares a member down (default 5 s).
    pub down_after: Duration,
    /// Failure detector settings (default: Akka's, with a 1 s acceptable pause).
    pub phi: PhiAccrualConfig,
    /// How long down or removed members are remembered (default 60 s).
    pub tombstone_ttl: Duration,
    /// Terms this node leads with are above this one (default 0). Gossip keeps terms growing
    /// while any member lives; a cluster restarted from scratch starts again from here. Set it
    /// to the journal's highest fence term ([`Journal::highest_term`](crate::journal::Journal::highest_term))
    /// or the restarted cluster's writes would be fenced out by its own earlier incarnation.
    pub term_floor: u64,
}

impl Default for SeedsConfig {
    fn default() -> Self {
        SeedsConfig {
            heartbeat_interval: Duration::from_millis(500),
            down_after: Duration::from_secs(5),
            phi: PhiAccrualConfig {
                acceptable_heartbeat_pause_ms: 1_000.0,
                first_heartbeat_estimate_ms: 500.0,
                ..PhiAccrualConfig::default()
            },
            tombstone_ttl: Duration::from_secs(60),
            term_floor: 0,
        }
    }
}

/// Joins the cluster through seed addresses. See the module docs.
#[derive(Clone, Debug)]
pub struct Seeds {
    seeds: Vec<String>,
    config: SeedsConfig,
}

impl Seeds {
    /// Seed addresses (`host:port`). A node whose own address is the only seed starts a cluster.
    pub fn new<S: Into<String>>(seeds: impl IntoIterator<Item = S>) -> Self {
        Seeds { seeds: seeds.into_iter().map(Into::into).collect(), config: SeedsConfig::default() }
    }

    /// With settings.
    pub fn with_config(mut self, config: SeedsConfig) -> Self {
        self.config = config;
        self
    }

    /// Leads only with terms above `floor`; see [`SeedsConfig::term_floor`].
    pub fn term_floor(mut self, floor: u64) -> Self {
        self.config.term_floor = floor;
        self
    }
}

/// One member as gossiped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GossipMember {
    /// The node.
    pub node: NodeId,
    /// Where it listens.
    pub addr: String,
    /// Its status.
    pub status: MemberStatus,
    /// Its application version.
    pub app_version: String,
    /// Its roles.
    pub roles: Vec<String>,
    /// Its weight.
    pub weight: u32,
    /// The term it leads with (0 when not leading).
    pub leader_term: u64,
}

/// A gossip message: the sender's whole member list. Doubles as a heartbeat.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gossip {
    /// The sender.
    pub from: NodeId,
    /// The sender's members.
    pub members: Vec<GossipMember>,
    /// The largest term the sender has seen. Members' own terms are not enough: a leader that
    /// steps down clears its term, and a successor that only saw it cleared would reuse it.
    pub max_term: u64,
}

fn rank(s: MemberStatus) -> u8 {
    match s {
        MemberStatus::Joining => 0,
        MemberStatus::Up => 1,
        MemberStatus::Leaving => 2,
        MemberStatus::Exiting => 3,
        MemberStatus::Down => 4,
        MemberStatus::Removed => 5,
    }
}

struct State {
    me: NodeId,
    config: SeedsConfig,
    members: BTreeMap<NodeId, GossipMember>,
    detectors: HashMap<NodeId, PhiAccrualDetector>,
    last_heard: HashMap<NodeId, Instant>,
    first_seen: HashMap<NodeId, Instant>,
    fenced_at: HashMap<NodeId, Instant>,
    max_term: u64,
    clock: Instant,
    heard_from_others: bool,
    /// When this node may start a cluster alone (None: it must join one).
    bootstrap_at: Option<Instant>,
}

/// This node's term tag (the low half of its terms): a hash of its identity, never 0.
fn term_tag(node: &NodeId) -> u32 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.hash(&mut h);
    (h.finish() as u32).max(1)
}

impl State {
    fn new(me: GossipMember, config: SeedsConfig, bootstrap_at: Option<Instant>) -> Self {
        State {
            me: me.node.clone(),
            config,
            members: BTreeMap::from([(me.node.clone(), me)]),
            detectors: HashMap::new(),
            last_heard: HashMap::new(),
            first_seen: HashMap::new(),
            fenced_at: HashMap::new(),
            max_term: 0,
            clock: Instant::now(),
            heard_from_others: false,
            bootstrap_at,
        }
    }

    fn ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    fn reachable(&self, node: &NodeId) -> bool {
        if node == &self.me {
            return true;
        }
        let now = self.ms();
        match self.detectors.get(node) {
            Some(d) => d.is_available(now),
            None => false,
        }
    }

    fn merge(&mut self, g: Gossip) {
        let now = Instant::now();
        let clock_now = self.ms();
        self.detectors
            .entry(g.from.clone())
            .or_insert_with(|| PhiAccrualDetector::new(self.config.phi.clone()))
            .heartbeat(clock_now);
        self.last_heard.insert(g.from.clone(), now);
        // Joined only once we hear of a cluster that has had a leader. Gossip from another node
        // that has not joined either (a second seed, a proxy driver started first) is no
        // cluster: leading on it formed a second cluster with the same term as the first seed's
        // (the demo's first phases stalled when its driver reached a second seed first).
        if g.from != self.me && (g.max_term > 0 || g.members.iter().any(|m| m.leader_term > 0)) {
            self.heard_from_others = true;
        }
        self.max_term = self.max_term.max(g.max_term);
        for m in g.members {
            self.max_term = self.max_term.max(m.leader_term);
            match self.members.get_mut(&m.node) {
                Some(local) => {
                    if rank(m.status) > rank(local.status) {
                        local.status = m.status;
                    }
                    if m.node != self.me {
                        local.leader_term = m.leader_term;
                    }
                }
                None => {
                    self.first_seen.insert(m.node.clone(), now);
                    self.members.insert(m.node.clone(), m);
                }
            }
        }
        // A newer incarnation of a name means the older one is dead.
        let names: Vec<(NodeId, u64)> = self.members.keys().map(|n| (n.clone(), n.incarnation)).collect();
        for (n, inc) in &names {
            if names.iter().any(|(o, i)| o.same_name(n) && i > inc) {
                if let Some(m) = self.members.get_mut(n) {
                    if rank(m.status) < rank(MemberStatus::Down) {
                        m.status = MemberStatus::Down;
                    }
                }
            }
        }
    }

    /// The oldest Up member this node can reach, proxies excluded. None until this node has
    /// joined (heard from another member) or may start a cluster alone.
    fn leader(&self) -> Option<NodeId> {
        if !self.heard_from_others && self.bootstrap_at.is_none_or(|t| Instant::now() < t) {
            return None;
        }
        self.members
            .values()
            .filter(|m| m.status == MemberStatus::Up && !m.roles.iter().any(|r| r == shardline_core::PROXY_ROLE))
            .filter(|m| self.reachable(&m.node))
            .map(|m| &m.node)
            .min_by_key(|n| (n.incarnation, (*n).clone()))
            .cloned()
    }

    /// Leader duties, term bookkeeping, tombstones.
    fn tick(&mut self) {
        let now = Instant::now();
        let leader = self.leader();
        let me = self.me.clone();
        let i_lead = leader.as_ref() == Some(&me);
        let my_term = self.members.get(&me).map(|m| m.leader_term).unwrap_or(0);
        if i_lead && my_term == 0 {
            // Not one above the largest heard: two members that each believe they are first in
            // line at once would take the same term (the gossip simulation found it).
            self.max_term =
                shardline_core::gossip::term_above(self.max_term.max(self.config.term_floor), term_tag(&me));
            let t = self.max_term;
            if let Some(m) = self.members.get_mut(&me) {
                m.leader_term = t;
            }
            info!(term = t, "this node leads the cluster");
        } else if !i_lead && my_term != 0 {
            if let Some(m) = self.members.get_mut(&me) {
                m.leader_term = 0;
            }
        }
        if i_lead {
            let down_after = self.config.down_after;
            let mut downs = Vec::new();
            for m in self.members.values() {
                if m.node == me || rank(m.status) >= rank(MemberStatus::Down) {
                    continue;
                }
                let heard = self.last_heard.get(&m.node).or_else(|| self.first_seen.get(&m.node)).copied();
                if heard.is_some_and(|h| now.duration_since(h) >= down_after) {
                    downs.push(m.node.clone());
                }
            }
            for n in downs {
                warn!(node = %n, "declaring unreachable member down");
                if let Some(m) = self.members.get_mut(&n) {
                    m.status = MemberStatus::Down;
                }
            }
        }
        for m in self.members.values() {
            if rank(m.status) >= rank(MemberStatus::Down) {
                self.fenced_at.entry(m.node.clone()).or_insert(now);
            }
        }
        let ttl = self.config.tombstone_ttl;
        let expired: Vec<NodeId> =
            self.fenced_at.iter().filter(|(_, t)| now.duration_since(**t) >= ttl).map(|(n, _)| n.clone()).collect();
        for n in expired {
            if n != me {
                self.members.remove(&n);
                self.detectors.remove(&n);
                self.last_heard.remove(&n);
                self.first_seen.remove(&n);
                self.fenced_at.remove(&n);
            }
        }
    }

    fn view(&self) -> ClusterView {
        let mut view = MembershipView::new();
        let mut addresses = BTreeMap::new();
        for m in self.members.values() {
            let mut member = Member::new(m.node.clone(), m.node.incarnation)
                .with_status(m.status)
                .with_version(&m.app_version)
                .with_weight(m.weight);
            for r in &m.roles {
                member = member.with_role(r.clone());
            }
            let _ = view.add(member);
            if let Ok(a) = m.addr.parse() {
                addresses.insert(m.node.clone(), a);
            }
        }
        // What this node's failure detector cannot reach: the coordinator holds rebalancing and
        // begins no hand-off towards or from it (a member heard of only through others counts
        // as unreachable until it is heard directly).
        for m in self.members.values() {
            if rank(m.status) < rank(MemberStatus::Down) && !self.reachable(&m.node) {
                let _ = view.set_reachable(&m.node, false);
            }
        }
        let leader = self.leader().and_then(|l| {
            let term = self.members.get(&l).map(|m| m.leader_term).unwrap_or(0);
            (term > 0).then_some((l, term))
        });
        let _ = view.set_leader(leader.as_ref().map(|(l, _)| l.clone()));
        ClusterView { view, leader, addresses }
    }

    fn gossip(&self) -> Gossip {
        Gossip { from: self.me.clone(), members: self.members.values().cloned().collect(), max_term: self.max_term }
    }

    fn set_own_status(&mut self, s: MemberStatus) {
        if let Some(m) = self.members.get_mut(&self.me) {
            if rank(s) > rank(m.status) {
                m.status = s;
            }
        }
    }
}

impl MembershipProvider for Seeds {
    fn start(self: Box<Self>, ctx: ProviderContext) -> BoxFuture<'static, Result<MembershipHandle, ConfigError>> {
        Box::pin(async move {
            let mut seeds = Vec::new();
            let mut first_is_me = self.seeds.is_empty();
            for (i, s) in self.seeds.iter().enumerate() {
                match tokio::net::lookup_host(s.as_str()).await {
                    Ok(mut addrs) => {
                        if let Some(a) = addrs.next() {
                            if a != ctx.addr {
                                seeds.push(a);
                            } else if i == 0 {
                                first_is_me = true;
                            }
                        }
                    }
                    Err(e) => return Err(ConfigError::Invalid { name: "seeds", reason: format!("{s}: {e}") }),
                }
            }
            let me = GossipMember {
                node: ctx.me.clone(),
                addr: ctx.addr.to_string(),
                status: MemberStatus::Up,
                app_version: ctx.app_version.clone(),
                roles: ctx.roles.clone(),
                weight: ctx.weight,
                leader_term: 0,
            };
            // Only the first seed may start a cluster, after trying the other seeds for a
            // moment (a restarted first seed must rejoin, not start a second cluster). With
            // no other seed it starts at once, so a single node works without waiting.
            let bootstrap_at = first_is_me.then(|| {
                let grace = if seeds.is_empty() { Duration::ZERO } else { self.config.heartbeat_interval * 3 };
                Instant::now() + grace
            });
            let mut state = State::new(me, self.config.clone(), bootstrap_at);
            state.tick();
            let (view_tx, views) = watch::channel(state.view());
            let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
            tokio::spawn(run(state, seeds, ctx, view_tx, ctl_rx));
            let control: Arc<dyn super::MembershipControl> = Arc::new(ControlHandle(ctl_tx));
            Ok(MembershipHandle { views, control, lease: None, maps: None })
        })
    }
}

async fn run(
    mut state: State,
    seeds: Vec<SocketAddr>,
    mut ctx: ProviderContext,
    view_tx: watch::Sender<ClusterView>,
    mut ctl: mpsc::UnboundedReceiver<Control>,
) {
    let mut interval = tokio::time::interval(state.config.heartbeat_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            g = ctx.gossip.recv() => match g {
                Some((_, g)) => state.merge(g),
                None => return,
            },
            c = ctl.recv() => match c {
                Some(Control::Leave) => state.set_own_status(MemberStatus::Leaving),
                Some(Control::Exit) => {
                    state.set_own_status(MemberStatus::Exiting);
                    state.set_own_status(MemberStatus::Removed);
                }
                Some(Control::Halt) | None => return,
            },
            _ = interval.tick() => {
                state.tick();
                let g = state.gossip();
                for m in state.members.values() {
                    if m.node == state.me || rank(m.status) >= rank(MemberStatus::Down) {
                        continue;
                    }
                    if let Ok(a) = m.addr.parse() {
                        ctx.transport.set_address(&m.node, a);
                    }
                    let _ = ctx.transport.send(&m.node, Frame::Gossip(g.clone()));
                }
                if !state.heard_from_others {
                    for &addr in &seeds {
                        let t = ctx.transport.clone();
                        let frame = Frame::Gossip(g.clone());
                        tokio::spawn(async move {
                            if let Err(e) = t.send_to_address(addr, frame).await {
                                tracing::debug!(%addr, error = %e, "seed not reachable yet");
                            }
                        });
                    }
                }
            }
        }
        let v = state.view();
        view_tx.send_if_modified(|old| {
            if *old != v {
                *old = v;
                true
            } else {
                false
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(name: &str, incarnation: u64, bootstrap: bool) -> State {
        state_with(name, incarnation, bootstrap, SeedsConfig::default())
    }

    fn state_with(name: &str, incarnation: u64, bootstrap: bool, config: SeedsConfig) -> State {
        let me = GossipMember {
            node: NodeId::new(name, incarnation),
            addr: "127.0.0.1:1".into(),
            status: MemberStatus::Up,
            app_version: "1".into(),
            roles: Vec::new(),
            weight: 1,
            leader_term: 0,
        };
        State::new(me, config, bootstrap.then(Instant::now))
    }

    fn term(s: &State) -> Option<u64> {
        s.view().leader.map(|(_, t)| t)
    }

    /// Two seeds that are not the first one, and a proxy, start before the first seed and hear
    /// from each other: none of them may lead (that would be a second cluster with the same
    /// term as the first seed's). They join once the first seed, leading, reaches them.
    #[test]
    fn nodes_that_have_not_joined_do_not_form_a_cluster_of_their_own() {
        let mut second = state("n2", 20, false);
        let mut third = state("n3", 30, false);
        let mut proxy = state("driver", 10, false);
        if let Some(m) = proxy.members.get_mut(&proxy.me.clone()) {
            m.roles.push(shardline_core::PROXY_ROLE.into());
        }
        for _ in 0..3 {
            second.merge(third.gossip());
            second.merge(proxy.gossip());
            third.merge(second.gossip());
            second.tick();
            third.tick();
            proxy.tick();
        }
        assert_eq!(second.view().leader, None);
        assert_eq!(third.view().leader, None);
        let mut first = state("n1", 5, true);
        first.tick();
        let t = term(&first).expect("the first seed leads");
        assert!(t > 0);
        second.merge(first.gossip());
        second.tick();
        assert_eq!(second.view().leader, Some((first.me.clone(), t)));
    }

    /// A member this node has heard of only through another's gossip is unreachable in its view
    /// (the coordinator moves nothing towards it) until it is heard directly.
    #[test]
    fn a_member_not_heard_directly_is_unreachable_in_the_view() {
        let mut a = state("a", 1, true);
        let mut b = state("b", 2, false);
        let c = state("c", 3, false);
        b.merge(c.gossip());
        a.merge(b.gossip());
        let view = a.view().view;
        assert!(view.is_reachable(&b.me));
        assert!(!view.is_reachable(&c.me), "c was only heard of through b");
        assert_eq!(view.rebalance_hold(None), Some(shardline_core::RebalanceHold::Unreachable(c.me.clone())));
        a.merge(c.gossip());
        assert!(a.view().view.is_reachable(&c.me));
        assert_eq!(a.view().view.rebalance_hold(None), None);
    }

    /// A cluster restarted from scratch on a journal whose fences reached term 7 leads above it.
    #[test]
    fn the_first_term_is_above_the_floor() {
        let mut first = state_with("n1", 1, true, SeedsConfig { term_floor: 7, ..SeedsConfig::default() });
        first.tick();
        assert!(term(&first).is_some_and(|t| t > 7));
    }

    /// Two members that take a term at once, each from the same largest term heard, take
    /// different ones.
    #[test]
    fn concurrent_leaders_never_share_a_term() {
        let mut a = state("a", 1, true);
        let mut b = state("b", 2, true);
        a.tick();
        b.tick();
        assert_ne!(term(&a), term(&b));
    }

    /// The first seed starts the cluster (term 1); an older node joins, so the seed steps down
    /// and clears its term before the newcomer hears from it. The newcomer must still lead with
    /// a larger term, or regions could not tell the two coordinators apart.
    #[test]
    fn a_successor_never_reuses_a_term_its_predecessor_cleared() {
        let mut seed = state("n1", 20, true);
        let mut older = state("n2", 10, false);
        seed.tick();
        let first = term(&seed).expect("the seed leads");
        seed.merge(older.gossip());
        seed.tick();
        assert_eq!(seed.members.get(&seed.me).map(|m| m.leader_term), Some(0), "stepped down");
        older.merge(seed.gossip());
        older.tick();
        let (leader, t) = older.view().leader.expect("the older node leads");
        assert_eq!(leader, older.me);
        assert!(t > first, "{t} after {first}");
    }
}
