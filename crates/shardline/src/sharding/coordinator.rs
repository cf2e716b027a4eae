//! The coordinator of one type while this node leads: what the commands of the core's
//! `CoordinatorEngine` do, on the shared driver; it stops the moment leadership is lost.
//!
//! With a lease provider the engine first asks for the stored shard map (`LoadShardMap`) and
//! resumes from it; every map it hands out (`PersistShardMap`) goes to a writer task that stores
//! the newest (see [`ShardMaps`]). Both report back to the engine, which decides what an outcome
//! means: this file only carries the store calls out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use shardline_core::{
    AllocationStrategy, ClusterReadModel, ConsistentHash, CoordinatorCommand, CoordinatorConfig, CoordinatorEngine,
    DomainEvent, External, LeastShards, MapLoadError, MapWriteError, MembershipView, NodeId, Ranges, RebalancingStatus,
    RoundLimit, ShardId, ShardMap, Term, ToCoordinator, TypeKey, VersionAware,
};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::settings::{EntitySettings, StrategyKind};
use crate::driver::shared::{Carrier, Shared};
use crate::membership::lease::{MapStoreError, Revision, ShardMaps};
use crate::sharding::message::PeerMessage;
use crate::sharding::node::Node;

pub(crate) struct Coordinator {
    pub type_key: TypeKey,
    pub term: Term,
    /// The engine (None when it could not be built, logged at start).
    driver: Shared<Coordinator>,
    node: Node,
    stopped: AtomicBool,
    /// Where the type's map is stored, with the key's revision as this coordinator last saw it.
    store: Option<MapStore>,
    /// The events this coordinator emitted, folded (the admin API's rebalancing status).
    read: Mutex<ClusterReadModel>,
}

/// What the coordinator's lock guards.
pub(crate) struct State {
    engine: Option<Box<CoordinatorEngine>>,
    /// The events the input's commands emitted, relayed once they are all carried out.
    events: Vec<DomainEvent>,
}

/// A map to write, with its version.
type ToWrite = Option<(u64, ShardMap)>;

struct MapStore {
    maps: ShardMaps,
    /// The newest map to write; the writer task takes the newest.
    write: watch::Sender<ToWrite>,
    /// Its receiver, until the writer task takes it (once the map is loaded).
    written: Mutex<Option<watch::Receiver<ToWrite>>>,
    /// How long one store call may take ([`CoordinatorConfig::store_call_limit_ms`]).
    limit: Duration,
}

fn strategy(kind: &StrategyKind, limit: Option<RoundLimit>) -> Box<dyn AllocationStrategy> {
    match kind {
        StrategyKind::LeastShards => Box::new(LeastShards { limit: limit.unwrap_or_default() }),
        StrategyKind::VersionAware => Box::new(VersionAware { limit: limit.unwrap_or_default() }),
        StrategyKind::ConsistentHash => {
            Box::new(ConsistentHash { limit: limit.unwrap_or(RoundLimit::UNLIMITED), ..ConsistentHash::default() })
        }
        StrategyKind::Ranges => Box::new(Ranges { limit: limit.unwrap_or(RoundLimit::UNLIMITED) }),
        StrategyKind::External => Box::new(
            External::new(std::iter::empty::<(ShardId, String)>())
                .otherwise(LeastShards { limit: limit.unwrap_or_default() }),
        ),
    }
}

