//! The coordinator driver: runs the core's `CoordinatorEngine` for one type while this node
//! leads, with one timer task; stops the moment leadership is lost.
//!
//! With a lease provider the coordinator first reads the stored shard map and resumes from it;
//! then a writer task stores the newest map the engine hands out (see [`ShardMaps`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use shardline_core::{
    AllocationStrategy, ClusterReadModel, ConsistentHash, CoordinatorCommand, CoordinatorConfig, CoordinatorEngine,
    External, LeastShards, MembershipView, NodeId, Ranges, RebalancingStatus, RoundLimit, ShardId, ShardMap, Term,
    ToCoordinator, TypeKey, VersionAware,
};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::settings::{EntitySettings, StrategyKind};
use crate::membership::lease::{MapStoreError, ShardMaps};
use crate::sharding::message::PeerMessage;
use crate::sharding::node::Node;
use crate::sharding::wakeup::{self, Timed, Wakeup};

pub(crate) struct Coordinator {
    pub type_key: TypeKey,
    pub term: Term,
    engine: Mutex<Slot>,
    node: Node,
    wakeup: Wakeup,
    stopped: AtomicBool,
    /// The newest map to store (providers with a store); a writer task stores it.
    persist: Option<watch::Sender<Option<ShardMap>>>,
    /// The events this coordinator emitted, folded (the admin API's rebalancing status).
    read: Mutex<ClusterReadModel>,
    /// The assignments given so far, for a type with the `External` strategy.
    external: Option<Mutex<External>>,
    /// The newest view that arrived while this node could not host (gossip's bound held it):
    /// handled first once it can, or the coordinator would act on the view before it.
    missed_view: Mutex<Option<MembershipView>>,
}

enum Slot {
    /// Reading the stored map; the latest membership view waits here.
    Loading { view: MembershipView, config: CoordinatorConfig, strategy: Box<dyn AllocationStrategy> },
    /// Running.
    Running { engine: Box<CoordinatorEngine> },
    /// Could not start.
    Failed,
}

fn strategy(kind: &StrategyKind, limit: Option<RoundLimit>) -> Box<dyn AllocationStrategy> {
    match kind {
        StrategyKind::LeastShards => Box::new(LeastShards { limit: limit.unwrap_or_default() }),
        StrategyKind::VersionAware => Box::new(VersionAware { limit: limit.unwrap_or_default() }),
        StrategyKind::ConsistentHash => {
            Box::new(ConsistentHash { limit: limit.unwrap_or(RoundLimit::UNLIMITED), ..ConsistentHash::default() })
        }
        StrategyKind::Ranges => Box::new(Ranges { limit: limit.unwrap_or(RoundLimit::UNLIMITED) }),
        StrategyKind::External => Box::new(external(limit)),
    }
}

fn external(limit: Option<RoundLimit>) -> External {
    External::new(std::iter::empty::<(ShardId, String)>()).otherwise(LeastShards { limit: limit.unwrap_or_default() })
}

