//! One simulated world: real nodes (the public builder, their drivers, hosts, entity tasks and
//! membership providers) on the simulated network, each on a tokio runtime of its own whose
//! clock is paused and moved by the world, all on one thread.
//!
//! Every host's clock reads `origin + OFFSET + world time`: runtimes made later (a restart) are
//! moved forward to it when they start, a paused host's clock jumps by the pause when it wakes.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline::entity::{EventSourced, EventSourcedHandle, EventSourcedSettings, RequestId};
use shardline::journal::{InMemoryJournal, Journal};
use shardline::membership::lease::{InMemoryStore, LeaseConfig, Leases};
use shardline::sabotage::{self, Sabotage};
use shardline::{Cluster, EntityId, Error, Gossip, GossipConfig, Processed};
use shardline_cli::account::{AccountCmd, AccountReply};
use shardline_cli::history::{Kind, Operation, Outcome as Answer};
use shardline_cli::{account_settings, Account};
use shardline_core::SplitBrainPolicy;
use tokio::runtime::Runtime;
use tokio::time::Instant;

use super::faulty::{FaultyJournal, JournalFaults};
use super::net::SimNet;
use super::rng::Rng;

/// Each host's runtime runs this long per step.
pub const TICK_MS: u64 = 10;
/// Far enough ahead of any runtime's start that every runtime can be moved forward to it.
const OFFSET: Duration = Duration::from_secs(3600);
const SHARDS: u32 = 16;
const ACCOUNTS: usize = 5;
const CLIENTS: usize = 4;
/// Faults happen in this window (ms).
const FAULTS_FROM: u64 = 3_000;
pub const HEAL_AT: u64 = 24_000;
/// Every account answers within this long after the heal.
pub const ANSWER_WITHIN: u64 = 40_000;

/// The membership a schedule runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Leases over an in-memory store shared by the hosts, with the split-brain race.
    Leases,
    /// Gossip with the keep-majority resolver.
    Gossip,
}

/// Panics of this thread (a task of a node, whose runtime would swallow them): each one is a
/// violation of the schedule.
pub fn take_panics() -> Vec<String> {
    PANICS.with(|p| p.take())
}

fn record_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let host = CURRENT.with(|c| c.borrow().clone());
            PANICS.with(|p| p.borrow_mut().push(format!("{host}: {info}")));
            default(info);
        }));
    });
}

thread_local! {
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    /// The host whose runtime the world is running (entity code reads it).
    static CURRENT: RefCell<String> = const { RefCell::new(String::new()) };
    /// Every command an account instance decided: (account, instance, host, world ms).
    static DECIDED: RefCell<Vec<Decided>> = const { RefCell::new(Vec::new()) };
    static NEXT_INSTANCE: Cell<u64> = const { Cell::new(1) };
    static NOW_MS: Cell<u64> = const { Cell::new(0) };
}

#[derive(Clone, Debug)]
pub struct Decided {
    pub account: String,
    pub instance: u64,
    pub host: String,
    pub at_ms: u64,
}

fn fresh_instance() -> u64 {
    NEXT_INSTANCE.with(|n| {
        let i = n.get();
        n.set(i + 1);
        i
    })
}

/// The demo's account, which also tells the world which instance decided each command: a
/// state made by `empty` or read from bytes (a recovery, a hand-off) is a new instance.
#[derive(Debug, Serialize, Deserialize)]
pub struct SimAccount {
    id: String,
    account: Account,
    #[serde(skip, default = "fresh_instance")]
    instance: u64,
}

impl EventSourced for SimAccount {
    type Command = AccountCmd;
    type Event = <Account as EventSourced>::Event;
    type Reply = AccountReply;
    const EVENT_TYPE: &'static str = Account::EVENT_TYPE;

    fn empty(id: &EntityId) -> Self {
        SimAccount { id: id.as_str().to_string(), account: Account::empty(id), instance: fresh_instance() }
    }

    fn apply(&mut self, event: &Self::Event) {
        self.account.apply(event);
    }

