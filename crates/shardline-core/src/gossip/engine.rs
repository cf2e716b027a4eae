//! The engine: foca's SWIM driven with time as an argument, its notifications and the status
//! broadcasts turned into a [`MembershipView`](crate::MembershipView) with a leader and its term.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use foca::{AccumulatingRuntime, Foca, Member, OwnedNotification, PostcardCodec, Timer};

use super::identity::GossipId;
use super::rng::SeededRng;
use super::split_brain_resolver::Resolver;
use super::status::{StatusBroadcasts, StatusItem, Statuses};
use crate::engine::Engine;
use crate::id::NodeId;
use crate::membership::MemberStatus;
use crate::shard_map::Term;

mod config;
mod downing;
mod hosting;
mod leader;
mod output;
mod proof;
mod view;

pub use config::GossipConfig;
pub use leader::term_above;
use leader::term_tag;
pub use output::{GossipCommand, GossipEvent, GossipView};
pub use proof::AddressAnswer;

/// Gossip membership of one node: SWIM (foca) for who is alive, status broadcasts for what each
/// member is doing, the oldest `Up` reachable member as leader.
pub struct GossipEngine {
    config: GossipConfig,
    foca: Foca<GossipId, PostcardCodec, SeededRng, StatusBroadcasts>,
    runtime: AccumulatingRuntime<GossipId>,
    statuses: Statuses,
    me: GossipId,
    node: NodeId,
    status: MemberStatus,
    version: u64,
    term: Term,
    /// The low half of every term this node takes: drawn once, so that two members that take a
    /// term at once (each believing it is first in line) never take the same one.
    tag: u32,
    /// The largest term heard of (in any status, or taken here).
    max_term: Term,
    /// When `max_term` last grew.
    max_term_at: u64,
    /// The largest term a status said its member leads in, and that member: who led `max_term`,
    /// when they are equal.
    max_leader: Option<(Term, NodeId)>,
    /// When this node may start a cluster alone (None: it must join one).
    bootstrap_at: Option<u64>,
    /// A first seed that rejoins ([`GossipConfig::rejoin`]): it starts a cluster only once it
    /// reaches members and none of them is part of a formed one.
    rejoining_seed: bool,
    /// Part of a formed cluster: it started one, or heard of a leader's term or of a member that
    /// is.
    formed: bool,
    seeds: Vec<GossipId>,
    timers: BTreeMap<(u64, u64), Timer<GossipId>>,
    next_timer: u64,
    /// Members declared down, with when, until their tombstone expires.
    down: BTreeMap<NodeId, (GossipId, u64)>,
    declared_down: bool,
    status_at: u64,
    announce_at: u64,
    commands: VecDeque<GossipCommand>,
    published: Option<GossipView>,
    resolver: Option<Resolver>,
    /// The time of the latest input (views are built at it).
    now: u64,
    /// When data last came from any member.
    heard_at: u64,
    /// The sender of the frame being handled (see `ask_for_members`).
    heard_from: Option<GossipId>,
    /// When a member last answered something this node sent (an ack of its probe, direct or
    /// forwarded, a feed for its announce): data that arrives shows that others reach this
    /// node, only answers show that this node reaches them.
    answered_at: u64,
    /// Answers to this node's probes, for [`hosting_until`](Self::hosting_until).
    answers: hosting::Answers,
    /// When each member's address was last checked ([`GossipCommand::CheckAddress`]).
    checked_at: BTreeMap<NodeId, u64>,
    /// Members proven gone (their address refused a connection, or another node answers
    /// there): down at once, without the margin for their side to stop.
    gone: BTreeSet<NodeId>,
    /// Each member's newest status version and when it arrived: a member whose statuses still
    /// come in is connected to this node's side, through others if not directly.
    status_seen: BTreeMap<NodeId, (u64, u64)>,
    /// When this node first knew of each member, and when it joined (its own entry, from the
    /// first member it reached): the resolver counts a member on its own side only once it has
    /// been known for a window.
    first_seen: BTreeMap<NodeId, u64>,
    /// When this node first joined (its first member reached). Unlike its `first_seen` entry,
    /// which a node that lost every member and is reached again starts anew, it never moves:
    /// the others may have known it, and downed it, since then (see `hosting_until`).
    joined_at: Option<u64>,
}

impl std::fmt::Debug for GossipEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GossipEngine").field("node", &self.node).field("status", &self.status).finish()
    }
}

