//! One schedule: lease engines over the simulated store, with latency, outages, lost answers, a
//! store reachable from some nodes only, pauses, crashes, restarts and leaves; with keep-alives
//! between nodes (half the schedules), partitions between them and one-way cuts too.

use shardline_core::Engine;
use std::collections::BTreeMap;
use std::hash::Hash;

use shardline_core::lease::{
    LeaseCommand, LeaseConfig, LeaseEngine, LeaseEvent, LeaseKeys, LeaseView, MemberRecord, StoreAnswer, StoreOp,
    StoreValue,
};
use shardline_core::{MemberStatus, NodeId};

use super::queue::Queue;
use super::rng::Rng;
use super::store::Store;

mod params;
pub use params::Params;

#[derive(Debug)]
enum Ev {
    Timer {
        slot: usize,
        inc: u64,
    },
    Arrive {
        slot: usize,
        inc: u64,
        id: u64,
        op: StoreOp,
    },
    Answer {
        slot: usize,
        inc: u64,
        id: u64,
        answer: StoreAnswer,
    },
    Fault,
    Unpause {
        slot: usize,
        inc: u64,
    },
    Exit {
        slot: usize,
        inc: u64,
    },
    Restart {
        slot: usize,
    },
    /// A keep-alive (a ping, or its answer) on its way.
    KeepAlive {
        from: NodeId,
        to: NodeId,
        ping: bool,
    },
    /// The end of a partition that had time to resolve: L4.
    Resolved,
}

struct SimNode {
    id: NodeId,
    engine: LeaseEngine,
    alive: bool,
    hosting_until: u64,
    paused_until: u64,
    deferred: Vec<(u64, StoreAnswer)>,
    view: Option<LeaseView>,
    /// Restarting after fencing itself.
    restarting: bool,
    /// When its timer is set for.
    timer_at: Option<u64>,
}

pub struct World {
    p: Params,
    rng: Rng,
    now: u64,
    queue: Queue<Ev>,
    nodes: Vec<SimNode>,
    next_inc: u64,
    store: Store,
    store_down_until: u64,
    cut_until: Vec<u64>,
    /// Partitions between nodes: the group of each slot, until when (one at a time).
    partition: Option<(Vec<usize>, u64)>,
    /// One-way cuts: (from, to) until when.
    one_way: Vec<(usize, usize, u64)>,
    /// When the partition of `partitions_only` schedules began.
    partition_since: u64,
    /// The last moment no member key lived in the store: a cluster starts again from there, and
    /// on each side of a partition, new incarnations may each start one (see `check_resolved`).
    last_keyless: u64,
    /// Every (term, leader) any node ever published or claimed.
    terms: BTreeMap<u64, NodeId>,
    pub violations: Vec<String>,
    pub trace: std::collections::hash_map::DefaultHasher,
    pub steps: u64,
    pub fenced: u64,
    /// Partition ends where L4 was checked, and those of them where the split was dated from a
    /// moment without member keys rather than from the partition's start.
    pub l4_checked: u64,
    pub l4_after_keyless: u64,
    /// Partition ends where both sides hosted, but the split began at a moment without member
    /// keys too recent for it to be resolved: L4 was not checked.
    pub l4_late_splits: u64,
    pub verbose: bool,
}

impl World {
    pub fn new(p: Params) -> Self {
        let mut w = World {
            rng: Rng::new(p.seed),
            now: 0,
            queue: Queue::new(),
            nodes: Vec::new(),
            next_inc: 0,
            store: Store::default(),
            store_down_until: 0,
            cut_until: vec![0; p.nodes],
            partition: None,
            one_way: Vec::new(),
            partition_since: 0,
            last_keyless: 0,
            terms: BTreeMap::new(),
            violations: Vec::new(),
            trace: Default::default(),
            steps: 0,
            fenced: 0,
            l4_checked: 0,
            l4_after_keyless: 0,
            l4_late_splits: 0,
            verbose: false,
            p,
        };
        for slot in 0..w.p.nodes {
            let node = w.fresh(slot);
            w.nodes.push(node);
            w.after_input(slot);
        }
        for _ in 0..w.p.faults {
            let at = w.rng.range(100, w.p.active_ms);
            w.schedule(at, Ev::Fault);
        }
        w
    }

