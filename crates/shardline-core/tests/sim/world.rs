//! The simulated cluster: nodes running a region (and, on the leader, the coordinator), a
//! network of per-pair FIFO links with random delays, a membership oracle standing in for a
//! lease store, entities with mailboxes, clients, and faults — all driven by one seeded rng.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::hash::Hash;

use shardline_core::{
    shard_of, AllocationStrategy, ConsistentHash, CoordinatorCommand, CoordinatorConfig, CoordinatorEngine, Epoch,
    LeastShards, Member, MemberStatus, MembershipView, NodeId, Ranges, RegionCommand, RegionConfig, RegionEngine,
    RegionMessage, ShardId, ShardMap, ToCoordinator, ToRegion, VersionAware,
};

use super::ledger::{Ledger, UserMsg};
use super::rng::Rng;

/// The shape of one schedule.
#[derive(Clone, Debug)]
pub struct Params {
    pub seed: u64,
    pub nodes: usize,
    pub shards: u32,
    pub entities: u32,
    pub clients: u32,
    pub active_ms: u64,
    pub quiet_ms: u64,
    pub faults: usize,
    pub drop_rate: f64,
    pub with_store: bool,
    pub strategy: usize,
    pub broken_hand_off: bool,
}

impl Params {
    pub fn random(seed: u64) -> Self {
        let mut r = Rng::new(seed ^ 0x5EED);
        Params {
            seed,
            nodes: r.range(2, 6) as usize,
            shards: r.range(4, 33) as u32,
            entities: r.range(10, 60) as u32,
            clients: r.range(1, 3) as u32,
            active_ms: r.range(1_000, 3_000),
            quiet_ms: 8_000,
            faults: r.range(0, 7) as usize,
            drop_rate: if r.chance(0.5) { 0.0 } else { 0.01 },
            with_store: r.chance(0.5),
            strategy: r.range(0, 4) as usize,
            broken_hand_off: false,
        }
    }
}

/// Timing of failure handling (virtual milliseconds).
const FENCE_AFTER: u64 = 300; // a cut-off node stops its shards (lease TTL − margin)
const DOWN_AFTER: u64 = 500; // the store declares it down (lease TTL)

#[derive(Clone, Debug)]
enum Wire {
    ToCoord(ToCoordinator),
    ToRegion(ToRegion),
    Region(RegionMessage<UserMsg>),
}

#[derive(Debug)]
enum Ev {
    Deliver { from: NodeId, to: NodeId, session: u64, wire: Wire },
    Undeliverable { node: NodeId, dest: NodeId, msg: RegionMessage<UserMsg> },
    LinkDown { node: NodeId, peer: NodeId },
    Timer { node: NodeId },
    Process { node: NodeId },
    ClientSend { node: NodeId, client: u32 },
    Fault,
    Fence { node: NodeId, isolation: u64 },
    Down { node: NodeId },
    Heal { name: String, isolation: u64 },
    HealCut { a: String, b: String },
    Restart { name: String },
    Join,
}

struct Entity {
    shard: ShardId,
    mailbox: VecDeque<(UserMsg, Epoch)>,
}

struct SimNode {
    id: NodeId,
    alive: bool,
    fenced: bool,
    leaving: bool,
    settling: bool,
    region: RegionEngine<UserMsg>,
    coordinator: Option<CoordinatorEngine>,
    entities: BTreeMap<u32, Entity>,
    stopping: BTreeSet<ShardId>,
    timer_at: Option<u64>,
    client_seq: HashMap<(u32, u32), u64>,
}

pub struct World {
    p: Params,
    rng: Rng,
    now: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: HashMap<u64, Ev>,
    next_ev: u64,
    nodes: BTreeMap<NodeId, SimNode>,
    current: BTreeMap<String, NodeId>,
    next_name: usize,
    // network
    sessions: HashMap<(String, String), u64>,
    last_at: HashMap<(NodeId, NodeId), u64>,
    isolated: BTreeMap<String, u64>,
    cuts: BTreeSet<(String, String)>,
    next_isolation: u64,
    // membership oracle
    view: MembershipView,
    up_counter: u64,
    term: u64,
    leader: Option<NodeId>,
    store: Option<ShardMap>,
    // checking
    live: HashMap<u32, NodeId>,
    entity_shard: Vec<ShardId>,
    pub ledger: Ledger,
    pub trace: std::collections::hash_map::DefaultHasher,
    pub steps: u64,
    pub verbose: bool,
}

fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

impl World {
    pub fn new(p: Params) -> Self {
        let entity_shard = (0..p.entities).map(|e| shard_of(&format!("e{e}"), p.shards)).collect();
        let store = if p.with_store { ShardMap::new(p.shards).ok() } else { None };
        let mut w = World {
            rng: Rng::new(p.seed),
            p,
            now: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            next_ev: 0,
            nodes: BTreeMap::new(),
            current: BTreeMap::new(),
            next_name: 0,
            sessions: HashMap::new(),
            last_at: HashMap::new(),
            isolated: BTreeMap::new(),
            cuts: BTreeSet::new(),
            next_isolation: 0,
            view: MembershipView::new(),
            up_counter: 0,
            term: 0,
            leader: None,
            store,
            live: HashMap::new(),
            entity_shard,
            ledger: Ledger::default(),
            trace: Default::default(),
            steps: 0,
            verbose: false,
        };
        for _ in 0..w.p.nodes {
            let name = w.fresh_name();
            w.start_node(&name);
        }
        for _ in 0..w.p.faults {
            let at = w.rng.range(100, w.p.active_ms);
            w.schedule(at, Ev::Fault);
        }
        w
    }

    fn strategy(&self) -> Box<dyn AllocationStrategy> {
        match self.p.strategy {
            0 => Box::new(LeastShards { absolute_limit: 3, relative_limit: 0.2 }),
            1 => Box::new(VersionAware),
            2 => Box::new(ConsistentHash { vnodes_per_weight: 20 }),
            _ => Box::new(Ranges),
        }
    }

    fn fresh_name(&mut self) -> String {
        self.next_name += 1;
        format!("n{}", self.next_name)
    }

    fn schedule(&mut self, at: u64, ev: Ev) {
        let id = self.next_ev;
        self.next_ev += 1;
        self.queue.push(Reverse((at.max(self.now), id)));
        self.events.insert(id, ev);
    }

    fn log(&self, what: impl FnOnce() -> String) {
        if self.verbose {
            eprintln!("[{:>6}] {}", self.now, what());
        }
    }

    // ---------------------------------------------------------------- lifecycle

    fn start_node(&mut self, name: &str) {
        let incarnation = self.now + 1 + self.nodes.keys().filter(|n| &*n.name == name).count() as u64;
        let id = NodeId::new(name, incarnation);
        let mut rc = RegionConfig::new(self.p.shards);
        rc.max_buffered = 10_000;
        rc.retry_initial_ms = 10;
        rc.retry_max_ms = 400;
        rc.register_retry_ms = 200;
        let node = SimNode {
            id: id.clone(),
            alive: true,
            fenced: false,
            leaving: false,
            settling: false,
            region: RegionEngine::new(rc, id.clone()),
            coordinator: None,
            entities: BTreeMap::new(),
            stopping: BTreeSet::new(),
            timer_at: None,
            client_seq: HashMap::new(),
        };
        self.log(|| format!("start {id}"));
        self.nodes.insert(id.clone(), node);
        self.current.insert(name.to_string(), id.clone());
        self.up_counter += 1;
        let version = if self.p.strategy == 1 { format!("1.{}", self.up_counter / 3) } else { "1".into() };
        let m = Member::new(id.clone(), self.up_counter).with_status(MemberStatus::Up).with_version(version);
        let _ = self.view.add(m);
        for c in 0..self.p.clients {
            let at = self.now + self.rng.range(1, 20);
            self.schedule(at, Ev::ClientSend { node: id.clone(), client: c });
        }
        if let Some(l) = self.leader.clone() {
            // The provider tells a new node who leads.
            let (now, term) = (self.now, self.term);
            if let Some(n) = self.nodes.get_mut(&id) {
                n.region.handle_coordinator_changed(now, l, term);
            }
            self.pump(&id);
        }
        self.membership_changed();
    }