impl Coordinator {
    /// Starts the coordinator of `settings.type_key` for `term`. With a map store it first reads
    /// the stored map (retrying while this node leads) and resumes from it.
    pub fn start(
        node: Node,
        settings: &EntitySettings,
        term: Term,
        view: &MembershipView,
        maps: Option<ShardMaps>,
    ) -> Arc<Self> {
        let mut config = CoordinatorConfig::new(settings.shards);
        config.hand_off_timeout_ms = settings.hand_off_timeout.as_millis() as u64;
        config.rebalance_interval_ms = settings.rebalance_interval.as_millis() as u64;
        config.resend_interval_ms = 500;
        let (persist, written) = match &maps {
            Some(_) => {
                let (tx, rx) = watch::channel(None);
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        let c = Arc::new(Coordinator {
            type_key: TypeKey::new(&settings.type_key),
            term,
            engine: Mutex::new(Slot::Loading {
                view: view.clone(),
                config,
                strategy: strategy(&settings.strategy, settings.rebalance_limit),
            }),
            node,
            wakeup: Wakeup::default(),
            stopped: AtomicBool::new(false),
            persist,
            read: Mutex::new(ClusterReadModel::default()),
            external: (settings.strategy == StrategyKind::External)
                .then(|| Mutex::new(external(settings.rebalance_limit))),
            missed_view: Mutex::new(None),
        });
        match (maps, written) {
            (Some(maps), Some(written)) => {
                tokio::spawn(load_then_run(Arc::downgrade(&c), maps, written));
            }
            _ => c.run(None),
        }
        c
    }

    /// Leaves `Loading`: builds the engine (on the stored map, if any) and starts the timer.
    fn run(self: &Arc<Self>, stored: Option<ShardMap>) {
        {
            let mut slot = self.engine.lock().unwrap_or_else(|e| e.into_inner());
            let (view, config, strategy) = match std::mem::replace(&mut *slot, Slot::Failed) {
                Slot::Loading { view, config, strategy } => (view, config, strategy),
                other => {
                    *slot = other;
                    return;
                }
            };
            let now = self.node.now_ms();
            match CoordinatorEngine::new(config, self.node.id().clone(), self.term, strategy, view, stored, now) {
                Ok(engine) => *slot = Slot::Running { engine: Box::new(engine) },
                Err(e) => {
                    warn!(type_key = %self.type_key, error = %e, "cannot start coordinator");
                    return;
                }
            }
        }
        info!(type_key = %self.type_key, term = self.term, "coordinator started");
        self.input(|_, _| {});
        tokio::spawn(wakeup::run(Arc::downgrade(self)));
    }

    fn input(&self, f: impl FnOnce(&mut CoordinatorEngine, u64)) {
        // A coordinator whose node's lease ran out must not decide anything: a newer leader may
        // already run.
        if self.stopped.load(Ordering::Acquire) || !self.node.may_host() {
            return;
        }
        let now = self.node.now_ms();
        let mut slot = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        let Slot::Running { engine } = &mut *slot else { return };
        if let Some(view) = self.missed_view.lock().unwrap_or_else(|e| e.into_inner()).take() {
            engine.handle_membership(now, &view);
        }
        f(engine, now);
        let term = engine.term();
        let cmds: Vec<CoordinatorCommand> = engine.drain_commands().collect();
        let mut events = Vec::new();
        for c in cmds {
            match &c {
                CoordinatorCommand::Emit(e) => {
                    self.node.publish(&self.type_key, e.clone());
                    events.push(e.clone());
                }
                CoordinatorCommand::PersistShardMap { .. } => {
                    if let Some(tx) = &self.persist {
                        tx.send_replace(Some(engine.shard_map().clone()));
                    }
                }
                _ => {
                    for (to, msg) in c.messages(term) {
                        let _ = self
                            .node
                            .transport()
                            .send(&to, PeerMessage::ToRegion { type_key: self.type_key.clone(), msg });
                    }
                }
            }
        }
        if !events.is_empty() {
            self.relay(engine.view(), &events);
        }
        self.wakeup.request(engine.poll_timeout());
    }

    /// Folds `events` into the status and sends them, in one frame per member, to every other
    /// member that is not fenced: every node's event stream then tells the whole cluster's story,
    /// whichever node leads. Lossy like the stream itself: a member whose queue is full misses
    /// them (counted), and reads the state again from the API.
    fn relay(&self, view: &MembershipView, events: &[shardline_core::DomainEvent]) {
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        for e in events {
            read.apply(e);
        }
        drop(read);
        for m in view.members() {
            if &m.node == self.node.id() || m.status.is_fenced() {
                continue;
            }
            let msg = PeerMessage::Events { type_key: self.type_key.clone(), events: events.to_vec() };
            if self.node.transport().send(&m.node, msg).is_err() {
                metrics::counter!("shardline_events_unrelayed_total").increment(1);
            }
        }
    }

    /// The running (or last) rebalance round, as this coordinator's events tell it.
    pub fn rebalancing(&self) -> RebalancingStatus {
        self.read.lock().unwrap_or_else(|e| e.into_inner()).rebalancing().clone()
    }

    /// New external assignments (shard number, node name), on top of those given before, once
    /// the engine has checked them all (`CoordinatorEngine::check_assignments`): none is taken
    /// when one is wrong. Planned at once; shards move by the usual hand-off.
    pub fn assign(&self, assignments: &[(u32, String)]) -> Result<(), String> {
        let Some(external) = &self.external else {
            return Err(format!("entity type {} does not use the External strategy", self.type_key));
        };
        let assignments: Vec<(ShardId, String)> = assignments.iter().map(|(s, n)| (ShardId(*s), n.clone())).collect();
        let mut checked = Err("the coordinator is not running".to_string());
        self.input(|e, now| {
            if let Err((shard, problem)) = e.check_assignments(&assignments) {
                checked = Err(format!("{shard}: {problem}"));
                return;
            }
            let mut ext = external.lock().unwrap_or_else(|p| p.into_inner());
            for (shard, node) in &assignments {
                ext.assign(*shard, node.clone());
            }
            info!(type_key = %self.type_key, assignments = assignments.len(), "external assignments");
            e.replace_strategy(now, Box::new(ext.clone()));
            checked = Ok(());
        });
        checked
    }

    /// An operator asked for a rebalance: plan now.
    pub fn request_rebalance(&self) {
        self.input(|e, now| e.handle_rebalance_request(now));
    }

    pub fn on_frame(&self, from: &NodeId, msg: ToCoordinator) {
        self.input(|e, now| e.handle_message(now, from, msg));
    }

    pub fn on_membership(&self, view: &MembershipView) {
        if let Slot::Loading { view: v, .. } = &mut *self.engine.lock().unwrap_or_else(|e| e.into_inner()) {
            *v = view.clone();
            return;
        }
        if !self.node.may_host() {
            *self.missed_view.lock().unwrap_or_else(|e| e.into_inner()) = Some(view.clone());
            return;
        }
        self.input(|e, now| e.handle_membership(now, view));
    }

    /// A newer term wrote the shard map: the engine steps down, and so does this driver.
    fn deposed(&self, by: Term) {
        self.input(|e, now| e.handle_map_write_refused(now, by));
        self.stopped.store(true, Ordering::Release);
        self.wakeup.poke();
    }

    pub fn stop(&self) {
        self.input(|e, now| e.handle_leadership_lost(now));
        self.stopped.store(true, Ordering::Release);
        self.wakeup.poke();
        info!(type_key = %self.type_key, term = self.term, "coordinator stopped");
    }

    /// Shards per owner, as this coordinator knows them.
    pub fn map(&self) -> Option<ShardMap> {
        match &*self.engine.lock().unwrap_or_else(|e| e.into_inner()) {
            Slot::Running { engine } => Some(engine.shard_map().clone()),
            _ => None,
        }
    }
}

impl Timed for Coordinator {
    fn wakeup(&self) -> &Wakeup {
        &self.wakeup
    }
    fn now_ms(&self) -> u64 {
        self.node.now_ms()
    }
    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
            || !matches!(&*self.engine.lock().unwrap_or_else(|e| e.into_inner()), Slot::Running { .. })
    }
    fn fire(self: &Arc<Self>) {
        self.input(|e, now| e.handle_timeout(now));
    }
}

/// How long one store call of the coordinator may take.
const STORE_CALL_LIMIT: Duration = Duration::from_secs(3);

/// Reads the stored map (retrying while the coordinator runs), starts the engine on it, then
/// stores every new map the engine hands out, newest first.
async fn load_then_run(c: Weak<Coordinator>, maps: ShardMaps, mut written: watch::Receiver<Option<ShardMap>>) {
    let type_key = match c.upgrade() {
        Some(co) => co.type_key.to_string(),
        None => return,
    };
    let mut revision = loop {
        let r = tokio::time::timeout(STORE_CALL_LIMIT, maps.load(&type_key)).await;
        let Some(co) = c.upgrade() else { return };
        if co.stopped.load(Ordering::Acquire) {
            return;
        }
        match r {
            Ok(Ok(loaded)) => {
                // The engine decides what to take from it (a map of another shard count: nothing).
                let revision = loaded.as_ref().map_or(0, |l| l.revision);
                if let Some(l) = &loaded {
                    info!(%type_key, term = l.term, version = l.map.version(), shards = l.map.num_shards(),
                        "resuming from the stored shard map");
                }
                co.run(loaded.map(|l| l.map));
                break revision;
            }
            Ok(Err(MapStoreError::Corrupt { reason, .. })) => {
                warn!(%type_key, %reason, "stored shard map is unreadable: starting over");
                co.run(None);
                break 0;
            }
            Ok(Err(e)) => warn!(%type_key, error = %e, "cannot read the stored shard map; retrying"),
            Err(_) => warn!(%type_key, "reading the stored shard map timed out; retrying"),
        }
        drop(co);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut retry = false;
    loop {
        if !retry && written.changed().await.is_err() {
            return;
        }
        let Some(map) = written.borrow_and_update().clone() else { continue };
        let Some(co) = c.upgrade() else { return };
        if co.stopped.load(Ordering::Acquire) {
            return;
        }
        let term = co.term;
        drop(co);
        match tokio::time::timeout(STORE_CALL_LIMIT, maps.save(&type_key, term, &map, revision)).await {
            Ok(Ok(r)) => {
                revision = r;
                retry = false;
                debug!(%type_key, version = map.version(), "shard map stored");
            }
            Ok(Err(e @ MapStoreError::Deposed { stored, .. })) => {
                warn!(%type_key, error = %e, "deposed: a newer coordinator wrote the shard map; stepping down");
                if let Some(co) = c.upgrade() {
                    co.deposed(stored);
                }
                return;
            }
            Ok(Err(e)) => {
                warn!(%type_key, error = %e, "cannot store the shard map; retrying");
                retry = true;
            }
            Err(_) => {
                warn!(%type_key, "storing the shard map timed out; retrying");
                retry = true;
            }
        }
        if retry {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