    fn config(&self) -> LeaseConfig {
        let mut c = LeaseConfig {
            ttl_ms: self.p.ttl_ms,
            safety_margin_ms: self.p.margin_ms,
            split_brain: self.p.peer_checks.clone(),
            ..LeaseConfig::default()
        };
        if let Some(c) = c.split_brain.as_mut().filter(|_| self.p.never_resolve) {
            c.stable_after_ms = u64::MAX / 4;
        }
        c.fault_lease_from_answer = self.p.broken_lease_start;
        c
    }

    fn fresh(&mut self, slot: usize) -> SimNode {
        self.next_inc += 1;
        let id = NodeId::new(format!("n{slot}"), self.next_inc);
        let me = MemberRecord::up(id.clone(), format!("10.0.0.{slot}:7000"), "1");
        let keys = LeaseKeys::new("sim", &format!("n{slot}"));
        let engine = match LeaseEngine::new(self.config(), keys, me, self.now) {
            Ok(e) => e,
            Err(e) => panic!("the schedule's settings are valid: {e}"),
        };
        self.log(|| format!("start {id}"));
        SimNode {
            id,
            engine,
            alive: true,
            hosting_until: 0,
            paused_until: 0,
            deferred: Vec::new(),
            view: None,
            restarting: false,
            timer_at: None,
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
        self.nodes[slot].id.incarnation
    }

    /// Carries out the commands of `slot`'s engine and sets its timer.
    fn after_input(&mut self, slot: usize) {
        let now = self.now;
        let inc = self.inc(slot);
        let commands: Vec<LeaseCommand> = self.nodes[slot].engine.drain_commands().collect();
        for c in commands {
            match c {
                LeaseCommand::Store { id, op } => {
                    let at = now + self.rng.range(0, self.p.latency_ms);
                    self.schedule(at, Ev::Arrive { slot, inc, id, op });
                }
                LeaseCommand::ExtendHosting { until } => self.nodes[slot].hosting_until = until,
                LeaseCommand::RevokeHosting => {
                    self.nodes[slot].hosting_until = 0;
                    let n = &mut self.nodes[slot];
                    if !n.restarting && !n.engine.me().status.eq(&MemberStatus::Removed) {
                        // The runtime rejoins as a new incarnation.
                        n.restarting = true;
                        self.fenced += 1;
                        let at = now + self.rng.range(100, 500);
                        self.schedule(at, Ev::Restart { slot });
                    }
                }
                LeaseCommand::Publish(view) => {
                    if let Some((l, term)) = &view.leader {
                        self.claim(*term, l.clone());
                    }
                    self.nodes[slot].view = Some(view);
                }
                LeaseCommand::KeepAlive { to } => {
                    let from = self.nodes[slot].id.clone();
                    for (node, _) in to {
                        self.send_keepalive(from.clone(), node, true);
                    }
                }
                LeaseCommand::Log(e) => {
                    if let LeaseEvent::Leads { term } = e {
                        let me = self.nodes[slot].id.clone();
                        self.claim(term, me);
                    }
                    self.log(|| format!("n{slot}#{inc}: {e:?}"));
                }
            }
        }
        if let Some(at) = self.nodes[slot].engine.poll_timeout() {
            let at = at.max(now + 1);
            if self.nodes[slot].timer_at.is_none_or(|t| t > at || t <= now) {
                self.nodes[slot].timer_at = Some(at);
                self.schedule(at, Ev::Timer { slot, inc });
            }
        }
    }

    /// L1: one leader per term.
    fn claim(&mut self, term: u64, node: NodeId) {
        match self.terms.get(&term) {
            Some(other) if *other != node => {
                self.violations.push(format!("t={} L1: term {term} led by {other} and {node}", self.now));
            }
            Some(_) => {}
            None => {
                self.terms.insert(term, node);
            }
        }
    }

    fn slot_of(node: &NodeId) -> usize {
        node.name.trim_start_matches('n').parse().unwrap_or(usize::MAX)
    }

    /// Whether traffic from `from` reaches `to` now.
    fn link_up(&self, from: usize, to: usize) -> bool {
        let now = self.now;
        let split = self.partition.as_ref().is_some_and(|(groups, until)| now < *until && groups[from] != groups[to]);
        let cut = self.one_way.iter().any(|&(f, t, until)| f == from && t == to && now < until);
        !split && !cut
    }

    fn send_keepalive(&mut self, from: NodeId, to: NodeId, ping: bool) {
        let (f, t) = (Self::slot_of(&from), Self::slot_of(&to));
        if t >= self.nodes.len() || !self.link_up(f, t) || (self.now < self.p.active_ms && self.rng.chance(0.02)) {
            return;
        }
        let at = self.now + self.rng.range(0, self.p.latency_ms);
        self.schedule(at, Ev::KeepAlive { from, to, ping });
    }

    fn usable(&self, slot: usize, inc: u64) -> bool {
        let n = &self.nodes[slot];
        n.alive && n.id.incarnation == inc
    }

    fn step(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Timer { slot, inc } => {
                if self.usable(slot, inc) && self.nodes[slot].timer_at == Some(now) {
                    self.nodes[slot].timer_at = None;
                }
                if self.usable(slot, inc) && now >= self.nodes[slot].paused_until {
                    self.nodes[slot].engine.handle_timeout(now);
                    self.after_input(slot);
                }
            }
            Ev::Arrive { slot, inc, id, op } => {
                if now < self.store_down_until || now < self.cut_until[slot] {
                    // The client notices, or the call hangs until the engine gives up on it.
                    if self.rng.chance(0.5) {
                        let at = now + self.rng.range(1, 200);
                        self.schedule(
                            at,
                            Ev::Answer { slot, inc, id, answer: StoreAnswer::Failed("unreachable".into()) },
                        );
                    }
                    return;
                }
                let answer = self.store.apply(now, &op);
                // Faults, lost answers included, stop with the active period.
                if now < self.p.active_ms && self.rng.chance(self.p.lost_answers) {
                    return;
                }
                let at = now + self.rng.range(0, self.p.latency_ms);
                self.schedule(at, Ev::Answer { slot, inc, id, answer });
            }
            Ev::Answer { slot, inc, id, answer } => {
                if !self.usable(slot, inc) || now < self.cut_until[slot] {
                    return;
                }
                if now < self.nodes[slot].paused_until {
                    self.nodes[slot].deferred.push((id, answer));
                    return;
                }
                self.nodes[slot].engine.handle_answer(now, id, answer);
                self.after_input(slot);
            }
            Ev::Unpause { slot, inc } => {
                if !self.usable(slot, inc) {
                    return;
                }
                let deferred = std::mem::take(&mut self.nodes[slot].deferred);
                for (id, answer) in deferred {
                    self.nodes[slot].engine.handle_answer(now, id, answer);
                }
                self.nodes[slot].engine.handle_timeout(now);
                self.after_input(slot);
            }
            Ev::Exit { slot, inc } => {
                if self.usable(slot, inc) {
                    // The runtime stopped every shard before it exits.
                    self.nodes[slot].hosting_until = 0;
                    self.nodes[slot].engine.handle_exit(now);
                    self.after_input(slot);
                    let at = now + self.rng.range(self.p.ttl_ms, 3 * self.p.ttl_ms);
                    self.schedule(at, Ev::Restart { slot });
                }
            }
            Ev::Restart { slot } => {
                let node = self.fresh(slot);
                self.nodes[slot] = node;
                self.after_input(slot);
            }
            Ev::KeepAlive { from, to, ping } => {
                let slot = Self::slot_of(&to);
                if !self.usable(slot, to.incarnation) || now < self.nodes[slot].paused_until {
                    return;
                }
                self.nodes[slot].engine.handle_heard(now, &from);
                self.after_input(slot);
                if ping {
                    self.send_keepalive(to, from, false);
                }
            }
            Ev::Resolved => self.check_resolved(),
            Ev::Fault if self.p.partitions_only => self.partition(),
            Ev::Fault => self.fault(),
        }
    }

