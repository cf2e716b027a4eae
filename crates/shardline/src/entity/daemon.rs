//! Sharded daemon processes (Akka's `ShardedDaemonProcess`): `n` long-running workers, one per
//! index, kept alive somewhere in the cluster: one per partition of a Kafka topic, one per
//! projection. See [`Cluster::daemon`](crate::Cluster::daemon).
//!
//! Each worker is an entity of the daemon's own type, id `"0"` … `"n-1"`. The type has one shard
//! per worker of the count it was registered with, and worker `i` lives in shard `i` (modulo
//! that count, once it grew past it): the coordinator spreads the workers as it spreads shards,
//! and I1 (one owner per shard) is what keeps two workers of one index from running at once. The worker's future runs
//! while its entity does; the entity stops it when its shard moves or its node leaves (the stop
//! waits for the future, up to a grace period, before the shard is handed off), and aborts it
//! when the node loses its shards at once (fenced, crashed).
//!
//! An entity starts on its first message: every node of the daemon's type sends each worker
//! a keep-alive once per [`KEEP_ALIVE`], so a worker whose node died starts on the shard's new
//! owner, and a worker whose future ended starts again. The keep-alive carries the worker count,
//! so a worker at or past a new, smaller count stops itself.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline_core::{EntityId, ShardId};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::sharding::entity::{Entity, EntityContext};

/// How often each node tells every worker to be alive.
pub const KEEP_ALIVE: Duration = Duration::from_secs(1);
/// How long a worker's future has to end once it is told to stop, before it is aborted.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// The most workers one daemon may have.
pub const MAX_WORKERS: u32 = 1_024;

/// What a worker gets: its index, and the signal to stop.
pub struct DaemonContext {
    index: u32,
    stop: watch::Receiver<bool>,
}

impl DaemonContext {
    /// This worker's index, from 0.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Whether the worker was told to stop (its shard moves, its node leaves, the count shrank).
    pub fn is_stopping(&self) -> bool {
        // A closed channel: the worker's entity is gone.
        *self.stop.borrow() || self.stop.has_changed().is_err()
    }

    /// Resolves once the worker is told to stop; it should then finish within [`STOP_GRACE`].
    pub async fn stopping(&mut self) {
        // An error means the entity is gone: stopping too.
        let _ = self.stop.wait_for(|s| *s).await;
    }
}

/// A daemon's worker function, as the node keeps it.
pub(crate) type WorkerFn = Arc<dyn Fn(u32, DaemonContext) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// What the node keeps for a daemon's type: the worker function.
pub(crate) struct Worker(pub(crate) WorkerFn);

/// The keep-alive, with the daemon's worker count as the sender knows it.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeepAlive {
    count: u32,
}

/// The entity that runs one worker.
pub struct DaemonWorker {
    stop: Option<watch::Sender<bool>>,
    task: Option<JoinHandle<()>>,
}

impl Entity for DaemonWorker {
    type Message = KeepAlive;
    type Reply = ();

    fn new(_id: &EntityId) -> Self {
        DaemonWorker { stop: None, task: None }
    }

    async fn handle(&mut self, ctx: &mut EntityContext, msg: KeepAlive) {
        let Ok(index) = ctx.id().as_str().parse::<u32>() else {
            tracing::warn!(daemon = ctx.type_key(), id = ctx.id().as_str(), "not a worker index: stopped");
            ctx.passivate();
            return;
        };
        if index >= msg.count {
            // The daemon was scaled down past this worker.
            ctx.passivate();
            return;
        }
        if self.task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let worker = ctx.registry.extension(ctx.type_key()).and_then(downcast);
        let Some(worker) = worker else {
            tracing::warn!(daemon = ctx.type_key(), "no worker registered for this daemon on this node");
            return;
        };
        let (tx, rx) = watch::channel(false);
        tracing::debug!(daemon = ctx.type_key(), index, "daemon worker started");
        self.task = Some(tokio::spawn((worker.0)(index, DaemonContext { index, stop: rx })));
        self.stop = Some(tx);
    }

    async fn stopped(&mut self, ctx: &mut EntityContext) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
                tracing::warn!(
                    daemon = ctx.type_key(),
                    id = ctx.id().as_str(),
                    "daemon worker ignored its stop: aborted"
                );
                task.abort();
            }
        }
    }
}

impl Drop for DaemonWorker {
    /// The entity was dropped without its stop hook (its shard was killed: the node was fenced
    /// or crashed): the worker must not outlive it, or it would run beside its next owner's.
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn downcast(w: Arc<dyn Any + Send + Sync>) -> Option<Arc<Worker>> {
    w.downcast::<Worker>().ok()
}

/// Worker `id`'s shard among `shards`: its index (ids that are not an index go to shard 0, and
/// stop there).
pub(crate) fn shard_of_worker(id: &str, shards: u32) -> ShardId {
    ShardId(id.parse::<u32>().map_or(0, |i| i % shards.max(1)))
}

/// A daemon's handle: its worker count, which may change at run time.
#[derive(Clone)]
pub struct DaemonHandle {
    pub(crate) name: String,
    pub(crate) count: Arc<AtomicU32>,
    /// The highest count this node has kept alive: workers up to it are told the count, so that
    /// those past a smaller one stop.
    pub(crate) ceiling: Arc<AtomicU32>,
    pub(crate) workers: crate::EntityHandle<DaemonWorker>,
}

impl DaemonHandle {
    /// The daemon's name (its entity type is `daemon-NAME`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The worker count this node keeps alive.
    pub fn workers(&self) -> u32 {
        self.count.load(Ordering::Relaxed)
    }

    /// Changes the worker count: new workers start at the next keep-alive; workers at or past
    /// the new count stop when it reaches them. Set it on every node of the daemon (each keeps
    /// its own count alive), e.g. from the same configuration. At most [`MAX_WORKERS`].
    pub fn set_workers(&self, n: u32) {
        let n = n.min(MAX_WORKERS);
        self.count.store(n, Ordering::Relaxed);
        self.ceiling.fetch_max(n, Ordering::Relaxed);
        // At once, rather than at the next keep-alive.
        keep_alive(&self.workers, n, self.ceiling.load(Ordering::Relaxed));
    }

    /// The indexes of the workers whose shard this node hosts (running, or started at the next
    /// keep-alive).
    pub fn hosted_workers(&self) -> Vec<u32> {
        let hosted: std::collections::BTreeSet<ShardId> = self.workers.hosted_shards().into_iter().collect();
        (0..self.workers()).filter(|i| hosted.contains(&self.workers.shard_of(i.to_string()))).collect()
    }
}

/// Tells workers `0..ceiling` the count: those under it are alive, the others stop.
pub(crate) fn keep_alive(workers: &crate::EntityHandle<DaemonWorker>, count: u32, ceiling: u32) {
    for i in 0..ceiling.max(count) {
        // Refused while the worker's shard has no home (a node just died): the next round
        // tries again.
        if let Err(e) = workers.entity_ref(i.to_string()).tell(KeepAlive { count }) {
            tracing::trace!(index = i, error = %e, "keep-alive not sent");
        }
    }
}
