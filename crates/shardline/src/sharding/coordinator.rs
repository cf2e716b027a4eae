//! The coordinator driver: runs the core's `CoordinatorEngine` for one type while this node
//! leads, with one timer task; stops the moment leadership is lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardline_core::{
    AllocationStrategy, ConsistentHash, CoordinatorCommand, CoordinatorConfig, CoordinatorEngine, LeastShards,
    MembershipView, NodeId, Ranges, Term, ToCoordinator, TypeKey, VersionAware,
};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::cluster::Cluster;
use crate::entity::{EntitySettings, StrategyKind};
use crate::transport::Frame;

pub(crate) struct Coordinator {
    pub type_key: TypeKey,
    pub term: Term,
    engine: Mutex<(CoordinatorEngine, Option<u64>)>,
    cluster: Cluster,
    wake: Arc<Notify>,
    stopped: AtomicBool,
}

fn strategy(kind: &StrategyKind) -> Box<dyn AllocationStrategy> {
    match kind {
        StrategyKind::LeastShards { absolute_limit, relative_limit } => {
            Box::new(LeastShards { absolute_limit: *absolute_limit, relative_limit: *relative_limit })
        }
        StrategyKind::VersionAware => Box::new(VersionAware),
        StrategyKind::ConsistentHash => Box::new(ConsistentHash::default()),
        StrategyKind::Ranges => Box::new(Ranges),
    }
}

impl Coordinator {
    pub fn start(cluster: Cluster, settings: &EntitySettings, term: Term, view: &MembershipView) -> Option<Arc<Self>> {
        let mut cfg = CoordinatorConfig::new(settings.shards);
        cfg.hand_off_timeout_ms = settings.hand_off_timeout.as_millis() as u64;
        cfg.rebalance_interval_ms = settings.rebalance_interval.as_millis() as u64;
        cfg.resend_interval_ms = 500;
        let now = cluster.now_ms();
        let engine = match CoordinatorEngine::new(
            cfg,
            cluster.node_id().clone(),
            term,
            strategy(&settings.strategy),
            view.clone(),
            None,
            now,
        ) {
            Ok(e) => e,
            Err(e) => {
                warn!(error = %e, "cannot start coordinator");
                return None;
            }
        };
        info!(type_key = %settings.type_key, term, "coordinator started");
        let c = Arc::new(Coordinator {
            type_key: TypeKey::new(&settings.type_key),
            term,
            engine: Mutex::new((engine, None)),
            cluster,
            wake: Arc::new(Notify::new()),
            stopped: AtomicBool::new(false),
        });
        c.input(|_, _| {});
        tokio::spawn(timer(Arc::downgrade(&c)));
        Some(c)
    }

    fn input(&self, f: impl FnOnce(&mut CoordinatorEngine, u64)) {
        if self.stopped.load(Ordering::Acquire) {
            return;
        }
        let now = self.cluster.now_ms();
        let mut st = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut st.0, now);
        let term = st.0.term();
        let cmds: Vec<CoordinatorCommand> = st.0.drain_commands().collect();
        for c in cmds {
            match &c {
                CoordinatorCommand::Emit(e) => self.cluster.publish(&self.type_key, e.clone()),
                CoordinatorCommand::PersistShardMap { .. } => {}
                _ => {
                    for (to, msg) in c.messages(term) {
                        let _ = self
                            .cluster
                            .transport()
                            .send(&to, Frame::ToRegion { type_key: self.type_key.clone(), msg });
                    }
                }
            }
        }
        let next = st.0.poll_timeout();
        if next.is_some_and(|t| st.1.is_none_or(|cur| t < cur)) {
            st.1 = next;
            self.wake.notify_one();
        }
    }

    pub fn on_frame(&self, from: &NodeId, msg: ToCoordinator) {
        self.input(|e, now| match msg {
            ToCoordinator::Register { term, hosted, hosting } => e.handle_register(now, from, term, &hosted, hosting),
            ToCoordinator::GetShardHome { shard } => e.handle_get_shard_home(now, from, shard),
            ToCoordinator::BeginHandOffAck { term, shard } => e.handle_begin_hand_off_ack(now, from, term, shard),
            ToCoordinator::ShardStopped { shard, epoch, handover, .. } => {
                e.handle_shard_stopped(now, from, shard, epoch, handover)
            }
        });
    }

    pub fn on_membership(&self, view: &MembershipView) {
        self.input(|e, now| e.handle_membership(now, view));
    }

    pub fn stop(&self) {
        self.input(|e, now| e.handle_leadership_lost(now));
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
        info!(type_key = %self.type_key, term = self.term, "coordinator stopped");
    }

    /// Shards per owner, as this coordinator knows them.
    pub fn map(&self) -> shardline_core::ShardMap {
        self.engine.lock().unwrap_or_else(|e| e.into_inner()).0.shard_map().clone()
    }
}

async fn timer(c: std::sync::Weak<Coordinator>) {
    loop {
        let Some(co) = c.upgrade() else { return };
        if co.stopped.load(Ordering::Acquire) {
            return;
        }
        let at = co.engine.lock().unwrap_or_else(|e| e.into_inner()).1;
        let now = co.cluster.now_ms();
        let sleep = match at {
            Some(t) if t <= now => Duration::ZERO,
            Some(t) => Duration::from_millis(t - now),
            None => Duration::from_secs(1),
        };
        if !sleep.is_zero() {
            let wake = co.wake.clone();
            drop(co);
            let notified = wake.notified();
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = notified => continue,
            }
        }
        let Some(co) = c.upgrade() else { return };
        co.engine.lock().unwrap_or_else(|e| e.into_inner()).1 = None;
        co.input(|e, now| e.handle_timeout(now));
    }
}