    /// The lease store's view changed: elect, tell the coordinator and every region.
    fn membership_changed(&mut self) {
        let want = self.view.oldest_up().map(|m| m.node.clone());
        if want != self.leader {
            if let Some(old) = self.leader.take() {
                if let Some(n) = self.nodes.get_mut(&old) {
                    if let Some(c) = n.coordinator.as_mut() {
                        c.handle_leadership_lost(self.now);
                    }
                    n.coordinator = None;
                }
            }
            if let Some(l) = want.clone() {
                self.term += 1;
                let _ = self.view.set_leader(Some(l.clone()));
                let mut cc = CoordinatorConfig::new(self.p.shards);
                cc.hand_off_timeout_ms = 1_000;
                cc.resend_interval_ms = 200;
                cc.rebalance_interval_ms = 1_000;
                #[cfg(feature = "fault-injection")]
                {
                    cc.fault_skip_wait_for_shard_stopped = self.p.broken_hand_off;
                }
                let strategy = self.strategy();
                let c = CoordinatorEngine::new(
                    cc,
                    l.clone(),
                    self.term,
                    strategy,
                    self.view.clone(),
                    self.store.clone(),
                    self.now,
                );
                if let (Ok(c), Some(n)) = (c, self.nodes.get_mut(&l)) {
                    n.coordinator = Some(c);
                }
                self.leader = Some(l.clone());
                self.log(|| format!("leader {l} term {}", self.term));
                let ids: Vec<NodeId> = self.alive_ids();
                for id in ids {
                    let now = self.now;
                    if let Some(n) = self.nodes.get_mut(&id) {
                        n.region.handle_coordinator_changed(now, l.clone(), self.term);
                    }
                    self.pump(&id);
                }
            }
        } else if let Some(l) = self.leader.clone() {
            let (now, view) = (self.now, self.view.clone());
            if let Some(c) = self.nodes.get_mut(&l).and_then(|n| n.coordinator.as_mut()) {
                c.handle_membership(now, &view);
            }
            self.pump(&l);
        }
    }

    fn alive_ids(&self) -> Vec<NodeId> {
        self.nodes.values().filter(|n| n.alive && !n.fenced).map(|n| n.id.clone()).collect()
    }

    /// The process dies: everything in it is gone (excused), its connections reset.
    fn kill(&mut self, id: &NodeId, graceful: bool) {
        let now = self.now;
        let Some(n) = self.nodes.get_mut(id) else { return };
        if !n.alive {
            return;
        }
        n.alive = false;
        n.coordinator = None;
        let mut lost: Vec<UserMsg> = n.region.take_buffered().into_iter().map(|(_, m)| m).collect();
        for (_, e) in std::mem::take(&mut n.entities) {
            lost.extend(e.mailbox.into_iter().map(|(m, _)| m));
        }
        for m in &lost {
            self.ledger.excuse(m, now);
        }
        self.live.retain(|_, node| node != id);
        self.log(|| format!("kill {id} graceful={graceful}"));
        if !graceful {
            let peers: Vec<NodeId> = self.alive_ids();
            for peer in peers {
                self.break_link(id, &peer);
            }
        }
    }

    fn break_link(&mut self, a: &NodeId, b: &NodeId) {
        *self.sessions.entry(pair(&a.name, &b.name)).or_insert(0) += 1;
        let d1 = self.now + self.rng.range(1, 40);
        let d2 = self.now + self.rng.range(1, 40);
        self.schedule(d1, Ev::LinkDown { node: a.clone(), peer: b.clone() });
        self.schedule(d2, Ev::LinkDown { node: b.clone(), peer: a.clone() });
    }

    fn link_ok(&self, a: &str, b: &str) -> bool {
        a == b || (!self.isolated.contains_key(a) && !self.isolated.contains_key(b) && !self.cuts.contains(&pair(a, b)))
    }

    fn is_alive(&self, id: &NodeId) -> bool {
        self.nodes.get(id).is_some_and(|n| n.alive)
    }

    // ---------------------------------------------------------------- network