    /// A symmetric partition into two or three groups, long enough to be resolved.
    fn partition(&mut self) {
        let now = self.now;
        if self.partition.as_ref().is_some_and(|(_, until)| now < *until) {
            return;
        }
        let groups: Vec<usize> = (0..self.p.nodes).map(|_| self.rng.range(0, 3) as usize).collect();
        let until = now + self.p.resolve_within() + self.rng.range(0, self.p.ttl_ms);
        self.log(|| format!("fault: partition {groups:?} until {until}"));
        self.partition = Some((groups, until));
        self.partition_since = now;
        self.schedule(until - 1, Ev::Resolved);
    }

    /// L4: at the end of a partition that had time to resolve, the nodes that may host reach
    /// each other (the split-brain race left one side).
    ///
    /// A split begins when the partition does, or later, at the last moment the store held no
    /// member key: then (the winning side lost its leases to the store's faults, which go on
    /// during partitions) the cluster has to start again from nothing, and a new incarnation on
    /// each side may join with nobody to reach, as the first members of a cluster do. That split
    /// is resolved in its turn, in as long as any. A new incarnation that joins while another
    /// member's key lives must reach it first, so a join across the cut while the winners hold
    /// keys still counts from the partition's start.
    fn check_resolved(&mut self) {
        let now = self.now;
        let hosting: Vec<usize> = (0..self.nodes.len())
            .filter(|&s| self.nodes[s].alive && self.nodes[s].hosting_until > now && now >= self.nodes[s].paused_until)
            .collect();
        let mut across = Vec::new();
        for &a in &hosting {
            for &b in &hosting {
                if a < b && !self.link_up(a, b) {
                    across.push((self.nodes[a].id.clone(), self.nodes[b].id.clone()));
                }
            }
        }
        let since = self.partition_since.max(self.last_keyless);
        if now + 1 < since + self.p.resolve_within() {
            if !across.is_empty() {
                self.log(|| format!("L4 not checked: no member key at {since}, a split since then: {across:?}"));
                self.l4_late_splits += 1;
            }
            return;
        }
        self.l4_checked += 1;
        if since > self.partition_since {
            self.l4_after_keyless += 1;
        }
        for (x, y) in across {
            self.violations.push(format!("t={now} L4: {x} and {y} both host across the partition"));
        }
    }

