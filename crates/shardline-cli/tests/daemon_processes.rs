//! Sharded daemon processes across real `shardline node` processes: a node running daemon
//! workers is killed with SIGKILL, and its workers start on the survivors; each worker then runs
//! on one node only.

mod nodes;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use nodes::*;

const WORKERS: u32 = 4;

/// Where each worker wrote last, if it wrote within `fresh`.
fn workers(dir: &Path, fresh: Duration) -> Vec<Option<String>> {
    (0..WORKERS)
        .map(|i| {
            let path = dir.join(format!("worker-{i}"));
            let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
            if SystemTime::now().duration_since(modified).unwrap_or_default() > fresh {
                return None;
            }
            std::fs::read_to_string(&path).ok()
        })
        .collect()
}

async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let started = Instant::now();
    while !cond() {
        assert!(started.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_of_a_node_killed_with_sigkill_start_on_the_survivors() {
    let dir = std::env::temp_dir().join(format!("shardline-daemon-processes-{}", std::process::id()));
    let flag = dir.display().to_string();
    let (p1, p2, p3) = (free_port(), free_port(), free_port());
    let extra = ["--heartbeats", flag.as_str()];
    let _n1 = spawn_with("n1", p1, p1, &extra, Stdio::inherit(), "warn");
    let n2 = spawn_with("n2", p2, p1, &extra, Stdio::inherit(), "warn");
    let n3 = spawn_with("n3", p3, p1, &extra, Stdio::inherit(), "warn");
    let fresh = Duration::from_millis(600);
    until("every worker runs, on more than one node", Duration::from_secs(90), || {
        let w = workers(&dir, fresh);
        let mut on: Vec<&String> = w.iter().flatten().collect();
        on.sort();
        on.dedup();
        w.iter().all(Option::is_some) && on.len() >= 2 && on.iter().any(|n| *n != "n1")
    })
    .await;
    // A node other than the seed that runs a worker.
    let before = workers(&dir, fresh);
    let victim = before.iter().flatten().find(|n| *n != "n1").cloned().expect("n2 or n3 runs a worker");
    let mut killed = if victim == "n2" { n2 } else { n3 };
    killed.0.kill().expect("kill -9");
    let _ = killed.0.wait();
    let moved: Vec<u32> = (0..WORKERS).filter(|&i| before[i as usize].as_deref() == Some(victim.as_str())).collect();
    until("every worker runs on a survivor", Duration::from_secs(90), || {
        workers(&dir, Duration::from_millis(300)).iter().all(|w| w.as_ref().is_some_and(|n| *n != victim))
    })
    .await;
    // One node per worker: a worker running twice would write two names into its file in turn.
    let settled = workers(&dir, fresh);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        assert_eq!(workers(&dir, fresh), settled, "a worker's file changed hands: two instances run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!moved.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
