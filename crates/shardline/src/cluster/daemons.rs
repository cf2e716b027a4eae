//! [`Cluster::daemon`]: registers a sharded daemon process (see [`crate::entity::daemon`]) and
//! keeps its workers alive from this node.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::{Cluster, Leave};
use crate::entity::daemon::{keep_alive, shard_of_worker, DaemonContext, DaemonHandle, DaemonWorker, Worker, WorkerFn};
use crate::entity::daemon::{KEEP_ALIVE, MAX_WORKERS};
use crate::entity::EntitySettings;
use crate::error::ConfigError;
use crate::sharding::settings::ShardBy;

impl Cluster {
    /// Runs `n` workers of the daemon `name` somewhere in the cluster: `worker(index, ctx)` for
    /// each index in `0..n`, each on one node at a time, started again elsewhere when its node
    /// leaves or dies (Akka's sharded daemon process). Register it on every node that may run
    /// workers, with the same function and the same `n` (it sets the type's shards, one per
    /// worker); a worker should return soon after
    /// [`DaemonContext::stopping`] resolves. The count can change at run time
    /// ([`DaemonHandle::set_workers`]); at most [`MAX_WORKERS`].
    ///
    /// ```no_run
    /// # async fn run(cluster: shardline::Cluster) -> Result<(), Box<dyn std::error::Error>> {
    /// // One consumer per partition of a topic of 8 partitions.
    /// let consumers = cluster
    ///     .daemon("orders-consumer", 8, |partition, mut ctx| async move {
    ///         loop {
    ///             tokio::select! {
    ///                 _ = ctx.stopping() => return,
    ///                 _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {
    ///                     // poll partition `partition` …
    ///                 }
    ///             }
    ///         }
    ///     })
    ///     .await?;
    /// println!("workers here: {:?}", consumers.hosted_workers());
    /// # Ok(()) }
    /// ```
    pub async fn daemon<F, Fut>(&self, name: &str, n: u32, worker: F) -> Result<DaemonHandle, ConfigError>
    where
        F: Fn(u32, DaemonContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if n == 0 || n > MAX_WORKERS {
            let reason = format!("{n}: from 1 to {MAX_WORKERS}");
            return Err(ConfigError::Invalid { name: "daemon workers", reason });
        }
        let type_key = format!("daemon-{name}");
        let f: WorkerFn = Arc::new(move |i, ctx| Box::pin(worker(i, ctx)));
        // One shard per worker: spread as shards are. Every node must register the same count.
        let mut settings = EntitySettings::new(&type_key).shards(n);
        settings.shard_by = Some(ShardBy(Arc::new(move |id| shard_of_worker(id, n))));
        // Registered first: a name taken already is refused before its worker is replaced. A
        // keep-alive that comes in between finds no worker and is answered by the next one.
        let workers = self.register::<DaemonWorker>(settings).await?;
        self.inner.node.add_extension(&type_key, Arc::new(Worker(f)));
        let (count, ceiling) = (Arc::new(AtomicU32::new(n)), Arc::new(AtomicU32::new(n)));
        let handle = DaemonHandle {
            name: name.to_string(),
            count: count.clone(),
            ceiling: ceiling.clone(),
            workers: workers.clone(),
        };
        let node = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                // Until this node leaves, is fenced or is dropped.
                let Some(inner) = node.upgrade() else { return };
                if inner.fenced.load(Ordering::Acquire) || !matches!(*inner.leave.borrow(), Leave::Staying) {
                    return;
                }
                drop(inner);
                keep_alive(&workers, count.load(Ordering::Relaxed), ceiling.load(Ordering::Relaxed));
                tokio::time::sleep(KEEP_ALIVE).await;
            }
        });
        Ok(handle)
    }
}
