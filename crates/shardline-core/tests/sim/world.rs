//! The simulated cluster: nodes running a region (and, on the leader, the coordinator), a
//! network of per-pair FIFO links with random delays, a membership oracle standing in for a
//! lease store, entities with mailboxes, clients, and faults — all driven by one seeded rng.

use shardline_core::Engine;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::Hash;

use shardline_core::{
    shard_of, AllocationStrategy, ConsistentHash, CoordinatorCommand, CoordinatorConfig, CoordinatorEngine, Epoch,
    LeastShards, MapWriteError, Member, MemberStatus, MembershipView, NodeId, Ranges, RegionCommand, RegionConfig,
    RegionEngine, RegionMessage, RoundLimit, ShardId, ShardMap, ToCoordinator, ToRegion, VersionAware,
};

use super::ledger::{Ledger, UserMsg};
use super::queue::Queue;
use super::rng::Rng;

mod engines;
mod faults;
mod invariants;
mod membership;
mod params;
mod remembered;

pub use params::Params;

/// Timing of failure handling (virtual milliseconds).
const FENCE_AFTER: u64 = 300; // a cut-off node stops its shards (lease TTL − margin)
const DOWN_AFTER: u64 = 500; // the store declares it down (lease TTL)
/// How long a stale leader coordinates on. Far longer than a lease, which would stop it
/// sooner, so that its map writes meet a newer term's and are refused.
const STALE_LEADER_MS: u64 = 3_000;

#[derive(Clone, Debug)]
enum Wire {
    ToCoord(ToCoordinator),
    ToRegion(ToRegion),
    Region(RegionMessage<UserMsg>),
}

#[derive(Debug)]
enum Ev {
    Deliver {
        from: NodeId,
        to: NodeId,
        session: u64,
        wire: Wire,
    },
    Undeliverable {
        node: NodeId,
        dest: NodeId,
        msg: RegionMessage<UserMsg>,
    },
    LinkDown {
        node: NodeId,
        peer: NodeId,
    },
    Timer {
        node: NodeId,
    },
    Process {
        node: NodeId,
    },
    ClientSend {
        node: NodeId,
        client: u32,
    },
    Fault,
    Fence {
        node: NodeId,
        isolation: u64,
    },
    Down {
        node: NodeId,
    },
    Heal {
        name: String,
        isolation: u64,
    },
    HealCut {
        a: String,
        b: String,
    },
    Restart {
        name: String,
    },
    Join,
    /// The journal answers a claim or a read of remembered entities.
    Journal {
        node: NodeId,
        shard: ShardId,
        epoch: Epoch,
        read: bool,
    },
    /// A woken remembered entity has recovered.
    Woken {
        node: NodeId,
        shard: ShardId,
        epoch: Epoch,
        entity: u32,
    },
    /// A stale leader's lease deadline: it stops coordinating if it still does.
    LeaderDeadline {
        node: NodeId,
        term: u64,
    },
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
    /// Remembered entities woken and not yet recovered.
    waking: usize,
}