    fn decide(&self, command: AccountCmd) -> (Vec<Self::Event>, AccountReply) {
        let d = Decided {
            account: self.id.clone(),
            instance: self.instance,
            host: CURRENT.with(|c| c.borrow().clone()),
            at_ms: NOW_MS.with(Cell::get),
        };
        DECIDED.with(|log| log.borrow_mut().push(d));
        self.account.decide(command)
    }
}

pub type SimAccounts = EventSourcedHandle<SimAccount>;

/// What a fault did, for the trace and the report.
#[derive(Clone, Debug)]
pub enum Fault {
    Crash { host: usize, for_ms: u64 },
    Pause { host: usize, for_ms: u64 },
    Partition { side: Vec<usize>, for_ms: u64 },
    OneWay { from: usize, to: usize, for_ms: u64 },
    Jitter { ms: u64, for_ms: u64 },
    Reset { a: usize, b: usize },
    JournalDown { for_ms: u64 },
    SlowCommits { ms: u64, for_ms: u64 },
    CommitUnknown { pct: u64, for_ms: u64 },
    StoreDown { for_ms: u64 },
    Leave { host: usize, for_ms: u64 },
    Join { host: usize },
}

impl Fault {
    /// Whether this fault is one the membership does not promise a single owner under.
    fn outside_promise(&self, mode: Mode) -> bool {
        mode == Mode::Gossip && matches!(self, Fault::Pause { .. } | Fault::OneWay { .. })
    }
}

/// Which faults a schedule may draw.
#[derive(Clone, Copy, Debug)]
pub struct FaultMix {
    pub crashes: bool,
    pub pauses: bool,
    pub partitions: bool,
    pub network: bool,
    pub journal: bool,
    pub store: bool,
    pub membership_changes: bool,
}

impl FaultMix {
    pub const ALL: FaultMix = FaultMix {
        crashes: true,
        pauses: true,
        partitions: true,
        network: true,
        journal: true,
        store: true,
        membership_changes: true,
    };
}

/// What a schedule is.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub seed: u64,
    pub mode: Mode,
    /// (at ms, fault), in time order.
    pub faults: Vec<(u64, Fault)>,
    /// Nodes started at time 0 (a `Join` starts one more).
    pub nodes: usize,
}

impl Schedule {
    pub fn draw(seed: u64, mix: FaultMix, mode: Option<Mode>) -> Schedule {
        let mut rng = Rng::new(seed);
        let mode = mode.unwrap_or(if rng.chance(50) { Mode::Leases } else { Mode::Gossip });
        let nodes = 3;
        let mut kinds: Vec<u64> = Vec::new();
        let mut allow = |on: bool, ks: &[u64]| {
            if on {
                kinds.extend_from_slice(ks)
            }
        };
        allow(mix.crashes, &[0]);
        allow(mix.pauses, &[1]);
        allow(mix.partitions, &[2, 3]);
        allow(mix.network, &[4, 5]);
        allow(mix.journal, &[6, 7, 8]);
        allow(mix.store && mode == Mode::Leases, &[9]);
        allow(mix.membership_changes, &[10, 11]);
        let mut faults = Vec::new();
        let mut at = FAULTS_FROM;
        let mut joined = false;
        while !kinds.is_empty() {
            at += 500 + rng.below(4_000);
            if at >= HEAL_AT - 1_000 {
                break;
            }
            let for_ms = 500 + rng.below(7_500);
            let host = rng.below(nodes as u64) as usize;
            let other = (host + 1 + rng.below(nodes as u64 - 1) as usize) % nodes;
            let fault = match kinds[rng.below(kinds.len() as u64) as usize] {
                0 => Fault::Crash { host, for_ms },
                1 => Fault::Pause { host, for_ms },
                2 => Fault::Partition { side: vec![host], for_ms },
                3 => Fault::OneWay { from: host, to: other, for_ms },
                4 => Fault::Jitter { ms: 20 + rng.below(300), for_ms },
                5 => Fault::Reset { a: host, b: other },
                6 => Fault::JournalDown { for_ms: for_ms.min(3_000) },
                7 => Fault::SlowCommits { ms: 50 + rng.below(1_500), for_ms },
                8 => Fault::CommitUnknown { pct: 10 + rng.below(40), for_ms },
                9 => Fault::StoreDown { for_ms: for_ms.min(2_500) },
                10 => Fault::Leave { host, for_ms },
                _ if !joined => {
                    joined = true;
                    Fault::Join { host: nodes }
                }
                _ => Fault::Crash { host, for_ms },
            };
            faults.push((at, fault));
        }
        Schedule { seed, mode, faults, nodes }
    }