impl GossipEngine {
    /// The engine of `me` (whose `node` must be set), joining through `seeds` (addresses; none:
    /// it starts a cluster, or waits to be found), with randomness from `seed`. None when the
    /// identity names no node or the settings are out of range.
    pub fn new(config: GossipConfig, me: GossipId, seeds: &[String], now: u64, seed: u64) -> Option<Self> {
        let node = me.node.clone()?;
        let ms = Duration::from_millis;
        let mut fc = foca::Config::simple();
        fc.probe_period = ms(config.probe_period_ms);
        fc.probe_rtt = ms(config.probe_rtt_ms);
        // With a resolver, suspicion never runs out into down by itself: the resolver decides.
        fc.suspect_to_down_after =
            if config.split_brain.is_some() { ms(365 * 24 * 3_600_000) } else { ms(config.suspect_to_down_ms) };
        let resolver = match config.split_brain.clone() {
            Some(policy) => Some(Resolver::new(policy)?),
            None => None,
        };
        fc.remove_down_after = Some(ms(config.remove_down_after_ms));
        fc.max_transmissions = NonZeroU8::new(6)?;
        fc.max_packet_size = NonZeroUsize::new(64 * 1024)?;
        fc.notify_down_members = true;
        fc.periodic_gossip =
            Some(foca::PeriodicParams { frequency: ms(config.gossip_every_ms), num_members: NonZeroUsize::new(3)? });
        // A suspicion spread only to one side of a partition is never refuted after the heal
        // unless the suspect hears of it: with the resolver, suspicion never runs out by itself,
        // so every member also swaps its full view with a random member now and then (foca's
        // announce, answered with a feed), which carries the suspicion to the suspect.
        fc.periodic_announce = config
            .split_brain
            .is_some()
            .then(|| foca::PeriodicParams { frequency: ms(config.announce_every_ms), num_members: NonZeroUsize::MIN });
        fc.periodic_announce_to_down_members =
            Some(foca::PeriodicParams { frequency: ms(config.announce_every_ms), num_members: NonZeroUsize::new(2)? });
        let statuses = Statuses::default();
        let foca = Foca::with_custom_broadcast(
            me.clone(),
            fc,
            SeededRng::new(seed),
            PostcardCodec,
            StatusBroadcasts(statuses.clone()),
        );
        // Only the first seed may start a cluster, after trying the others for a moment; with no
        // other seed it starts at once, so that a single node works without waiting. A first seed
        // that rejoins (see `GossipConfig::rejoin`) starts one only as `lead` allows. The only
        // seed, restarted (a cluster ran before: `term_floor`), has nobody to try: the members
        // that outlived it announce to its address, so it waits two of their announce periods
        // before it starts a cluster alone. Starting at once, it led a second cluster beside the
        // one that outlived it, which never merged (both led; the journal fenced one of them). A
        // node given no seed at all is a cluster of its own by design, and starts at once.
        let others = seeds.iter().filter(|a| **a != me.addr).count();
        let first = seeds.is_empty() || seeds.first() == Some(&me.addr);
        let rejoining_seed = first && (config.rejoin || config.term_floor > 0) && others > 0;
        let grace = match (seeds.len(), others, config.term_floor) {
            (0, ..) | (_, 0, 0) => 0,
            (_, 0, _) => config.bootstrap_grace_ms.max(2 * config.announce_every_ms + config.probe_period_ms),
            _ => config.bootstrap_grace_ms,
        };
        let bootstrap_at = (first && !rejoining_seed).then(|| now + grace);
        let seeds: Vec<GossipId> = seeds.iter().filter(|a| **a != me.addr).map(GossipId::seed).collect();
        let mut e = GossipEngine {
            config,
            foca,
            runtime: AccumulatingRuntime::new(),
            statuses,
            me,
            node,
            status: MemberStatus::Up,
            version: 0,
            term: 0,
            tag: term_tag(seed),
            max_term: 0,
            max_term_at: now,
            max_leader: None,
            bootstrap_at,
            rejoining_seed,
            formed: false,
            seeds,
            timers: BTreeMap::new(),
            next_timer: 0,
            down: BTreeMap::new(),
            declared_down: false,
            status_at: now,
            announce_at: now,
            commands: VecDeque::new(),
            published: None,
            resolver,
            now,
            heard_at: now,
            heard_from: None,
            answered_at: now,
            answers: hosting::Answers::default(),
            checked_at: BTreeMap::new(),
            gone: BTreeSet::new(),
            status_seen: BTreeMap::new(),
            first_seen: BTreeMap::new(),
            joined_at: None,
        };
        // Seeds are known as down placeholders: foca announces to down members periodically,
        // which is how this node joins, and how split sides find each other again.
        let placeholders = e.seeds.iter().cloned().map(Member::down).collect::<Vec<_>>();
        if let Err(error) = e.foca.apply_many(placeholders.into_iter(), false, &mut e.runtime) {
            e.log(GossipEvent::BadData { error: error.to_string() });
        }
        e.handle_timeout(now);
        Some(e)
    }