impl Coordinator {
    /// Starts the coordinator of `settings.type_key` for `term`. With a map store its engine
    /// first reads the stored map and resumes from it.
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
        let strategy = strategy(&settings.strategy, settings.rebalance_limit);
        let limit = Duration::from_millis(config.store_call_limit_ms);
        let me = node.id().clone();
        let engine = match &maps {
            Some(_) => CoordinatorEngine::loading(config, me, term, strategy, view.clone()),
            None => CoordinatorEngine::new(config, me, term, strategy, view.clone(), None, node.now_ms()),
        };
        let engine = match engine {
            Ok(e) => Some(Box::new(e)),
            Err(e) => {
                warn!(type_key = %settings.type_key, error = %e, "cannot start coordinator");
                None
            }
        };
        let store = maps.map(|maps| {
            let (write, written) = watch::channel(None);
            MapStore { maps, write, written: Mutex::new(Some(written)), limit }
        });
        let c = Arc::new(Coordinator {
            type_key: TypeKey::new(&settings.type_key),
            term,
            driver: Shared::new(State { engine, events: Vec::new() }),
            node,
            stopped: AtomicBool::new(false),
            store,
            read: Mutex::new(ClusterReadModel::default()),
        });
        info!(type_key = %c.type_key, term, "coordinator started");
        c.input(|_, _| {});
        Shared::start(&c);
        c
    }

    /// Runs one input through the engine; nothing when the engine is not running.
    fn input<R>(self: &Arc<Self>, f: impl FnOnce(&mut CoordinatorEngine, u64) -> R) -> Option<R> {
        let input = |st: &mut State, now| {
            let engine = st.engine.as_mut()?;
            engine.apply_held_view(now);
            Some(f(engine, now))
        };
        self.driver.input(self, input).and_then(|(r, ())| r)
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

    /// New external assignments (shard number, node name), on top of those given before. The
    /// engine checks them all and takes none when one is wrong.
    pub fn assign(self: &Arc<Self>, assignments: &[(u32, String)]) -> Result<(), String> {
        let assignments: Vec<(ShardId, String)> = assignments.iter().map(|(s, n)| (ShardId(*s), n.clone())).collect();
        let taken = self
            .input(|e, now| e.handle_assignments(now, &assignments).map_err(|e| e.to_string()))
            .unwrap_or_else(|| Err("the coordinator is not running".to_string()));
        if taken.is_ok() {
            info!(type_key = %self.type_key, assignments = assignments.len(), "external assignments");
        }
        taken
    }

    /// An operator asked for a rebalance: plan now.
    pub fn request_rebalance(self: &Arc<Self>) {
        self.input(|e, now| e.handle_rebalance_request(now));
    }

    pub fn on_frame(self: &Arc<Self>, from: &NodeId, msg: ToCoordinator) {
        self.input(|e, now| e.handle_message(now, from, msg));
    }

    pub fn on_membership(self: &Arc<Self>, view: &MembershipView) {
        if !self.node.may_host() {
            // Not an input (it would decide nothing now): the engine keeps it for the next one.
            if let Some(engine) = self.driver.lock().engine.as_mut() {
                engine.hold_view(view);
            }
            return;
        }
        self.input(|e, now| e.handle_membership(now, view));
    }

    pub fn stop(self: &Arc<Self>) {
        self.input(|e, now| e.handle_leadership_lost(now));
        self.stopped.store(true, Ordering::Release);
        self.driver.poke();
        info!(type_key = %self.type_key, term = self.term, "coordinator stopped");
    }

    /// Shards per owner, as this coordinator knows them (None before the stored map is read).
    pub fn map(&self) -> Option<ShardMap> {
        self.driver.lock().engine.as_ref().filter(|e| !e.is_loading()).map(|e| e.shard_map().clone())
    }
}

impl Carrier for Coordinator {
    type Engine = CoordinatorEngine;
    type State = State;
    type Settled = ();

    fn shared(&self) -> &Shared<Self> {
        &self.driver
    }
    fn engine(state: &mut State) -> Option<&mut CoordinatorEngine> {
        state.engine.as_deref_mut()
    }
    fn now_ms(&self) -> u64 {
        self.node.now_ms()
    }
    /// A coordinator whose node's lease ran out must not decide anything: a newer leader may
    /// already run.
    fn accepts_input(&self) -> bool {
        !self.stopped.load(Ordering::Acquire) && self.node.may_host()
    }
    fn carry_out(self: &Arc<Self>, st: &mut State, command: CoordinatorCommand, _now: u64) {
        match command {
            CoordinatorCommand::Emit(e) => {
                self.node.publish(&self.type_key, e.clone());
                st.events.push(e);
            }
            CoordinatorCommand::LoadShardMap => {
                if let Some(store) = &self.store {
                    tokio::spawn(load(Arc::downgrade(self), store.maps.clone()));
                }
            }
            CoordinatorCommand::PersistShardMap { version, map, .. } => {
                if let Some(store) = &self.store {
                    store.write.send_replace(Some((version, map)));
                }
            }
            c => {
                let Some(term) = st.engine.as_ref().map(|e| e.term()) else { return };
                for (to, msg) in c.messages(term) {
                    let _ =
                        self.node.transport().send(&to, PeerMessage::ToRegion { type_key: self.type_key.clone(), msg });
                }
            }
        }
    }
    fn settle(self: &Arc<Self>, st: &mut State, _now: u64) {
        let Some(engine) = st.engine.as_ref() else { return };
        if !st.events.is_empty() {
            let events = std::mem::take(&mut st.events);
            self.relay(engine.view(), &events);
        }
        if engine.is_stopped() {
            self.stopped.store(true, Ordering::Release);
            self.driver.poke();
        }
    }
    fn finished(&self) -> bool {
        self.stopped.load(Ordering::Acquire) || self.driver.lock().engine.is_none()
    }
}