    /// Whether the membership promises one owner under every fault of the schedule.
    pub fn promises_one_owner(&self) -> bool {
        !self.faults.iter().any(|(_, f)| f.outside_promise(self.mode))
    }
}

/// What a run left to check.
pub struct Outcome {
    pub history: Vec<Operation>,
    pub decided: Vec<Decided>,
    /// Account → op ids in its journal, in order.
    pub journal_ops: BTreeMap<String, Vec<u64>>,
    /// Accounts that did not answer within `ANSWER_WITHIN` of the heal.
    pub unanswered: Vec<String>,
    pub trace: Vec<String>,
    pub steps: u64,
}

/// A node and its accounts, once built.
type Slot = Arc<Mutex<Option<(Cluster, SimAccounts)>>>;

/// One host: a node's runtime, or nothing while it is down.
struct Host {
    name: String,
    ip: IpAddr,
    rt: Option<Runtime>,
    /// The node, once built.
    node: Slot,
    paused_until: Option<u64>,
    down_until: Option<u64>,
}

/// The world of one schedule.
struct World {
    sched: Schedule,
    net: SimNet,
    origin: std::time::Instant,
    now_ms: u64,
    hosts: Vec<Host>,
    journal: Arc<InMemoryJournal>,
    faults: Arc<Mutex<JournalFaults>>,
    store: InMemoryStore,
    history: Arc<Mutex<Vec<Operation>>>,
    in_flight: Arc<Mutex<BTreeMap<u64, Operation>>>,
    trace: Vec<String>,
    tracing: bool,
    /// Restores at these times.
    pending: Vec<(u64, Restore)>,
}

#[derive(Clone, Debug)]
enum Restore {
    Start(usize),
    Resume(usize),
    Heal,
    Jitter,
    JournalUp,
    Fast,
    Commits,
    StoreUp,
}

fn ip_of(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, i as u8 + 1))
}

const CLIENT_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1));
const PORT: u16 = 7000;

/// Runs one schedule, with the runtime broken as `sabotage` says.
pub fn run(sched: Schedule, sab: Sabotage, tracing: bool) -> Outcome {
    sabotage::set(sab);
    record_panics();
    DECIDED.with(|d| d.borrow_mut().clear());
    let net = SimNet::new(sched.seed.rotate_left(17));
    let journal = Arc::new(InMemoryJournal::new());
    let faults = Arc::new(Mutex::new(JournalFaults::default()));
    let mut w = World {
        net,
        origin: std::time::Instant::now(),
        now_ms: 0,
        hosts: Vec::new(),
        journal,
        faults,
        store: InMemoryStore::new(),
        history: Arc::default(),
        in_flight: Arc::default(),
        trace: Vec::new(),
        tracing,
        pending: Vec::new(),
        sched,
    };
    for i in 0..w.sched.nodes {
        w.add_host(format!("n{}", i + 1), ip_of(i));
        w.start(i);
    }
    let client = w.add_host("client".into(), CLIENT_IP);
    w.start(client);
    let answered: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    w.spawn_clients(client, answered.clone());
    let faults = w.sched.faults.clone();
    let mut next = 0;
    let end = HEAL_AT + ANSWER_WITHIN;
    let mut steps = 0;
    while w.now_ms < end {
        w.now_ms += TICK_MS;
        steps += 1;
        NOW_MS.with(|n| n.set(w.now_ms));
        w.net.advance(w.now_ms);
        while next < faults.len() && faults[next].0 <= w.now_ms {
            w.inject(&faults[next].1);
            next += 1;
        }
        let due: Vec<Restore> = {
            let now = w.now_ms;
            let (due, later): (Vec<_>, Vec<_>) = w.pending.drain(..).partition(|(at, _)| *at <= now);
            w.pending = later;
            due.into_iter().map(|(_, r)| r).collect()
        };
        for r in due {
            w.restore(r);
        }
        if w.now_ms == HEAL_AT {
            w.heal_everything();
        }
        w.tick();
        if w.now_ms > HEAL_AT && answered.lock().unwrap_or_else(|e| e.into_inner()).len() == ACCOUNTS {
            break;
        }
    }
    let answered = answered.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let unanswered = (0..ACCOUNTS).map(account).filter(|a| !answered.contains_key(a)).collect();
    // Stop every node before reading what they left.
    for h in &mut w.hosts {
        if let Some(rt) = h.rt.take() {
            drop(rt);
        }
    }
    let mut history = std::mem::take(&mut *w.history.lock().unwrap_or_else(|e| e.into_inner()));
    let end_us = w.now_ms * 1_000;
    for (_, mut o) in std::mem::take(&mut *w.in_flight.lock().unwrap_or_else(|e| e.into_inner())) {
        o.complete_us = end_us;
        history.push(o);
    }
    let journal_ops = read_journal(&w.journal);
    sabotage::set(Sabotage::None);
    Outcome { history, decided: DECIDED.with(|d| d.take()), journal_ops, unanswered, trace: w.trace, steps }
}