    fn send(&mut self, from: &NodeId, to: &NodeId, wire: Wire) {
        if !self.is_alive(to) || !self.link_ok(&from.name, &to.name) {
            // No connection: the transport says so at once; region messages come back.
            match wire {
                Wire::Region(msg) => {
                    let at = self.now + 1;
                    self.schedule(at, Ev::Undeliverable { node: from.clone(), dest: to.clone(), msg });
                }
                Wire::ToCoord(_) | Wire::ToRegion(_) => {}
            }
            return;
        }
        if from != to && self.p.drop_rate > 0.0 && self.rng.chance(self.p.drop_rate) {
            self.excuse_wire(&wire);
            self.break_link(from, to);
            return;
        }
        let delay = if from == to { self.rng.range(0, 2) } else { self.rng.range(1, 16) };
        let key = (from.clone(), to.clone());
        let at = (self.now + delay).max(self.last_at.get(&key).copied().unwrap_or(0));
        self.last_at.insert(key, at);
        let session = self.sessions.get(&pair(&from.name, &to.name)).copied().unwrap_or(0);
        self.schedule(at, Ev::Deliver { from: from.clone(), to: to.clone(), session, wire });
    }

    fn excuse_wire(&mut self, wire: &Wire) {
        if let Wire::Region(RegionMessage::Forward { msg, .. } | RegionMessage::Bounce { msg, .. }) = wire {
            let now = self.now;
            self.ledger.excuse(msg, now);
        }
    }

    // ---------------------------------------------------------------- driving engines

    /// Carries out every pending command of a node, then re-arms its timer.
    fn pump(&mut self, id: &NodeId) {
        loop {
            let Some(n) = self.nodes.get_mut(id) else { return };
            if !n.alive {
                return;
            }
            let term = n.coordinator.as_ref().map(|c| c.term()).unwrap_or(0);
            let ccmds: Vec<CoordinatorCommand> =
                n.coordinator.as_mut().map(|c| c.drain_commands().collect()).unwrap_or_default();
            let rcmds: Vec<RegionCommand<UserMsg>> = n.region.drain_commands().collect();
            if ccmds.is_empty() && rcmds.is_empty() {
                break;
            }
            for c in ccmds {
                self.run_coordinator_command(id, term, c);
            }
            for c in rcmds {
                self.run_region_command(id, c);
            }
        }
        self.arm_timer(id);
    }

    fn arm_timer(&mut self, id: &NodeId) {
        let Some(n) = self.nodes.get(id) else { return };
        let next = [n.region.poll_timeout(), n.coordinator.as_ref().and_then(|c| c.poll_timeout())]
            .into_iter()
            .flatten()
            .min();
        if let Some(at) = next {
            if n.timer_at.is_none_or(|t| at < t || t < self.now) {
                self.nodes.get_mut(id).expect("node exists").timer_at = Some(at);
                self.schedule(at, Ev::Timer { node: id.clone() });
            }
        }
    }

    fn run_coordinator_command(&mut self, id: &NodeId, term: u64, c: CoordinatorCommand) {
        if let CoordinatorCommand::PersistShardMap { changes, .. } = &c {
            if let Some(store) = self.store.as_mut() {
                for (shard, slot) in changes {
                    let _ = store.raise_epoch(*shard, slot.epoch);
                    match slot.home() {
                        Some(h) => {
                            let _ = store.adopt(*shard, h);
                        }
                        None => {
                            let _ = store.unassign(*shard);
                        }
                    }
                }
            }
        }
        for (to, m) in c.messages(term) {
            self.send(id, &to, Wire::ToRegion(m));
        }
    }