    fn fault(&mut self) {
        let now = self.now;
        let slot = self.rng.range(0, self.p.nodes as u64) as usize;
        let inc = self.inc(slot);
        let ttl = self.p.ttl_ms;
        let kinds = if self.p.peer_checks.is_some() { 8 } else { 6 };
        match self.rng.range(0, kinds) {
            0 => {
                let until = now + self.rng.range(100, 2 * ttl);
                self.log(|| format!("fault: store down until {until}"));
                self.store_down_until = self.store_down_until.max(until);
            }
            1 => {
                let until = now + self.rng.range(100, 2 * ttl);
                self.log(|| format!("fault: n{slot} cut from the store until {until}"));
                self.cut_until[slot] = self.cut_until[slot].max(until);
            }
            2 => {
                let until = now + self.rng.range(50, 2 * ttl);
                self.log(|| format!("fault: n{slot} paused until {until}"));
                self.nodes[slot].paused_until = until;
                self.schedule(until, Ev::Unpause { slot, inc });
            }
            3 => {
                self.log(|| format!("fault: crash n{slot}"));
                self.nodes[slot].alive = false;
                let at = now + self.rng.range(ttl / 2, 2 * ttl);
                self.schedule(at, Ev::Restart { slot });
            }
            4 => {
                self.log(|| format!("fault: n{slot} leaves"));
                self.nodes[slot].engine.handle_leave(now);
                self.after_input(slot);
                let at = now + self.rng.range(50, ttl);
                self.schedule(at, Ev::Exit { slot, inc });
            }
            6 => {
                let until = now + self.rng.range(100, 3 * ttl);
                let groups: Vec<usize> = (0..self.p.nodes).map(|_| self.rng.range(0, 2) as usize).collect();
                self.log(|| format!("fault: partition {groups:?} until {until}"));
                self.partition = Some((groups, until));
            }
            7 => {
                let to = self.rng.range(0, self.p.nodes as u64) as usize;
                let until = now + self.rng.range(100, 3 * ttl);
                self.log(|| format!("fault: n{slot} cannot send to n{to} until {until}"));
                self.one_way.push((slot, to, until));
            }
            _ => {
                let until = now + self.rng.range(10, 300);
                self.log(|| format!("fault: the store is slow until {until}"));
                // Slow: every answer in flight is late (modelled as a short outage of answers).
                self.store_down_until = self.store_down_until.max(until);
            }
        }
    }

