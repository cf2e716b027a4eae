//! One schedule: gossip engines on a simulated network with latency, loss, partitions,
//! asymmetric links, pauses, crashes and restarts as new incarnations.

use shardline_core::Engine;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hash;

use shardline_core::gossip::{
    AddressAnswer, GossipCommand, GossipConfig, GossipEngine, GossipEvent, GossipId, GossipView,
};
use shardline_core::{MemberStatus, NodeId, SplitBrainPolicy};

use super::queue::Queue;
use super::rng::Rng;

mod params;
pub use params::Params;

#[derive(Debug)]
enum Ev {
    Timer {
        slot: usize,
        inc: u64,
    },
    Deliver {
        to: usize,
        data: Vec<u8>,
    },
    Fault,
    /// What a connection to `member`'s address found, back at `slot`.
    Answer {
        slot: usize,
        inc: u64,
        member: GossipId,
        answer: AddressAnswer,
    },
    Unpause {
        slot: usize,
        inc: u64,
    },
    Heal {
        partition: u64,
    },
    HealLink {
        from: usize,
        to: usize,
    },
    /// A new incarnation: after a crash or a leave (a new process), or after being declared down
    /// (`rejoin`: the runtime knows, and only joins).
    Restart {
        slot: usize,
        rejoin: bool,
    },
}

struct SimNode {
    id: GossipId,
    engine: GossipEngine,
    alive: bool,
    paused_until: u64,
    deferred: Vec<Vec<u8>>,
    view: Option<GossipView>,
    declared_down: bool,
    timer_at: Option<u64>,
    /// The first seed, restarted before any term was taken: nothing it can read (the runtime's
    /// term floor comes from fences, and there are none yet) tells it from a first boot, so when
    /// it reaches no other seed within its grace it starts a cluster, as a first boot must, even
    /// though the others run on behind a partition. A cluster that ran before is told by its
    /// fences (see `fresh`); Akka's first seed has the same limit. The same holds for the first
    /// seed that rejoins after it was downed and reaches only members that restarted too (their
    /// statuses say no cluster is formed) while the survivors are out of its reach: it cannot
    /// tell that from a cluster whose members all restarted, and forms one (the design notes'
    /// "Terms that start over" name this limit; the world found it about once in 10,000
    /// schedules). A member that joins the cluster such a seed started, knowing no `Up` member
    /// outside it, cannot tell it from the real one either: it is part of the same island (the
    /// world found one that restarted behind a one-way cut, joined the rejoined seed and led the
    /// island once the seed had downed itself). G3 leaves the island out until its members name a
    /// leader outside it.
    island: bool,
}

pub struct World {
    p: Params,
    rng: Rng,
    now: u64,
    queue: Queue<Ev>,
    nodes: Vec<SimNode>,
    next_inc: u64,
    /// Each slot's side while a partition lasts (same number: they can talk).
    side: Vec<u64>,
    partition: u64,
    /// When the last fault scheduled so far ends (its heal, restart or wake-up).
    calm_at: u64,
    /// Until when a long partition lasts (no other starts meanwhile).
    long_until: u64,
    /// Links that drop everything from the first slot to the second, with until when.
    cut: BTreeMap<(usize, usize), u64>,
    terms: BTreeMap<u64, NodeId>,
    /// Members some leader's view has shown `Up` and reachable: its coordinator may have given
    /// them shards.
    hosts: BTreeSet<NodeId>,
    /// Partitions, one-way cuts and pauses: on with the resolver. Without one, each side of a
    /// partition downs the other and both go on, which is what the resolver is for.
    pub splits: bool,
    pub violations: Vec<String>,
    pub trace: std::collections::hash_map::DefaultHasher,
    pub steps: u64,
    pub downed: u64,
    pub verbose: bool,
}

fn addr(slot: usize) -> String {
    format!("10.0.0.{slot}:7000")
}

impl World {
    pub fn new(p: Params) -> Self {
        let mut w = World {
            rng: Rng::new(p.seed),
            now: 0,
            queue: Queue::new(),
            nodes: Vec::new(),
            next_inc: 0,
            side: vec![0; p.nodes],
            partition: 0,
            calm_at: 0,
            long_until: 0,
            cut: BTreeMap::new(),
            terms: BTreeMap::new(),
            hosts: BTreeSet::new(),
            splits: p.resolver,
            violations: Vec::new(),
            trace: Default::default(),
            steps: 0,
            downed: 0,
            verbose: false,
            p,
        };
        for slot in 0..w.p.nodes {
            let n = w.fresh(slot, false);
            w.nodes.push(n);
        }
        for slot in 0..w.p.nodes {
            w.after_input(slot);
        }
        for _ in 0..w.p.faults {
            let at = w.rng.range(500, w.p.active_ms);
            w.schedule(at, Ev::Fault);
        }
        w
    }