/// Reads the stored map for the engine (`LoadShardMap`). Once it is read, the writer task starts.
async fn load(c: Weak<Coordinator>, maps: ShardMaps) {
    let Some((type_key, limit)) = c.upgrade().and_then(|co| Some((co.type_key.to_string(), co.store.as_ref()?.limit)))
    else {
        return;
    };
    let loaded = match tokio::time::timeout(limit, maps.load(&type_key)).await {
        Ok(Ok(loaded)) => {
            if let Some(l) = &loaded {
                info!(%type_key, term = l.term, version = l.map.version(), shards = l.map.num_shards(),
                    "resuming from the stored shard map");
            }
            Ok(loaded)
        }
        Ok(Err(MapStoreError::Corrupt { reason, .. })) => {
            warn!(%type_key, %reason, "stored shard map is unreadable: starting over");
            Err(MapLoadError::Unreadable { reason })
        }
        Ok(Err(e)) => {
            warn!(%type_key, error = %e, "cannot read the stored shard map; retrying");
            Err(MapLoadError::Unavailable { reason: e.to_string() })
        }
        Err(_) => {
            warn!(%type_key, "reading the stored shard map timed out; retrying");
            Err(MapLoadError::Unavailable { reason: "timed out".into() })
        }
    };
    let Some(co) = c.upgrade() else { return };
    let Some(store) = &co.store else { return };
    // The map is read, or will be started over: from now on the engine writes it. (An
    // unreadable key's revision is learnt from the first write's conflict.)
    if !matches!(loaded, Err(MapLoadError::Unavailable { .. })) {
        let revision = match &loaded {
            Ok(Some(l)) => l.revision,
            _ => 0,
        };
        if let Some(written) = store.written.lock().unwrap_or_else(|e| e.into_inner()).take() {
            tokio::spawn(write(Arc::downgrade(&co), maps, written, revision, limit));
        }
    }
    co.input(|e, now| e.handle_map_loaded(now, loaded.map(|l| l.map(|l| l.map))));
}

/// Stores the newest map the engine hands out (`PersistShardMap`), and tells it the outcome.
/// `revision`: the key's, as this coordinator last saw it (the next compare-and-set's).
async fn write(
    c: Weak<Coordinator>,
    maps: ShardMaps,
    mut written: watch::Receiver<ToWrite>,
    mut revision: Revision,
    limit: Duration,
) {
    while written.changed().await.is_ok() {
        let Some((version, map)) = written.borrow_and_update().clone() else { continue };
        let Some(co) = c.upgrade() else { return };
        // A coordinator that stopped (lost its leadership, deposed) writes nothing more.
        if co.stopped.load(Ordering::Acquire) {
            return;
        }
        let (type_key, term) = (co.type_key.to_string(), co.term);
        drop(co);
        let outcome = match tokio::time::timeout(limit, maps.save(&type_key, term, &map, revision)).await {
            Ok(Ok(stored_at)) => {
                debug!(%type_key, version, "shard map stored");
                revision = stored_at;
                Ok(())
            }
            Ok(Err(MapStoreError::Conflict { stored, revision: now_at, .. })) => {
                warn!(%type_key, ?stored, "the stored shard map changed meanwhile");
                revision = now_at;
                Err(MapWriteError::Conflict { term: stored })
            }
            Ok(Err(e)) => {
                warn!(%type_key, error = %e, "cannot store the shard map; retrying");
                Err(MapWriteError::Unavailable { reason: e.to_string() })
            }
            Err(_) => {
                warn!(%type_key, "storing the shard map timed out; retrying");
                Err(MapWriteError::Unavailable { reason: "timed out".into() })
            }
        };
        let Some(co) = c.upgrade() else { return };
        co.input(|e, now| e.handle_map_stored(now, version, outcome));
    }
}