    /// This node.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// Data from a peer (a frame of the gossip protocol).
    pub fn handle_data(&mut self, now: u64, data: &[u8]) {
        let header = decode_header(data);
        let answer = header.as_ref().is_some_and(|h| answers(&self.me, h));
        // First: an answer read after a pause must not meet a send that the window forgot.
        self.forget_old_sends(now);
        // The member a join through this frame asks for the membership (`ask_for_members`).
        self.heard_from = header.as_ref().map(|h| h.src.clone());
        match self.foca.handle_data(data, &mut self.runtime) {
            Ok(()) => {
                self.heard_at = self.heard_at.max(now);
                if answer {
                    self.answered_at = self.answered_at.max(now);
                    if let Some(h) = &header {
                        self.note_answer(h);
                    }
                }
            }
            Err(error) => self.log(GossipEvent::BadData { error: error.to_string() }),
        }
        self.after(now);
        self.heard_from = None;
    }

    /// This node leaves gracefully: it says `Leaving` from now on.
    pub fn handle_leave(&mut self, now: u64) {
        if self.status == MemberStatus::Up || self.status == MemberStatus::Joining {
            self.status = MemberStatus::Leaving;
            self.broadcast_status(now);
            self.after(now);
        }
    }

    /// This node has handed everything off: it says `Removed` and leaves the cluster.
    pub fn handle_exit(&mut self, now: u64) {
        self.status = MemberStatus::Removed;
        self.broadcast_status(now);
        let _ = self.foca.leave_cluster(&mut self.runtime);
        self.after(now);
    }

    /// The journal refused a claim of this node's: a shard's fence is stored at `term`. When that
    /// is above every term this node has heard of, a cluster led apart from this one took it (a
    /// first seed restarted alone, the other side of a partition), or this one did before all its
    /// members restarted and forgot their terms. It then counts as heard of: this node's status
    /// tells it, so that the leader hears of it wherever the claim failed and outbids it, as it
    /// does a term another member led in; without that, the cluster could never claim the shard
    /// again. A fence at a term heard of already (a move within this cluster) changes nothing.
    pub fn handle_fenced_above(&mut self, now: u64, term: Term) {
        if term <= self.max_term {
            return;
        }
        self.max_term = term;
        self.max_term_at = now;
        self.broadcast_status(now);
        self.after(now);
    }

    fn log(&mut self, event: GossipEvent) {
        self.commands.push_back(GossipCommand::Log(event));
    }

    fn broadcast_status(&mut self, now: u64) {
        self.status_at = now + self.config.status_every_ms;
        self.version += 1;
        let item = StatusItem {
            node: self.node.clone(),
            version: self.version,
            status: self.status,
            leader_term: self.term,
            max_term: self.max_term,
            formed: self.formed,
        };
        match postcard::to_allocvec(&item) {
            Ok(data) => {
                if let Err(error) = self.foca.add_broadcast(&data) {
                    self.log(GossipEvent::BadData { error: error.to_string() });
                }
            }
            Err(e) => self.log(GossipEvent::BadData { error: e.to_string() }),
        }
    }

