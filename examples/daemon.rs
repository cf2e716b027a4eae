//! A sharded daemon process: six workers (one per partition of an imagined topic) spread over
//! three in-process nodes, each index running on exactly one node. A node crashes: its workers
//! start again on the others. The count drops to three: the workers past it stop.
//!
//! ```sh
//! cargo run -p shardline --example daemon
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardline::{Cluster, DaemonHandle, Gossip};

/// Which node runs each worker index now, and how many run per index (never more than one).
#[derive(Default)]
struct Running {
    on: Mutex<BTreeMap<u32, String>>,
    at_once: [AtomicUsize; 6],
    most_at_once: AtomicUsize,
}

/// Marks a worker running while it lives, whether it returns or is aborted.
struct Alive {
    running: Arc<Running>,
    index: u32,
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.running.at_once[self.index as usize].fetch_sub(1, Ordering::SeqCst);
        self.running.on.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.index);
    }
}

async fn node(
    name: &str,
    seed: Option<&Cluster>,
    running: Arc<Running>,
) -> Result<(Cluster, DaemonHandle), Box<dyn std::error::Error>> {
    let mut builder = Cluster::builder().cluster_name("daemons").node_name(name);
    if let Some(seed) = seed {
        builder = builder.membership(Gossip::new([seed.local_addr().to_string()]));
    }
    let cluster = builder.build().await?;
    let me = name.to_string();
    let daemon = cluster
        .daemon("consumer", 6, move |index, mut ctx| {
            let (running, me) = (running.clone(), me.clone());
            async move {
                let n = running.at_once[index as usize].fetch_add(1, Ordering::SeqCst) + 1;
                running.most_at_once.fetch_max(n, Ordering::SeqCst);
                running.on.lock().unwrap_or_else(|e| e.into_inner()).insert(index, me);
                let _alive = Alive { running, index };
                // A consumer would poll its partition here until told to stop.
                ctx.stopping().await;
            }
        })
        .await?;
    Ok((cluster, daemon))
}

async fn until(what: &str, done: impl Fn() -> bool) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > Duration::from_secs(30) {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let running = Arc::new(Running::default());
    let (a, da) = node("a", None, running.clone()).await?;
    let (b, db) = node("b", Some(&a), running.clone()).await?;
    let (c, dc) = node("c", Some(&a), running.clone()).await?;
    a.formed(3).await?;
    let on = || running.on.lock().unwrap_or_else(|e| e.into_inner()).clone();
    until("six workers", || on().len() == 6).await?;
    println!("workers: {:?}", on());

    // c crashes: its workers start on a and b once c is declared down.
    let on_c: Vec<u32> = on().iter().filter(|(_, n)| *n == "c").map(|(i, _)| *i).collect();
    c.crash();
    println!("c crashed, with workers {on_c:?}");
    until("c's workers elsewhere", || on().len() == 6 && on().values().all(|n| n != "c")).await?;
    println!("workers: {:?}", on());

    // Three workers from now on (set on every node, as from a shared configuration).
    for d in [&da, &db, &dc] {
        d.set_workers(3);
    }
    until("three workers", || on().keys().copied().collect::<Vec<_>>() == [0, 1, 2]).await?;
    println!("after scaling to three: {:?}", on());

    let most = running.most_at_once.load(Ordering::SeqCst);
    if most != 1 {
        return Err(format!("{most} workers of one index ran at once").into());
    }
    println!("never two workers of one index at once");
    b.leave().await?;
    a.leave().await?;
    Ok(())
}