    fn fresh(&mut self, slot: usize, rejoin: bool) -> SimNode {
        self.next_inc += 1;
        let id = GossipId {
            addr: addr(slot),
            node: Some(NodeId::new(format!("n{slot}"), self.next_inc)),
            app_version: "1".into(),
            roles: Vec::new(),
            weight: 1,
        };
        // A starting node reads the highest term the journal's fences reached (the runtime's
        // term floor), so that a cluster restarted from scratch never reuses a term.
        let term_floor = self.terms.keys().next_back().copied().unwrap_or(0);
        // The broken engine never repeats its status.
        let status_every_ms = if self.p.broken_status { u64::MAX / 4 } else { GossipConfig::default().status_every_ms };
        let mut config = if self.p.resolver {
            GossipConfig::with_split_brain(SplitBrainPolicy::KeepMajority, self.p.stable_after_ms)
        } else {
            GossipConfig::without_split_brain()
        };
        config.fault_no_down_margin = self.p.broken_margin;
        config.fault_silence_proves_gone = self.p.broken_proof;
        config.fault_host_without_majority = self.p.broken_hosting;
        config.term_floor = term_floor;
        config.rejoin = rejoin;
        let island = slot == 0 && (term_floor == 0 || rejoin) && self.nodes.len() == self.p.nodes;
        config.status_every_ms = status_every_ms;
        // Every node knows the first two as seeds.
        let seeds: Vec<String> = (0..self.p.nodes.min(2)).map(addr).collect();
        let seed = self.rng.next_u64();
        let engine = match GossipEngine::new(config, id.clone(), &seeds, self.now, seed) {
            Some(e) => e,
            None => panic!("the identity names its node"),
        };
        self.log(|| format!("start {:?}", id.node));
        SimNode {
            id,
            engine,
            alive: true,
            paused_until: 0,
            deferred: Vec::new(),
            view: None,
            declared_down: false,
            timer_at: None,
            island,
        }
    }

    fn schedule(&mut self, at: u64, ev: Ev) {
        self.queue.push(self.now, at, ev);
    }

    fn log(&self, what: impl FnOnce() -> String) {
        if self.verbose {
            eprintln!("[{:>6}] {}", self.now, what());
        }
    }

    fn inc(&self, slot: usize) -> u64 {
        self.nodes[slot].id.node.as_ref().map_or(0, |n| n.incarnation)
    }

    fn slot_of(&self, a: &str) -> Option<usize> {
        (0..self.p.nodes).find(|s| addr(*s) == a)
    }

