//! Sharded daemon processes: a worker never outlives its entity.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardline::Cluster;

/// A worker that ignores its context (it never looks at the stop signal) still stops when its
/// node loses its shards at once (here, a crash): the entity's drop aborts it. Otherwise it would
/// run beside the worker of the same index that the shard's next owner starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_ignores_its_stop_ends_with_its_node() {
    let a = Cluster::builder().cluster_name("daemon-crash").build().await.unwrap();
    let ticks = Arc::new(AtomicU64::new(0));
    let t = ticks.clone();
    a.daemon("ticker", 1, move |_, _ctx| {
        let t = t.clone();
        async move {
            loop {
                t.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    })
    .await
    .unwrap();
    let started = Instant::now();
    while ticks.load(Ordering::SeqCst) == 0 {
        assert!(started.elapsed() < Duration::from_secs(20), "the worker never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.crash();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after_crash = ticks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ticks.load(Ordering::SeqCst), after_crash, "the worker ran on after its node crashed");
}

/// The count is checked: a daemon of no workers, or of more than the most, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_of_no_workers_is_refused() {
    let a = Cluster::builder().cluster_name("daemon-count").build().await.unwrap();
    assert!(a.daemon("none", 0, |_, _| async {}).await.is_err());
    assert!(a.daemon("many", shardline::entity::daemon::MAX_WORKERS + 1, |_, _| async {}).await.is_err());
}