pub struct World {
    p: Params,
    rng: Rng,
    now: u64,
    queue: Queue<Ev>,
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
    /// The term that last wrote the stored map; older writers are refused (deposed).
    store_term: u64,
    pub deposed: u64,
    /// Times a member was marked unreachable in the view.
    pub unreachable_marks: u64,
    /// Each coordinator's hand-offs after the last step, to find the ones a step began.
    hand_offs_seen: BTreeMap<NodeId, BTreeSet<(ShardId, NodeId, NodeId)>>,
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
            queue: Queue::new(),
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
            store_term: 0,
            deposed: 0,
            unreachable_marks: 0,
            hand_offs_seen: BTreeMap::new(),
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
            0 => Box::new(LeastShards::with_limit(RoundLimit { absolute: 3, relative: 0.2 })),
            1 => Box::new(VersionAware::default()),
            2 => Box::new(ConsistentHash { vnodes_per_weight: 20, ..ConsistentHash::default() }),
            _ => Box::new(Ranges::default()),
        }
    }

    fn fresh_name(&mut self) -> String {
        self.next_name += 1;
        format!("n{}", self.next_name)
    }

    fn schedule(&mut self, at: u64, ev: Ev) {
        self.queue.push(self.now, at, ev);
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
        if self.p.remember {
            rc.journaled = true;
            rc.claim_retry_ms = 100;
            rc.remember = Some(remembered::PACE);
        }
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
            waking: 0,
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

    fn alive_ids(&self) -> Vec<NodeId> {
        self.nodes.values().filter(|n| n.alive && !n.fenced).map(|n| n.id.clone()).collect()
    }

    fn is_alive(&self, id: &NodeId) -> bool {
        self.nodes.get(id).is_some_and(|n| n.alive)
    }

    // ---------------------------------------------------------------- network

    fn send(&mut self, from: &NodeId, to: &NodeId, wire: Wire) {
        if !self.is_alive(to) || !self.link_ok(&from.name, &to.name) {
            // No connection: the transport says so at once; region messages come back, in the
            // order they were sent, as a transport hands frames back. Frames still in flight to
            // a node that exited come back at their delivery time + 1 (see `step`), so a later
            // one must not overtake them. (A broken link drops what was in flight instead.)
            match wire {
                Wire::Region(msg) => {
                    let mut at = self.now + 1;
                    if !self.is_alive(to) {
                        let key = (from.clone(), to.clone());
                        at = at.max(self.last_at.get(&key).map_or(0, |t| t + 2));
                        self.last_at.insert(key, at - 1);
                    }
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
            Ev::Journal { node, shard, epoch, read } => self.journal_answers(&node, shard, epoch, read),
            Ev::Woken { node, shard, epoch, entity } => self.woken(&node, shard, epoch, entity),
            Ev::LeaderDeadline { node, term } => {
                let Some(n) = self.nodes.get_mut(&node) else { return };
                if self.leader.as_ref() != Some(&node) && n.coordinator.as_ref().is_some_and(|c| c.term() == term) {
                    if let Some(c) = n.coordinator.as_mut() {
                        c.handle_leadership_lost(now);
                    }
                    n.coordinator = None;
                    self.log(|| format!("{node} stops coordinating term {term} at its lease deadline"));
                    self.pump(&node);
                }
            }
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
                // The driver's lock-free route: a shard this node hosts with nothing buffered
                // gets the message straight from the client, without the engine.
                match n.region.local_epoch(shard) {
                    Some(epoch) => self.run_region_command(&node, RegionCommand::Deliver { shard, epoch, msg }),
                    None => n.region.handle_send(now, shard, msg),
                }
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
                self.refresh_reachability();
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
                self.refresh_reachability();
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

    /// Runs the schedule to its end and returns its violations.
    pub fn run(mut self) -> (Vec<String>, World) {
        let end = self.p.active_ms + self.p.quiet_ms;
        let mut heal_done = false;
        while let Some((at, ev)) = self.queue.pop() {
            if at > end {
                break;
            }
            if !heal_done && at >= self.p.active_ms {
                // Quiet period: every cut heals; clients have stopped.
                heal_done = true;
                self.now = self.p.active_ms;
                self.cuts.clear();
                self.refresh_reachability();
            }
            self.now = at;
            self.steps += 1;
            format!("{at}{ev:?}").hash(&mut self.trace);
            if self.verbose {
                self.log(|| format!("{ev:?}"));
            }
            self.step(ev);
            self.check_leavers();
            self.check_single_owner();
            self.check_hand_offs_reachable();
            if !self.ledger.violations.is_empty() {
                break;
            }
        }
        if self.ledger.violations.is_empty() {
            self.check_homed();
            self.check_remembered();
            self.ledger.check_all_settled();
        }
        (std::mem::take(&mut self.ledger.violations), self)
    }
}