    fn after_input(&mut self, slot: usize) {
        let now = self.now;
        let commands: Vec<GossipCommand> = self.nodes[slot].engine.drain_commands().collect();
        for c in commands {
            match c {
                GossipCommand::Send { to, data } => {
                    let Some(dest) = self.slot_of(&to.addr) else { continue };
                    if self.side[slot] != self.side[dest] || self.cut.contains_key(&(slot, dest)) {
                        continue;
                    }
                    if now < self.p.active_ms && self.rng.chance(self.p.loss) {
                        continue;
                    }
                    // Delivered to whichever incarnation listens at the address then (as a socket
                    // would): that is how a restarted node is found.
                    let mut at = now + self.rng.range(1, self.p.latency_ms + 1);
                    // A busy machine: now and then a message waits far longer than the network's
                    // latency (a starved process), enough to miss a probe's deadline.
                    if now < self.p.active_ms && self.rng.chance(self.p.stalls) {
                        at += self.rng.range(200, 1_500);
                    }
                    self.schedule(at, Ev::Deliver { to: dest, data });
                }
                GossipCommand::CheckAddress { member } => self.check_address(slot, member),
                GossipCommand::Publish(view) => {
                    self.log(|| {
                        let ms: Vec<String> = view
                            .view
                            .members()
                            .map(|m| {
                                let r = if view.view.is_reachable(&m.node) { "" } else { "?" };
                                format!("{}:{:?}{r}", m.node, m.status)
                            })
                            .collect();
                        format!("n{slot} view: leader {:?} [{}]", view.leader, ms.join(" "))
                    });
                    if let Some((l, term)) = &view.leader {
                        self.claim(*term, l.clone());
                        if Some(l) != self.nodes[slot].id.node.as_ref() {
                            // Part of a cluster a member outside the island leads: whatever it
                            // started alone is over, and G3 holds for it again.
                            if !self.island().contains(l) {
                                self.nodes[slot].island = false;
                            }
                        } else {
                            let up = view
                                .view
                                .members()
                                .filter(|m| m.status == MemberStatus::Up && view.view.is_reachable(&m.node));
                            self.hosts.extend(up.map(|m| m.node.clone()));
                        }
                    }
                    self.nodes[slot].view = Some(view);
                }
                GossipCommand::Log(e) => {
                    match &e {
                        GossipEvent::Leads { term } => {
                            if let Some(me) = self.nodes[slot].id.node.clone() {
                                self.claim(*term, me);
                            }
                        }
                        GossipEvent::Joined => {
                            let island = self.island();
                            let me = self.nodes[slot].id.node.clone();
                            let view = self.nodes[slot].engine.view();
                            let mut others = view
                                .view
                                .members()
                                .filter(|m| m.status == MemberStatus::Up && Some(&m.node) != me.as_ref())
                                .peekable();
                            if others.peek().is_some() && others.all(|m| island.contains(&m.node)) {
                                self.nodes[slot].island = true;
                            }
                        }
                        GossipEvent::DeclaredDown if !self.nodes[slot].declared_down => {
                            // The runtime stops its shards and rejoins as a new incarnation.
                            self.nodes[slot].declared_down = true;
                            self.downed += 1;
                            let at = now + self.rng.range(100, 500);
                            self.schedule(at, Ev::Restart { slot, rejoin: true });
                        }
                        _ => {}
                    }
                    self.log(|| format!("n{slot}: {e:?}"));
                }
            }
        }
        if let Some(at) = self.nodes[slot].engine.poll_timeout() {
            let at = at.max(now + 1);
            if self.nodes[slot].timer_at.is_none_or(|t| t > at || t <= now) {
                self.nodes[slot].timer_at = Some(at);
                let inc = self.inc(slot);
                self.schedule(at, Ev::Timer { slot, inc });
            }
        }
    }

    /// A connection from `slot` to `member`'s address: refused where nothing listens (crashed,
    /// not restarted yet) and the host is reachable; the handshake of whichever incarnation
    /// listens there; nothing (after the 2 s connect timeout) across a partition or a cut in
    /// either direction, or from a paused process (its kernel accepts, it never answers).
    fn check_address(&mut self, slot: usize, member: GossipId) {
        let Some(dest) = self.slot_of(&member.addr) else { return };
        let reachable = self.side[slot] == self.side[dest]
            && !self.cut.contains_key(&(slot, dest))
            && !self.cut.contains_key(&(dest, slot));
        let rtt = 2 * self.rng.range(1, self.p.latency_ms + 1);
        let (answer, after) = if !reachable {
            (AddressAnswer::Silent, 2_000)
        } else if !self.nodes[dest].alive {
            (AddressAnswer::Refused, rtt)
        } else if self.now < self.nodes[dest].paused_until {
            (AddressAnswer::Silent, 2_000)
        } else {
            match self.nodes[dest].id.node.clone() {
                Some(node) => (AddressAnswer::Node(node), rtt),
                None => return,
            }
        };
        let inc = self.inc(slot);
        let at = self.now + after;
        self.schedule(at, Ev::Answer { slot, inc, member, answer });
    }

    /// G3, after every step, with the split-brain resolver: when a leader shows a member down
    /// (its shards would be taken over), that member has stopped: crashed, declared itself down,
    /// or may not host now ([`GossipEngine::hosting_until`], which its runtime checks before
    /// every message, so that a paused member is stopped by the clock, not by its engine). A
    /// member is left out only if no leader ever showed it `Up` and reachable (it never joined far
    /// enough to be given a shard: a restart whose answers are cut, say, is downed by the others
    /// before it hears of them), and the first seed restarted before any term was taken or
    /// rejoining after it was downed, with the members that joined it (see `island`). Without a resolver, gossip promises no such thing: a member is
    /// down once suspicion runs out, and a live member whose suspicion never reached it (foca
    /// spread it to crashed members only) runs on until it hears it was downed (the README's
    /// table: "taken over when suspected").
    fn check_downed(&mut self) {
        if !self.p.resolver {
            return;
        }
        let now = self.now;
        let mut found = Vec::new();
        for leader in self.nodes.iter().filter(|n| n.alive && !n.declared_down) {
            let Some(view) = &leader.view else { continue };
            if view.leader.as_ref().map(|(l, _)| l) != leader.id.node.as_ref() {
                continue;
            }
            for m in view.view.members().filter(|m| m.status == MemberStatus::Down && self.hosts.contains(&m.node)) {
                let running = self.nodes.iter().any(|n| {
                    n.id.node.as_ref() == Some(&m.node)
                        && n.alive
                        && !n.declared_down
                        && n.engine.hosting_until().is_none_or(|until| now < until)
                        && !n.island
                });
                if running {
                    let l = leader.id.node.as_ref().map(ToString::to_string).unwrap_or_default();
                    found.push(format!("t={now} G3: {} is down in the view of the leader {l} but still up", m.node));
                }
            }
        }
        self.violations.extend(found);
    }