    /// Carries out what foca asked for, decides partitions and leadership, publishes the view.
    fn after(&mut self, now: u64) {
        self.now = self.now.max(now);
        self.note_statuses(now);
        self.resolve(now);
        // Notifications first: what they do may send (see `ask_for_members`).
        while let Some(n) = self.runtime.to_notify() {
            self.notified(now, n);
        }
        while let Some((to, data)) = self.runtime.to_send() {
            if let Some(h) = decode_header(&data) {
                self.note_sent(now, &h);
            }
            self.commands.push_back(GossipCommand::Send { to, data: data.to_vec() });
        }
        self.forget_old_sends(now);
        while let Some((after, timer)) = self.runtime.to_schedule() {
            self.next_timer += 1;
            let at = now + after.as_millis().min(u128::from(u64::MAX)) as u64;
            self.timers.insert((at, self.next_timer), timer);
        }
        let remove_after = self.config.remove_down_after_ms;
        let mut forgotten = Vec::new();
        self.down.retain(|node, (_, since)| {
            let keep = now.saturating_sub(*since) < remove_after;
            if !keep {
                forgotten.push(node.clone());
            }
            keep
        });
        if !forgotten.is_empty() {
            // Every restart is a new node id: kept, their statuses would pile up over a
            // long-lived cluster's rollouts. The largest term they told stays in `max_term`.
            let mut statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
            for node in &forgotten {
                self.gone.remove(node);
                self.checked_at.remove(node);
                statuses.remove(node);
                self.status_seen.remove(node);
                self.first_seen.remove(node);
            }
        }
        self.check_addresses(now);
        self.check_majority(now);
        self.lead(now);
        let view = self.view();
        if self.published.as_ref() != Some(&view) {
            self.published = Some(view.clone());
            self.commands.push_back(GossipCommand::Publish(view));
        }
    }

    fn notified(&mut self, now: u64, n: OwnedNotification<GossipId>) {
        match n {
            OwnedNotification::MemberUp(id) => {
                if let Some(node) = &id.node {
                    self.down.remove(node);
                }
            }
            OwnedNotification::MemberDown(id) => self.declare_down(now, id),
            // A newer incarnation at the address: the older one is gone (its port is taken), so
            // it needs no margin either.
            OwnedNotification::Rename(old, new) if old.node != new.node => {
                if let Some(node) = old.node.clone() {
                    self.gone.insert(node);
                }
                self.declare_down(now, old)
            }
            // Known to the others from now on: until then this node does not count on its own
            // side either (a restart that reached one side of a partition only).
            OwnedNotification::Active => {
                self.first_seen.insert(self.node.clone(), now);
                self.joined_at.get_or_insert(now);
                self.log(GossipEvent::Joined);
                self.ask_for_members();
                // An announce carries no status, so the members would hear this node's `Up` only
                // with the next periodic gossip: until then the coordinator sees it `Joining`
                // and holds every rebalance (up to a gossip period, 200 ms, added to each
                // scale-out). Gossip it at once.
                if let Err(error) = self.foca.gossip(&mut self.runtime) {
                    self.log(GossipEvent::BadData { error: error.to_string() });
                }
            }
            // Leaving the cluster makes foca defunct too: that is no declaration.
            OwnedNotification::Defunct if !self.declared_down && self.status != MemberStatus::Removed => {
                self.declared_down = true;
                self.log(GossipEvent::DeclaredDown);
            }
            _ => {}
        }
    }

    /// Announces to the member whose frame made this node active (or, failing that, to one
    /// that is alive), whose answer (a feed) lists every member it knows. A node joins when any
    /// message of a member reaches it, and only an announce's answer carries the whole
    /// membership: joined through a probe, a restarted node knew only the member that probed it
    /// (and whoever that probe mentioned in passing). When that member was on the losing side of
    /// a partition and downed itself, the node led a cluster of its own in which its resolver had
    /// nobody unreachable to decide about, while the winning side had downed it. One member is
    /// enough (every member's feed lists the cluster); joined through a feed, this costs one more.
    fn ask_for_members(&mut self) {
        let alive = |m: &foca::Member<GossipId>| m.state() == foca::State::Alive;
        let from = self.heard_from.take().filter(|f| self.foca.iter_members().any(|m| m.id() == f && alive(m)));
        let any = || self.foca.iter_members().find(|m| alive(m)).map(|m| m.id().clone());
        let Some(id) = from.or_else(any) else { return };
        if let Err(error) = self.foca.announce(id, &mut self.runtime) {
            self.log(GossipEvent::BadData { error: error.to_string() });
        }
    }

    fn declare_down(&mut self, now: u64, id: GossipId) {
        if let Some(node) = id.node.clone() {
            if !self.down.contains_key(&node) {
                let event = if self.has_left(&node) {
                    GossipEvent::MemberLeft { node: node.clone() }
                } else {
                    GossipEvent::MemberDown { node: node.clone() }
                };
                self.log(event);
            }
            // Told again (a newer incarnation took its address): it stays down since the first
            // time, or it would show up again as a member for another margin.
            self.down.entry(node).or_insert((id, now));
        }
    }