    fn run_region_command(&mut self, id: &NodeId, c: RegionCommand<UserMsg>) {
        let now = self.now;
        match c {
            RegionCommand::Deliver { shard, epoch, msg } => {
                if let Some(owner) = self.live.get(&msg.entity) {
                    if owner != id {
                        self.ledger
                            .violations
                            .push(format!("t={now} I1: entity e{} live on {owner} and {id}", msg.entity));
                    }
                }
                self.live.insert(msg.entity, id.clone());
                let n = self.nodes.get_mut(id).expect("node exists");
                let e = n.entities.entry(msg.entity).or_insert_with(|| Entity { shard, mailbox: VecDeque::new() });
                e.mailbox.push_back((msg, epoch));
                let at = now + self.rng.range(0, 6);
                self.schedule(at, Ev::Process { node: id.clone() });
            }
            RegionCommand::SendToRegion { to, msg } => self.send(id, &to, Wire::Region(msg)),
            RegionCommand::SendToCoordinator { to, msg } => self.send(id, &to, Wire::ToCoord(msg)),
            RegionCommand::StartShard { shard, handover, .. } => {
                if handover.as_ref().is_some_and(|h| h[..] != shard.0.to_be_bytes()) {
                    self.ledger.violations.push(format!("t={now} handover of another shard reached {shard}"));
                }
            }
            RegionCommand::StopShard { shard, fenced, .. } => {
                let n = self.nodes.get_mut(id).expect("node exists");
                if fenced {
                    let dead: Vec<u32> = n.entities.iter().filter(|(_, e)| e.shard == shard).map(|(k, _)| *k).collect();
                    let mut lost = Vec::new();
                    for k in dead {
                        if let Some(e) = n.entities.remove(&k) {
                            lost.extend(e.mailbox.into_iter().map(|(m, _)| m));
                        }
                        self.live.remove(&k);
                    }
                    for m in &lost {
                        self.ledger.excuse(m, now);
                    }
                } else {
                    n.stopping.insert(shard);
                    let at = now + self.rng.range(0, 6);
                    self.schedule(at, Ev::Process { node: id.clone() });
                }
            }
            RegionCommand::Reject { msg, .. } => self.ledger.excuse(&msg, now),
        }
    }

    /// Entities process one message each; stopping shards whose mailboxes are empty stop.
    fn process(&mut self, id: &NodeId) {
        let now = self.now;
        let Some(n) = self.nodes.get_mut(id) else { return };
        if !n.alive {
            return;
        }
        let mut done = Vec::new();
        let mut again = false;
        for (&k, e) in n.entities.iter_mut() {
            if let Some((m, epoch)) = e.mailbox.pop_front() {
                done.push((k, e.shard, m, epoch));
                again |= !e.mailbox.is_empty();
            }
        }
        for (k, shard, m, epoch) in done {
            let n = &self.nodes[id];
            let hosts_at = n.region.hosted().into_iter().find(|(s, _)| *s == shard).map(|(_, e)| e);
            if hosts_at != Some(epoch) {
                self.ledger
                    .violations
                    .push(format!("t={now} I1: e{k} processed on {id} at epoch {epoch} while hosting {hosts_at:?}"));
            }
            self.ledger.processed(&m, id, now);
        }
        let n = self.nodes.get_mut(id).expect("node exists");
        let ready: Vec<ShardId> = n
            .stopping
            .iter()
            .copied()
            .filter(|s| n.entities.values().all(|e| e.shard != *s || e.mailbox.is_empty()))
            .collect();
        for shard in ready {
            n.stopping.remove(&shard);
            let gone: Vec<u32> = n.entities.iter().filter(|(_, e)| e.shard == shard).map(|(k, _)| *k).collect();
            for k in gone {
                n.entities.remove(&k);
                self.live.remove(&k);
            }
            // The shard's number stands for its entities' state: it must reach the next owner.
            n.region.handle_shard_stopped(now, shard, Some(shard.0.to_be_bytes().to_vec()));
        }
        if again {
            let at = now + self.rng.range(1, 6);
            self.schedule(at, Ev::Process { node: id.clone() });
        }
        self.pump(id);
    }

    // ---------------------------------------------------------------- faults