    /// The members of a cluster a first seed started beside the one that ran on (see `island`).
    fn island(&self) -> BTreeSet<NodeId> {
        self.nodes.iter().filter(|n| n.alive && n.island).filter_map(|n| n.id.node.clone()).collect()
    }

    /// G1: one leader per term.
    fn claim(&mut self, term: u64, node: NodeId) {
        match self.terms.get(&term) {
            Some(other) if *other != node => {
                self.violations.push(format!("t={} G1: term {term} led by {other} and {node}", self.now));
            }
            Some(_) => {}
            None => {
                self.terms.insert(term, node);
            }
        }
    }

    fn usable(&self, slot: usize, inc: u64) -> bool {
        self.nodes[slot].alive && self.inc(slot) == inc
    }

    fn step(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Timer { slot, inc } => {
                if !self.usable(slot, inc) {
                    return;
                }
                if self.nodes[slot].timer_at == Some(now) {
                    self.nodes[slot].timer_at = None;
                }
                if now >= self.nodes[slot].paused_until {
                    self.nodes[slot].engine.handle_timeout(now);
                    self.after_input(slot);
                }
            }
            Ev::Deliver { to, data } => {
                if !self.nodes[to].alive {
                    return;
                }
                if now < self.nodes[to].paused_until {
                    self.nodes[to].deferred.push(data);
                    return;
                }
                self.nodes[to].engine.handle_data(now, &data);
                self.after_input(to);
            }
            Ev::Answer { slot, inc, member, answer } => {
                if !self.usable(slot, inc) || now < self.nodes[slot].paused_until {
                    return;
                }
                self.nodes[slot].engine.handle_address(now, &member, answer);
                self.after_input(slot);
            }
            Ev::Unpause { slot, inc } => {
                // A second pause that ends later wakes it then.
                if !self.usable(slot, inc) || now < self.nodes[slot].paused_until {
                    return;
                }
                for data in std::mem::take(&mut self.nodes[slot].deferred) {
                    self.nodes[slot].engine.handle_data(now, &data);
                }
                self.nodes[slot].engine.handle_timeout(now);
                self.after_input(slot);
            }
            Ev::Heal { partition } => {
                if self.partition == partition {
                    self.log(|| "heal partition".into());
                    self.side = vec![0; self.p.nodes];
                }
            }
            Ev::HealLink { from, to } => {
                if self.cut.get(&(from, to)).is_some_and(|until| *until <= now) {
                    self.log(|| format!("heal n{from} → n{to}"));
                    self.cut.remove(&(from, to));
                }
            }
            Ev::Restart { slot, rejoin } => {
                let n = self.fresh(slot, rejoin);
                self.nodes[slot] = n;
                self.after_input(slot);
            }
            Ev::Fault => self.fault(),
        }
    }

    fn fault(&mut self) {
        let now = self.now;
        let n = self.p.nodes;
        let slot = self.rng.range(0, n as u64) as usize;
        let inc = self.inc(slot);
        let kind = self.rng.range(0, 5);
        let kind = if !self.splits && (1..=3).contains(&kind) { 4 - (kind % 2) * 4 } else { kind };
        match kind {
            0 => {
                self.log(|| format!("fault: crash n{slot}"));
                self.nodes[slot].alive = false;
                let at = now + self.rng.range(1_000, 8_000);
                self.schedule(at, Ev::Restart { slot, rejoin: false });
            }
            // A long partition runs the whole race and keeps its shape: the resolver, as Akka's,
            // assumes the sides do not regroup faster than a member can notice (a member that
            // decides before it has seen a side-mate leave keeps a side it is no longer on).
            1 if now < self.long_until => {}
            1 => {
                self.partition += 1;
                let partition = self.partition;
                let whole = self.side.iter().all(|s| *s == self.side[0]);
                for s in 0..n {
                    self.side[s] = self.rng.range(0, 2);
                }
                // Short ones (which may replace each other) heal before anyone decides; long
                // ones (the real test cuts for 25 s) run the whole race: both sides decide, the
                // surviving one takes over.
                let long = whole && self.rng.chance(0.5);
                let until = now + if long { self.rng.range(8_000, 30_000) } else { self.rng.range(500, 8_000) };
                if long {
                    self.long_until = until;
                }
                self.log(|| format!("fault: partition {:?} until {until}", self.side));
                self.calm_at = self.calm_at.max(until);
                self.schedule(until, Ev::Heal { partition });
            }
            // One-way cuts: one link, everything a member sends, or everything it receives; half
            // of them short, half long enough for the resolver to decide.
            2 => {
                let until =
                    now + if self.rng.chance(0.5) { self.rng.range(500, 8_000) } else { self.rng.range(8_000, 30_000) };
                let links: Vec<(usize, usize)> = match self.rng.range(0, 3) {
                    0 => {
                        let other = self.rng.range(0, n as u64) as usize;
                        vec![(slot, other)]
                    }
                    1 => (0..n).map(|o| (slot, o)).collect(),
                    _ => (0..n).map(|o| (o, slot)).collect(),
                };
                let links: Vec<(usize, usize)> = links.into_iter().filter(|(a, b)| a != b).collect();
                if !links.is_empty() {
                    self.log(|| format!("fault: one-way cut {links:?} until {until}"));
                    self.calm_at = self.calm_at.max(until);
                }
                for (from, to) in links {
                    let at = self.cut.entry((from, to)).or_insert(until);
                    *at = (*at).max(until);
                    self.schedule(until, Ev::HealLink { from, to });
                }
            }
            // Pauses: half of them short, half long enough for the others to down the member
            // and take its shards over while it sleeps (a `SIGSTOP`, a suspended VM).
            3 => {
                let until =
                    now + if self.rng.chance(0.5) { self.rng.range(100, 6_000) } else { self.rng.range(8_000, 30_000) };
                self.log(|| format!("fault: n{slot} paused until {until}"));
                self.calm_at = self.calm_at.max(until);
                self.nodes[slot].paused_until = self.nodes[slot].paused_until.max(until);
                self.schedule(until, Ev::Unpause { slot, inc });
            }
            _ => {
                self.log(|| format!("fault: n{slot} leaves and comes back"));
                self.nodes[slot].engine.handle_leave(now);
                self.after_input(slot);
                let at = now + self.rng.range(200, 1_000);
                self.schedule(at, Ev::Restart { slot, rejoin: false });
            }
        }
    }

    /// After the faults: every live member sees every other live member `Up` and reachable, and
    /// all name the same leader.
    fn check_settled(&mut self) {
        let live: BTreeSet<NodeId> =
            self.nodes.iter().filter(|n| n.alive && !n.declared_down).filter_map(|n| n.id.node.clone()).collect();
        let mut leaders = BTreeSet::new();
        for n in self.nodes.iter().filter(|n| n.alive && !n.declared_down) {
            let Some(view) = &n.view else {
                self.violations.push(format!("G2: {:?} published no view", n.id.node));
                continue;
            };
            let up: BTreeSet<NodeId> = view
                .view
                .members()
                .filter(|m| m.status == MemberStatus::Up && view.view.is_reachable(&m.node))
                .map(|m| m.node.clone())
                .collect();
            if up != live {
                self.violations.push(format!("G2: {:?} sees {up:?} up, live are {live:?}", n.id.node));
            }
            leaders.insert(view.leader.clone().map(|(l, _)| l));
        }
        if leaders.len() != 1 || leaders.iter().next().is_some_and(|l| l.is_none()) {
            self.violations.push(format!("G2: leaders {leaders:?}"));
        }
    }

    pub fn run(mut self) -> (Vec<String>, World) {
        while let Some((at, ev)) = self.queue.pop() {
            // Settling is checked 20 s after the faults end (their last heal included).
            if at > self.p.active_ms.max(self.calm_at) + 20_000 {
                break;
            }
            self.now = at;
            self.steps += 1;
            format!("{at}{ev:?}").hash(&mut self.trace);
            if self.verbose {
                self.log(|| format!("{ev:?}").chars().take(200).collect());
            }
            self.step(ev);
            self.check_downed();
            if !self.violations.is_empty() {
                break;
            }
        }
        if self.violations.is_empty() {
            self.now = self.p.active_ms.max(self.calm_at) + 20_000;
            self.check_settled();
        }
        (std::mem::take(&mut self.violations), self)
    }
}