    /// L2: a node that may host holds a live member key in the store. L3: a member some view
    /// declares down may not host.
    fn check(&mut self) {
        let now = self.now;
        for n in self.nodes.iter().filter(|n| n.alive && n.hosting_until > now) {
            let key = format!("sim/members/{}", n.id.name);
            let holds = self.store.keys.get(&key).is_some_and(|s| {
                s.expires.is_some_and(|e| e > now) && matches!(&s.value, StoreValue::Member(r) if r.node == n.id)
            });
            if !holds {
                self.violations
                    .push(format!("t={now} L2: {} may host until {} without a live lease", n.id, n.hosting_until));
            }
        }
        for observer in self.nodes.iter().filter(|n| n.alive) {
            let Some(view) = &observer.view else { continue };
            for m in view.view.members().filter(|m| m.status == MemberStatus::Down) {
                if let Some(x) = self.nodes.iter().find(|x| x.alive && x.id == m.node && x.hosting_until > now) {
                    self.violations
                        .push(format!("t={now} L3: {} declares {} down while it may host", observer.id, x.id));
                }
            }
        }
    }

    /// After a quiet period: every node is up and hosting, and all agree on one live leader.
    fn check_settled(&mut self) {
        let now = self.now;
        let mut leaders = std::collections::BTreeSet::new();
        for n in self.nodes.iter().filter(|n| n.alive) {
            if n.hosting_until <= now {
                self.violations.push(format!("settled: {} does not host", n.id));
            }
            leaders.insert(n.view.as_ref().and_then(|v| v.leader.clone()).map(|(l, _)| l));
        }
        if leaders.len() != 1 || leaders.iter().next().is_some_and(|l| l.is_none()) {
            self.violations.push(format!("settled: leaders {leaders:?}"));
        }
    }

    pub fn run(mut self) -> (Vec<String>, World) {
        let end = self.p.active_ms + self.p.resolve_within() + 8 * self.p.ttl_ms;
        while let Some((at, ev)) = self.queue.pop() {
            if at > end {
                break;
            }
            self.now = at;
            self.steps += 1;
            format!("{at}{ev:?}").hash(&mut self.trace);
            if self.verbose {
                self.log(|| format!("{ev:?}"));
            }
            self.step(ev);
            self.check();
            let now = self.now;
            let keyed = self
                .store
                .keys
                .iter()
                .any(|(k, s)| k.starts_with("sim/members/") && s.expires.is_some_and(|e| e > now));
            if !keyed {
                self.last_keyless = now;
            }
            if !self.violations.is_empty() {
                break;
            }
        }
        if self.violations.is_empty() {
            self.now = end;
            self.check_settled();
        }
        (std::mem::take(&mut self.violations), self)
    }
}