    fn fault(&mut self) {
        let candidates: Vec<NodeId> = self
            .nodes
            .values()
            .filter(|n| n.alive && !n.fenced && !n.leaving && !self.isolated.contains_key(&*n.id.name))
            .map(|n| n.id.clone())
            .collect();
        let kind = self.rng.range(0, 7);
        if candidates.len() < 2 && kind != 5 {
            return;
        }
        let Some(victim) = self.rng.pick(&candidates).cloned() else { return };
        let now = self.now;
        match kind {
            0 => {
                // crash, restart later
                self.log(|| format!("fault: crash {victim}"));
                self.kill(&victim, false);
                let down = now + DOWN_AFTER;
                self.schedule(down, Ev::Down { node: victim.clone() });
                let back = now + self.rng.range(DOWN_AFTER + 50, 1_500);
                self.schedule(back, Ev::Restart { name: victim.name.to_string() });
            }
            1 => {
                // cut off from everything, store included
                self.next_isolation += 1;
                let iso = self.next_isolation;
                let dur = self.rng.range(100, 1_500);
                self.log(|| format!("fault: isolate {victim} for {dur}"));
                self.isolated.insert(victim.name.to_string(), iso);
                for peer in self.alive_ids() {
                    if peer != victim {
                        self.break_link(&victim, &peer);
                    }
                }
                self.schedule(now + FENCE_AFTER, Ev::Fence { node: victim.clone(), isolation: iso });
                self.schedule(now + dur, Ev::Heal { name: victim.name.to_string(), isolation: iso });
            }
            2 => {
                // cut between two nodes only; leases fine
                let others: Vec<NodeId> = candidates.iter().filter(|n| **n != victim).cloned().collect();
                let Some(other) = self.rng.pick(&others).cloned() else { return };
                self.log(|| format!("fault: cut {victim} / {other}"));
                self.cuts.insert(pair(&victim.name, &other.name));
                self.break_link(&victim, &other);
                let dur = self.rng.range(50, 800);
                self.schedule(now + dur, Ev::HealCut { a: victim.name.to_string(), b: other.name.to_string() });
            }
            3 => {
                let others: Vec<NodeId> = candidates.iter().filter(|n| **n != victim).cloned().collect();
                if let Some(other) = self.rng.pick(&others).cloned() {
                    self.log(|| format!("fault: break link {victim} / {other}"));
                    self.break_link(&victim, &other);
                }
            }
            4 => {
                self.log(|| format!("fault: {victim} leaves"));
                if let Some(n) = self.nodes.get_mut(&victim) {
                    n.leaving = true;
                }
                let _ = self.view.set_status(&victim, MemberStatus::Leaving);
                self.membership_changed();
                if self.rng.chance(0.7) {
                    let at = now + self.rng.range(10, 500);
                    self.schedule(at, Ev::Join);
                }
            }
            _ => self.schedule(now, Ev::Join),
        }
    }

    fn fence(&mut self, id: &NodeId) {
        let now = self.now;
        self.log(|| format!("fence {id}"));
        let Some(n) = self.nodes.get_mut(id) else { return };
        if !n.alive || n.fenced {
            return;
        }
        if let Some(c) = n.coordinator.as_mut() {
            c.handle_leadership_lost(now);
        }
        n.region.handle_fenced(now);
        self.pump(id);
        let n = self.nodes.get_mut(id).expect("node exists");
        n.fenced = true;
        n.coordinator = None;
        let mut lost = Vec::new();
        for (_, e) in std::mem::take(&mut n.entities) {
            lost.extend(e.mailbox.into_iter().map(|(m, _)| m));
        }
        for m in &lost {
            self.ledger.excuse(m, now);
        }
        self.live.retain(|_, node| node != id);
    }

    /// Leaving nodes exit once they host nothing, hold nothing and nothing they sent is in flight.
    fn check_leavers(&mut self) {
        let leader_map = self
            .leader
            .as_ref()
            .and_then(|l| self.nodes.get(l))
            .and_then(|n| n.coordinator.as_ref())
            .map(|c| c.shard_map().clone());
        let leavers: Vec<NodeId> =
            self.nodes.values().filter(|n| n.alive && !n.fenced && n.leaving).map(|n| n.id.clone()).collect();
        for id in leavers {
            let owns = leader_map.as_ref().is_none_or(|m| m.shards_of(&id).next().is_some());
            let n = self.nodes.get_mut(&id).expect("node exists");
            if owns || !n.region.hosted().is_empty() || !n.region.is_quiet() || !n.entities.is_empty() {
                continue;
            }
            if !n.settling {
                n.settling = true;
                n.region.flush_all(self.now);
                self.pump(&id);
                continue;
            }
            if n.region.is_settled() {
                let _ = self.view.set_status(&id, MemberStatus::Exiting);
                let _ = self.view.set_status(&id, MemberStatus::Removed);
                self.kill(&id, true);
                self.membership_changed();
            }
        }
    }

    // ---------------------------------------------------------------- the loop