    /// Records when each member's status last advanced (see [`connected`]).
    fn note_statuses(&mut self, now: u64) {
        let statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
        for (node, item) in statuses.iter() {
            let seen = self.status_seen.entry(node.clone()).or_insert((item.version, now));
            if item.version > seen.0 {
                *seen = (item.version, now);
            }
        }
    }

    /// Whether `node` said it was done before it went (a graceful leave, not a failure).
    fn has_left(&self, node: &NodeId) -> bool {
        let statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
        statuses.get(node).is_some_and(|s| s.status == MemberStatus::Removed)
    }
}

/// Whether `data` answers something this node sent: an ack of its probe (direct, forwarded, or
/// of a ping it relayed), a feed for its announce, or word that it is held down.
fn answers(me: &GossipId, h: &foca::Header<GossipId>) -> bool {
    use foca::Message;
    h.dst.addr == me.addr
        && matches!(
            h.message,
            Message::Ack(_)
                | Message::ForwardedAck { .. }
                | Message::IndirectAck { .. }
                | Message::Feed
                | Message::TurnUndead
        )
}

/// The header of a frame (None when it cannot be read: foca reports that frame as bad data).
fn decode_header(mut data: &[u8]) -> Option<foca::Header<GossipId>> {
    use foca::Codec;
    PostcardCodec.decode_header(&mut data).ok()
}

/// Whether a member is connected to this node's side: SWIM holds it alive, or (with the resolver)
/// its statuses, one a second, still arrive, through others if not directly. With the resolver,
/// suspicion never runs out by itself, and a suspicion spread on one side of a healed partition
/// may never reach its suspect to be refuted; it must then neither hold the view unreachable nor
/// decide a partition.
fn connected(
    status_seen: &BTreeMap<NodeId, (u64, u64)>,
    config: &GossipConfig,
    now: u64,
    m: &foca::Member<GossipId>,
) -> bool {
    let fresh = status_fresh(status_seen, config, now, m) == Some(true);
    m.state() == foca::State::Alive || (config.split_brain.is_some() && m.state() == foca::State::Suspect && fresh)
}

/// Whether `m`'s status advanced within two status periods and a probe period (None: none
/// arrived yet).
fn status_fresh(
    status_seen: &BTreeMap<NodeId, (u64, u64)>,
    config: &GossipConfig,
    now: u64,
    m: &foca::Member<GossipId>,
) -> Option<bool> {
    let (_, at) = status_seen.get(m.id().node.as_ref()?)?;
    Some(now.saturating_sub(*at) < stale_after_ms(config))
}

/// How long a member's status may stand still before it counts as stale.
fn stale_after_ms(config: &GossipConfig) -> u64 {
    2 * config.status_every_ms + config.probe_period_ms
}

impl Engine for GossipEngine {
    type Command = GossipCommand;

    /// The next command to carry out.
    fn poll_command(&mut self) -> Option<GossipCommand> {
        self.commands.pop_front()
    }

    /// When [`handle_timeout`](Engine::handle_timeout) must be called next.
    fn poll_timeout(&self) -> Option<u64> {
        let timer = self.timers.keys().next().map(|(at, _)| *at);
        let resolve = self.resolver.as_ref().and_then(Resolver::deadline);
        // A downed member's margin ends: it is shown down from then on.
        let margin = self
            .down
            .iter()
            .filter(|(node, (_, since))| self.held_for_margin(node, *since, self.now))
            .map(|(_, (_, since))| since + self.down_margin_ms())
            .min();
        let majority = self.majority_deadline();
        [timer, Some(self.status_at), Some(self.announce_at), resolve, margin, majority].into_iter().flatten().min()
    }

    /// Time passed.
    fn handle_timeout(&mut self, now: u64) {
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let timer = entry.remove();
            if let Err(error) = self.foca.handle_timer(timer, &mut self.runtime) {
                self.log(GossipEvent::BadData { error: error.to_string() });
            }
        }
        if now >= self.announce_at {
            self.announce_at = now + self.config.announce_every_ms;
            // Until a member answers, announce to the seeds directly.
            if self.foca.num_members() == 0 {
                for seed in self.seeds.clone() {
                    let _ = self.foca.announce(seed, &mut self.runtime);
                }
            }
        }
        if now >= self.status_at {
            self.broadcast_status(now);
        }
        self.after(now);
    }
}
