//! One simulated world: real nodes (the public builder, their drivers, hosts, entity tasks and
//! membership providers) on the simulated network, each on a tokio runtime of its own whose
//! clock is paused and moved by the world, all on one thread.
//!
//! Every host's clock reads `origin + OFFSET + world time`: runtimes made later (a restart) are
//! moved forward to it when they start, a paused host's clock jumps by the pause when it wakes.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardline::entity::{EntitySettings, EventSourced, EventSourcedSettings};
use shardline::journal::{InMemoryJournal, Journal};
use shardline::membership::lease::{InMemoryStore, LeaseConfig, Leases};
use shardline::{Cluster, Gossip, GossipConfig};
use shardline_core::SplitBrainPolicy;
use tokio::runtime::Runtime;
use tokio::time::Instant;

use super::faulty::{FaultyJournal, JournalFaults};
use super::net::SimNet;
use super::observed::{record_panics, Decided, UnknownDuplicates, Watched, WatchedHandle, CURRENT, DECIDED, NOW_MS};
use super::schedule::{Fault, Mode, Schedule, ANSWER_WITHIN, HEAL_AT};

/// Each host's runtime runs this long per step.
pub const TICK_MS: u64 = 10;
/// Far enough ahead of any runtime's start that every runtime can be moved forward to it.
const OFFSET: Duration = Duration::from_secs(3600);
/// Shards of the entity type: few, so that every fault moves some that hold entities.
pub const SHARDS: u32 = 16;

/// What runs on the world: the entity type, and the clients that use it.
pub trait Workload: 'static {
    /// The entity type the nodes host (the world runs it [`Watched`]).
    type Entity: EventSourced;

    /// The entity type's settings on every node; the world gives it its journal.
    fn settings(&self, shards: u32) -> EntitySettings;

    /// The entities that must answer after the heal: the clients report each one in
    /// `answered` once it has.
    fn entities(&self) -> Vec<String>;

    /// Starts the clients on the client host (a proxy node, which hosts nothing), whose node
    /// is in `node` while it is up. `origin` is the world's time 0 on that host's clock.
    fn spawn_clients(&self, rt: &Runtime, node: Slot<Self::Entity>, origin: Instant, seed: u64, answered: Answered);
}

/// Entities that answered after the heal, and when (world ms).
pub type Answered = Arc<Mutex<BTreeMap<String, u64>>>;

/// What a run left to check.
pub struct Outcome {
    /// Every command decided, in order.
    pub decided: Vec<Decided>,
    /// The journal every node wrote, as it is after the run.
    pub journal: Arc<InMemoryJournal>,
    /// Entities that did not answer within `ANSWER_WITHIN` of the heal.
    pub unanswered: Vec<String>,
    /// How often an entity's request was refused by the journal as applied already behind its
    /// instance's back (see [`UnknownDuplicates`]).
    pub unknown_duplicates: u64,
    /// The world's own log: faults and restores (when traced).
    pub trace: Vec<String>,
    /// Steps of [`TICK_MS`] the world ran.
    pub steps: u64,
    /// The world's time when it stopped.
    pub end_ms: u64,
}

/// A node and its entity handle, once built.
pub type Slot<E> = Arc<Mutex<Option<(Cluster, WatchedHandle<E>)>>>;

/// One host: a node's runtime, or nothing while it is down.
struct Host<E: EventSourced> {
    name: String,
    ip: IpAddr,
    rt: Option<Runtime>,
    /// The node, once built.
    node: Slot<E>,
    paused_until: Option<u64>,
    down_until: Option<u64>,
}

/// The world of one schedule.
struct World<'w, W: Workload> {
    workload: &'w W,
    sched: Schedule,
    net: SimNet,
    origin: std::time::Instant,
    now_ms: u64,
    hosts: Vec<Host<W::Entity>>,
    journal: Arc<InMemoryJournal>,
    faults: Arc<Mutex<JournalFaults>>,
    store: InMemoryStore,
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