    fn step(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Deliver { from, to, session, wire } => {
                let cur = self.sessions.get(&pair(&from.name, &to.name)).copied().unwrap_or(0);
                if cur != session || !self.link_ok(&from.name, &to.name) {
                    self.excuse_wire(&wire);
                    return;
                }
                let Some(n) = self.nodes.get_mut(&to) else { return };
                if !n.alive {
                    // Graceful exit: the connection closed unread; the sender gets it back.
                    if let Wire::Region(msg) = wire {
                        self.schedule(now + 1, Ev::Undeliverable { node: from, dest: to, msg });
                    }
                    return;
                }
                if n.fenced {
                    self.excuse_wire(&wire);
                    return;
                }
                match wire {
                    Wire::ToRegion(m) => n.region.handle_coordinator_message(now, &from, m),
                    Wire::Region(m) => n.region.handle_region_message(now, &from, m),
                    Wire::ToCoord(m) => {
                        if let Some(c) = n.coordinator.as_mut() {
                            match m {
                                ToCoordinator::Register { term, hosted, hosting } => {
                                    c.handle_register(now, &from, term, &hosted, hosting)
                                }
                                ToCoordinator::GetShardHome { shard } => c.handle_get_shard_home(now, &from, shard),
                                ToCoordinator::BeginHandOffAck { term, shard } => {
                                    c.handle_begin_hand_off_ack(now, &from, term, shard)
                                }
                                ToCoordinator::ShardStopped { shard, epoch, handover, .. } => {
                                    c.handle_shard_stopped(now, &from, shard, epoch, handover)
                                }
                            }
                        }
                    }
                }
                self.pump(&to);
            }
            Ev::Undeliverable { node, dest, msg } => {
                let Some(n) = self.nodes.get_mut(&node) else { return };
                if !n.alive || n.fenced {
                    if let RegionMessage::Forward { msg, .. } | RegionMessage::Bounce { msg, .. } = &msg {
                        self.ledger.excuse(msg, now);
                    }
                    return;
                }
                if let RegionMessage::Bounce { msg, .. } = &msg {
                    self.ledger.excuse(msg, now);
                }
                n.region.handle_undeliverable(now, &dest, msg);
                self.pump(&node);
            }
            Ev::LinkDown { node, peer } => {
                let Some(n) = self.nodes.get_mut(&node) else { return };
                if n.alive && !n.fenced {
                    n.region.handle_link_down(now, &peer);
                    self.pump(&node);
                }
            }
            Ev::Timer { node } => {
                let Some(n) = self.nodes.get_mut(&node) else { return };
                if !n.alive || n.fenced {
                    return;
                }
                n.timer_at = None;
                n.region.handle_timeout(now);
                if let Some(c) = n.coordinator.as_mut() {
                    c.handle_timeout(now);
                }
                self.pump(&node);
            }
            Ev::Process { node } => self.process(&node),
            Ev::ClientSend { node, client } => {
                let active = now < self.p.active_ms;
                let Some(n) = self.nodes.get_mut(&node) else { return };
                if !n.alive || n.fenced || n.leaving || !active {
                    return;
                }
                let entity = self.rng.range(0, u64::from(self.p.entities)) as u32;
                let seq = {
                    let s = n.client_seq.entry((client, entity)).or_insert(0);
                    *s += 1;
                    *s
                };
                let id = self.ledger.sent();
                let msg = UserMsg { id, sender: (node.clone(), client), entity, seq };
                let shard = self.entity_shard[entity as usize];
                self.log(|| format!("send {msg:?} to {shard}"));
                let n = self.nodes.get_mut(&node).expect("node exists");
                n.region.handle_send(now, shard, msg);
                self.pump(&node);
                let next = now + self.rng.range(3, 30);
                self.schedule(next, Ev::ClientSend { node, client });
            }
            Ev::Fault => self.fault(),
            Ev::Fence { node, isolation } => {
                if self.isolated.get(&*node.name) == Some(&isolation) {
                    self.fence(&node);
                    self.schedule(now + (DOWN_AFTER - FENCE_AFTER), Ev::Down { node });
                }
            }
            Ev::Down { node } => {
                if self.view.get(&node).is_some_and(|m| !m.status.is_fenced()) {
                    self.log(|| format!("down {node}"));
                    let _ = self.view.set_status(&node, MemberStatus::Down);
                    self.membership_changed();
                }
            }
            Ev::Heal { name, isolation } => {
                if self.isolated.get(&name) != Some(&isolation) {
                    return;
                }
                self.isolated.remove(&name);
                self.log(|| format!("heal {name}"));
                if let Some(id) = self.current.get(&name).cloned() {
                    if self.nodes.get(&id).is_some_and(|n| n.fenced) {
                        // Fenced nodes come back as a new incarnation once their lease is gone.
                        self.kill(&id, false);
                        self.schedule(now + DOWN_AFTER, Ev::Restart { name });
                    } else {
                        // Healed before fencing: its connections come back.
                        for peer in self.alive_ids() {
                            if peer != id {
                                self.break_link(&id, &peer);
                            }
                        }
                    }
                }
            }
            Ev::HealCut { a, b } => {
                self.cuts.remove(&pair(&a, &b));
            }
            Ev::Restart { name } => {
                if let Some(old) = self.current.get(&name).cloned() {
                    if self.view.get(&old).is_some_and(|m| !m.status.is_fenced()) {
                        let _ = self.view.set_status(&old, MemberStatus::Down);
                    }
                }
                self.start_node(&name);
            }
            Ev::Join => {
                let name = self.fresh_name();
                self.start_node(&name);
            }
        }
    }

    /// I1 for shards: at most one live node hosts each shard.
    fn check_single_owner(&mut self) {
        for s in 0..self.p.shards {
            let shard = ShardId(s);
            let mut hosts = self.nodes.values().filter(|n| n.alive && !n.fenced && n.region.hosts(shard));
            if let (Some(a), Some(b)) = (hosts.next(), hosts.next()) {
                let msg = format!("t={} I1: {shard} hosted by {} and {}", self.now, a.id, b.id);
                self.ledger.violations.push(msg);
            }
        }
    }

    /// I2: after the quiet period every shard has a live, active home and no region holds anything.
    fn check_homed(&mut self) {
        let Some(c) = self.leader.as_ref().and_then(|l| self.nodes.get(l)).and_then(|n| n.coordinator.as_ref()) else {
            self.ledger.violations.push("I2: no coordinator after the quiet period".into());
            return;
        };
        if c.is_recovering() {
            self.ledger.violations.push("I2: coordinator still recovering after the quiet period".into());
        }
        let map = c.shard_map().clone();
        for (shard, slot) in map.iter() {
            let ok = slot
                .owner
                .as_ref()
                .and_then(|o| self.nodes.get(o))
                .is_some_and(|n| n.alive && n.region.is_active(shard));
            if !ok {
                self.ledger.violations.push(format!("I2: {shard} not homed ({:?})", slot.owner));
            }
        }
        for n in self.nodes.values().filter(|n| n.alive && !n.fenced) {
            if n.region.buffered() > 0 {
                self.ledger.violations.push(format!("I2: {} still buffers {} messages", n.id, n.region.buffered()));
            }
        }
    }

    /// Runs the schedule to its end and returns its violations.
    pub fn run(mut self) -> (Vec<String>, World) {
        let end = self.p.active_ms + self.p.quiet_ms;
        let mut heal_done = false;
        while let Some(Reverse((at, id))) = self.queue.pop() {
            if at > end {
                break;
            }
            if !heal_done && at >= self.p.active_ms {
                // Quiet period: every cut heals; clients have stopped.
                heal_done = true;
                self.now = self.p.active_ms;
                self.cuts.clear();
            }
            self.now = at;
            let Some(ev) = self.events.remove(&id) else { continue };
            self.steps += 1;
            format!("{at}{ev:?}").hash(&mut self.trace);
            if self.verbose {
                self.log(|| format!("{ev:?}"));
            }
            self.step(ev);
            self.check_leavers();
            self.check_single_owner();
            if !self.ledger.violations.is_empty() {
                break;
            }
        }
        if self.ledger.violations.is_empty() {
            self.check_homed();
            self.ledger.check_all_settled();
        }
        (std::mem::take(&mut self.ledger.violations), self)
    }
}