fn account(i: usize) -> String {
    format!("acct-{i}")
}

fn read_journal(journal: &InMemoryJournal) -> BTreeMap<String, Vec<u64>> {
    let rt = tokio::runtime::Builder::new_current_thread().build().ok();
    let mut out = BTreeMap::new();
    let Some(rt) = rt else { return out };
    for i in 0..ACCOUNTS {
        let a = account(i);
        let events = rt.block_on(journal.read(&format!("account|{a}"), 1));
        let ops = match events {
            Ok(events) => events
                .iter()
                .filter_map(|e| postcard::from_bytes::<<Account as EventSourced>::Event>(&e.event.payload).ok())
                .map(|e| match e {
                    shardline_cli::account::AccountEvent::Deposited { op, .. }
                    | shardline_cli::account::AccountEvent::Withdrew { op, .. } => op,
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        out.insert(a, ops);
    }
    out
}

impl World {
    fn log(&mut self, what: String) {
        if self.tracing {
            // At once, between the nodes' own log lines.
            println!("{:>6} ms  == {what}", self.now_ms);
        }
    }

    fn add_host(&mut self, name: String, ip: IpAddr) -> usize {
        self.hosts.push(Host { name, ip, rt: None, node: Arc::default(), paused_until: None, down_until: None });
        self.hosts.len() - 1
    }

    fn target(&self) -> Instant {
        Instant::from_std(self.origin) + OFFSET + Duration::from_millis(self.now_ms)
    }

    /// Starts host `i` as a new incarnation.
    fn start(&mut self, i: usize) {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build() {
            Ok(rt) => rt,
            Err(e) => panic!("a runtime for {}: {e}", self.hosts[i].name),
        };
        let target = self.target();
        rt.block_on(async move {
            let now = Instant::now();
            if target > now {
                tokio::time::advance(target - now).await;
            }
        });
        let h = &self.hosts[i];
        let name = h.name.clone();
        let proxy = h.ip == CLIENT_IP;
        let bind = SocketAddr::new(h.ip, PORT).to_string();
        let network = self.net.host(h.ip);
        let seed = SocketAddr::new(ip_of(0), PORT).to_string();
        let mode = self.sched.mode;
        let store = self.store.clone();
        let journal: Arc<dyn Journal> = Arc::new(FaultyJournal::new(self.journal.clone(), self.faults.clone()));
        let slot = h.node.clone();
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
        CURRENT.with(|c| *c.borrow_mut() = name.clone());
        // The host's software: what `shardline node` does, a node fenced by its membership
        // rejoins as a new incarnation once its old lease has lapsed.
        rt.spawn(async move {
            loop {
                let mut b = Cluster::builder()
                    .cluster_name("sim")
                    .node_name(name.clone())
                    .bind(bind.clone())
                    .network(network.clone());
                b = match mode {
                    Mode::Leases => b.membership(Leases::new(Arc::new(store.clone()), "sim", LeaseConfig::default())),
                    Mode::Gossip => b.membership(
                        Gossip::new([seed.clone()])
                            .with_config(GossipConfig::with_split_brain(SplitBrainPolicy::KeepMajority, 5_000)),
                    ),
                };
                if proxy {
                    b = b.proxy();
                }
                let node = match b.build().await {
                    Ok(n) => n,
                    Err(e) => panic!("{name} did not start: {e}"),
                };
                let mut settings = account_settings(SHARDS);
                if !proxy {
                    settings = settings.journal(journal.clone());
                }
                let accounts =
                    match node.register_event_sourced::<SimAccount>(settings, EventSourcedSettings::default()).await {
                        Ok(a) => a,
                        Err(e) => panic!("{name}: accounts not registered: {e}"),
                    };
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((node.clone(), accounts));
                let _ = node.downed().await;
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
                node.crash();
                drop(node);
                tokio::time::sleep(LeaseConfig::default().ttl).await;
            }
        });
        self.hosts[i].rt = Some(rt);
        self.hosts[i].paused_until = None;
        self.hosts[i].down_until = None;
        let n = self.hosts[i].name.clone();
        self.log(format!("{n} starts"));
    }

    fn crash(&mut self, i: usize) {
        let ip = self.hosts[i].ip;
        if let Some(rt) = self.hosts[i].rt.take() {
            CURRENT.with(|c| *c.borrow_mut() = self.hosts[i].name.clone());
            drop(rt);
        }
        self.net.unbind(ip);
        *self.hosts[i].node.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Runs every live, unpaused host up to the world's time.
    fn tick(&mut self) {
        let target = self.target();
        for h in &mut self.hosts {
            if h.paused_until.is_some() {
                continue;
            }
            let Some(rt) = &h.rt else { continue };
            CURRENT.with(|c| *c.borrow_mut() = h.name.clone());
            let _span = tracing::info_span!("host", name = %h.name).entered();
            rt.block_on(async move {
                let now = Instant::now();
                // A host that was paused wakes with its clock jumped, its timers all due.
                if target > now + Duration::from_millis(TICK_MS) {
                    tokio::time::advance(target - now - Duration::from_millis(TICK_MS)).await;
                }
                tokio::time::sleep_until(target).await;
            });
        }
    }

    fn inject(&mut self, f: &Fault) {
        let n = self.sched.nodes;
        self.log(format!("fault {f:?}"));
        let now = self.now_ms;
        match *f {
            Fault::Crash { host, for_ms } if self.hosts[host].rt.is_some() => {
                self.crash(host);
                self.hosts[host].down_until = Some(now + for_ms);
                self.pending.push((now + for_ms, Restore::Start(host)));
            }
            Fault::Pause { host, for_ms }
                if self.hosts[host].rt.is_some() && self.hosts[host].paused_until.is_none() =>
            {
                self.hosts[host].paused_until = Some(now + for_ms);
                self.pending.push((now + for_ms, Restore::Resume(host)));
            }
            Fault::Partition { ref side, for_ms } => {
                for &a in side {
                    for b in (0..self.hosts.len()).filter(|b| !side.contains(b)) {
                        self.net.cut(self.hosts[a].ip, self.hosts[b].ip);
                        self.net.cut(self.hosts[b].ip, self.hosts[a].ip);
                    }
                }
                self.pending.push((now + for_ms, Restore::Heal));
            }
            Fault::OneWay { from, to, for_ms } => {
                self.net.cut(self.hosts[from].ip, self.hosts[to].ip);
                self.pending.push((now + for_ms, Restore::Heal));
            }
            Fault::Jitter { ms, for_ms } => {
                self.net.set_jitter(ms);
                self.pending.push((now + for_ms, Restore::Jitter));
            }
            Fault::Reset { a, b } => self.net.reset_between(self.hosts[a].ip, self.hosts[b].ip),
            Fault::JournalDown { for_ms } => {
                self.journal.set_down(true);
                self.pending.push((now + for_ms, Restore::JournalUp));
            }
            Fault::SlowCommits { ms, for_ms } => {
                self.faults.lock().unwrap_or_else(|e| e.into_inner()).delay_ms = ms;
                self.pending.push((now + for_ms, Restore::Fast));
            }
            Fault::CommitUnknown { pct, for_ms } => {
                self.faults.lock().unwrap_or_else(|e| e.into_inner()).unknown_pct = pct;
                self.pending.push((now + for_ms, Restore::Commits));
            }
            Fault::StoreDown { for_ms } => {
                self.store.set_down(true);
                self.pending.push((now + for_ms, Restore::StoreUp));
            }
            Fault::Leave { host, for_ms }
                if self.hosts[host].rt.is_some() && self.hosts[host].paused_until.is_none() =>
            {
                let node = self.hosts[host].node.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let (Some((node, _)), Some(rt)) = (node, &self.hosts[host].rt) {
                    // Leaves in its own time; the host goes down once it has left.
                    rt.spawn(async move {
                        let _ = node.leave().await;
                    });
                }
                self.pending.push((now + for_ms.max(6_000), Restore::Start(host)));
            }
            Fault::Join { host } if host >= self.hosts.len() - 1 => {
                let i = self.hosts.len();
                self.add_host(format!("n{}", i), ip_of(n));
                self.start(i);
            }
            _ => {}
        }
    }

    fn restore(&mut self, r: Restore) {
        self.log(format!("restore {r:?}"));
        match r {
            Restore::Start(i) => {
                if self.now_ms >= HEAL_AT || self.hosts[i].down_until.is_some_and(|t| t <= self.now_ms) {
                    self.crash(i);
                    self.start(i);
                } else if self.hosts[i].down_until.is_none() {
                    // After a leave: the process ends and a new one starts.
                    self.crash(i);
                    self.start(i);
                }
            }
            Restore::Resume(i) => self.hosts[i].paused_until = None,
            Restore::Heal => self.net.heal_all(),
            Restore::Jitter => self.net.set_jitter(0),
            Restore::JournalUp => self.journal.set_down(false),
            Restore::Fast => self.faults.lock().unwrap_or_else(|e| e.into_inner()).delay_ms = 0,
            Restore::Commits => self.faults.lock().unwrap_or_else(|e| e.into_inner()).unknown_pct = 0,
            Restore::StoreUp => self.store.set_down(false),
        }
    }

    fn heal_everything(&mut self) {
        self.log("heal everything".into());
        let pending = std::mem::take(&mut self.pending);
        for (_, r) in pending {
            self.restore(r);
        }
        self.net.heal_all();
        self.net.set_jitter(0);
        for i in 0..self.hosts.len() {
            self.hosts[i].paused_until = None;
            if self.hosts[i].rt.is_none() {
                self.start(i);
            }
        }
    }

    /// The clients, on the proxy node: each asks with request ids and retries as the demo's
    /// driver does, and reads; after the heal, one audits every account until it answers.
    fn spawn_clients(&mut self, client: usize, answered: Arc<Mutex<BTreeMap<String, u64>>>) {
        let Some(rt) = &self.hosts[client].rt else { return };
        let slot = self.hosts[client].node.clone();
        let origin = self.target() - Duration::from_millis(self.now_ms);
        let mut rng = Rng::new(self.sched.seed ^ 0xC11E);
        let next_op = Arc::new(std::sync::atomic::AtomicU64::new(1));
        let finished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for c in 0..CLIENTS {
            let finished = finished.clone();
            let slot = slot.clone();
            let history = self.history.clone();
            let mut rng = Rng::new(rng.next());
            let next_op = next_op.clone();
            let in_flight = self.in_flight.clone();
            rt.spawn(async move {
                let now_us = move || (Instant::now() - origin).as_micros() as u64;
                while now_us() < HEAL_AT * 1_000 {
                    // The proxy node's current incarnation (it rejoins when fenced).
                    let accounts = wait_for_accounts(&slot).await;
                    let a = account(rng.below(ACCOUNTS as u64) as usize);
                    let op = next_op.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let key = op;
                    let amount = 1 + rng.below(50) as i64;
                    let (cmd, kind) = match rng.below(10) {
                        0..=5 => (AccountCmd::Deposit { op, amount }, Kind::Deposit),
                        6 => (AccountCmd::Withdraw { op, amount }, Kind::Withdraw),
                        7 | 8 => (AccountCmd::Balance, Kind::Balance),
                        _ => (AccountCmd::Audit, Kind::Audit),
                    };
                    let write = matches!(kind, Kind::Deposit | Kind::Withdraw);
                    let rid = write.then(|| RequestId::new(format!("c{c}-{op}")));
                    let invoke_us = now_us();
                    let (op, amount) = if write { (op, amount) } else { (0, 0) };
                    // Until it ends, it is in flight: a run that stops first records it as of
                    // unknown outcome.
                    let unknown = Err(Error::OutcomeUnknown("in flight when the run ended".into()));
                    let o = operation(a.clone(), kind, op, amount, rid.as_ref(), invoke_us, u64::MAX, &unknown);
                    in_flight.lock().unwrap_or_else(|e| e.into_inner()).insert(key, o);
                    let r = ask_retrying(&accounts, &a, cmd, rid.clone()).await;
                    in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                    let o = operation(a, kind, op, amount, rid.as_ref(), invoke_us, now_us(), &r);
                    history.lock().unwrap_or_else(|e| e.into_inner()).push(o);
                    tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
                }
                finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            });
        }
        let history = self.history.clone();
        rt.spawn(async move {
            let now_us = move || (Instant::now() - origin).as_micros() as u64;
            // Audits after the last write has ended: they list every write, so every read
            // has a place in the log.
            while now_us() < HEAL_AT * 1_000 || finished.load(std::sync::atomic::Ordering::Relaxed) < CLIENTS {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            for i in 0..ACCOUNTS {
                let a = account(i);
                loop {
                    let accounts = wait_for_accounts(&slot).await;
                    let invoke_us = now_us();
                    let r = accounts.ask(&a, AccountCmd::Audit).await;
                    let ok = r.is_ok();
                    let o = operation(a.clone(), Kind::Audit, 0, 0, None, invoke_us, now_us(), &r);
                    history.lock().unwrap_or_else(|e| e.into_inner()).push(o);
                    if ok {
                        answered.lock().unwrap_or_else(|e| e.into_inner()).insert(a.clone(), now_us() / 1_000);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
    }
}

async fn wait_for_accounts(slot: &Slot) -> SimAccounts {
    loop {
        let node = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((_, accounts)) = node {
            return accounts;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asks, resending the same request id while the answer may be lost (as the demo's driver does).
async fn ask_retrying(
    accounts: &SimAccounts,
    id: &str,
    cmd: AccountCmd,
    rid: Option<RequestId>,
) -> Result<AccountReply, Error> {
    let mut tries = 0;
    loop {
        let r = match &rid {
            Some(rid) => accounts.ask_with_request_id(id, cmd.clone(), rid.clone()).await,
            None => accounts.ask(id, cmd.clone()).await,
        };
        match r {
            Err(e) if tries < 3 && (rid.is_some() || e.processed() == Processed::No) && retryable(&e) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200 << tries)).await;
            }
            r => return r,
        }
    }
}

fn retryable(e: &Error) -> bool {
    !matches!(e, Error::Rejected(_) | Error::RequestExpired(_))
}

#[allow(clippy::too_many_arguments)]
fn operation(
    account: String,
    kind: Kind,
    op: u64,
    amount: i64,
    rid: Option<&RequestId>,
    invoke_us: u64,
    complete_us: u64,
    r: &Result<AccountReply, Error>,
) -> Operation {
    let write = matches!(kind, Kind::Deposit | Kind::Withdraw);
    let (outcome, reply) = match r {
        Ok(r) => (Answer::Ok, Some(r)),
        Err(e) if e.processed() == Processed::No => (Answer::NotApplied, None),
        Err(_) => (Answer::Unknown, None),
    };
    Operation {
        account,
        kind,
        op,
        amount,
        request_id: rid.map(|r| r.key().to_string()),
        invoke_us,
        complete_us,
        outcome,
        applied: reply.filter(|_| write).map(|r| r.applied),
        balance: reply.map(|r| r.balance),
        ops: reply.filter(|_| kind == Kind::Audit).map(|r| r.ops.clone()),
    }
}