/// Runs one schedule of `workload`.
pub fn run<W: Workload>(sched: Schedule, workload: &W, tracing: bool) -> Outcome {
    record_panics();
    DECIDED.with(|d| d.borrow_mut().clear());
    let watch = UnknownDuplicates::new();
    let _watching = metrics::set_default_local_recorder(&watch);
    let net = SimNet::new(sched.seed.rotate_left(17));
    let journal = Arc::new(InMemoryJournal::new());
    let faults = Arc::new(Mutex::new(JournalFaults::default()));
    let entities = workload.entities();
    let mut w = World {
        workload,
        net,
        origin: std::time::Instant::now(),
        now_ms: 0,
        hosts: Vec::new(),
        journal,
        faults,
        store: InMemoryStore::new(),
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
    let answered: Answered = Arc::default();
    if let Some(rt) = &w.hosts[client].rt {
        let origin = w.target() - Duration::from_millis(w.now_ms);
        workload.spawn_clients(rt, w.hosts[client].node.clone(), origin, w.sched.seed, answered.clone());
    }
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
        if w.now_ms > HEAL_AT && answered.lock().unwrap_or_else(|e| e.into_inner()).len() >= entities.len() {
            break;
        }
    }
    let answered = answered.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let unanswered = entities.into_iter().filter(|a| !answered.contains_key(a)).collect();
    // Stop every node before reading what they left.
    for h in &mut w.hosts {
        if let Some(rt) = h.rt.take() {
            drop(rt);
        }
    }
    Outcome {
        decided: DECIDED.with(|d| d.take()),
        journal: w.journal.clone(),
        unanswered,
        unknown_duplicates: watch.count(),
        trace: w.trace,
        steps,
        end_ms: w.now_ms,
    }
}

impl<W: Workload> World<'_, W> {
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
        let settings = self.workload.settings(SHARDS);
        let store = self.store.clone();
        let journal: Arc<dyn Journal> = Arc::new(FaultyJournal::new(self.journal.clone(), self.faults.clone()));
        let slot = h.node.clone();
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
        CURRENT.with(|c| *c.borrow_mut() = name.clone());
        // The host's software: what `shardline node` does, a node fenced by its membership
        // rejoins as a new incarnation once its old lease has lapsed.
        rt.spawn(async move {
            // After a fence, as `shardline node` does (a first seed then forms no cluster alone).
            let mut rejoining = false;
            loop {
                let mut b = Cluster::builder()
                    .cluster_name("sim")
                    .node_name(name.clone())
                    .bind(bind.clone())
                    .network(network.clone());
                b = match mode {
                    Mode::Leases => b.membership(Leases::new(Arc::new(store.clone()), "sim", LeaseConfig::default())),
                    Mode::Gossip => {
                        // As `shardline node` does: terms start above the journal's fences (a
                        // proxy has no journal).
                        let floor = if proxy { Ok(0) } else { journal.highest_term().await };
                        let floor = match floor {
                            Ok(f) => f,
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot read the journal yet");
                                tokio::time::sleep(Duration::from_secs(1)).await;
                                continue;
                            }
                        };
                        // A 2 s window (the partition tests' too): a paused member's shards are
                        // taken over about 15 s into its pause, which a schedule has time for.
                        let g = Gossip::new([seed.clone()])
                            .with_config(GossipConfig::with_split_brain(SplitBrainPolicy::KeepMajority, 2_000))
                            .term_floor(floor);
                        b.membership(if rejoining { g.rejoining() } else { g })
                    }
                };
                if proxy {
                    b = b.proxy();
                }
                // As `shardline node` does: a node that cannot join yet (the coordination store
                // is down) tries again a second later.
                let node = match b.build().await {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot join yet");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                let mut settings = settings.clone();
                if !proxy {
                    settings = settings.journal(journal.clone());
                }
                let handle = match node
                    .register_event_sourced::<Watched<W::Entity>>(settings, EventSourcedSettings::default())
                    .await
                {
                    Ok(h) => h,
                    Err(e) => panic!("{name}: the entity type is not registered: {e}"),
                };
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((node.clone(), handle));
                let _ = node.downed().await;
                rejoining = true;
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
}
