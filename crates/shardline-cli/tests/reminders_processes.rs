//! Durable reminders across real `shardline node` processes: the node that hosts an alarm is
//! killed with SIGKILL between the reminder's set and its due time. The survivor takes the
//! shard, reads the reminder from the journal the two share, and rings the alarm once.

mod nodes;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nodes::*;
use shardline::{Cluster, Gossip, RetryPolicy};
use shardline_cli::{register_alarms, AlarmCmd, Alarms};

fn home(alarms: &Alarms, id: &str) -> Option<String> {
    let e = alarms.entity_handle();
    e.shard_homes()[e.shard_of(id).index()].as_ref().map(|n| n.name.to_string())
}

async fn rings(alarms: &Alarms, id: &str) -> Option<BTreeMap<String, u32>> {
    alarms.ask(id, AlarmCmd::Rings).await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reminder_whose_node_is_killed_before_it_is_due_rings_once_on_the_survivor() {
    let (p1, p2) = (free_port(), free_port());
    let _n1 = spawn_with("n1", p1, p1, &["--alarms"], Stdio::inherit(), "warn");
    let mut n2 = spawn_with("n2", p2, p1, &["--alarms"], Stdio::inherit(), "warn");
    let driver = Cluster::builder()
        .cluster_name("shardline-demo")
        .node_name("test-driver")
        .proxy()
        .membership(Gossip::new([format!("127.0.0.1:{p1}")]))
        .build()
        .await
        .expect("driver starts");
    let alarms = register_alarms(&driver, SHARDS, None).await.expect("type registers");
    let a = alarms.clone();
    eventually("both nodes host alarms", Duration::from_secs(60), move || {
        let homes: Vec<_> = (0..200).map(|i| home(&a, &format!("alarm-{i}"))).collect();
        homes.iter().all(Option::is_some)
            && homes.iter().any(|h| h.as_deref() == Some("n1"))
            && homes.iter().any(|h| h.as_deref() == Some("n2"))
    })
    .await;
    let id = (0..200)
        .map(|i| format!("alarm-{i}"))
        .find(|id| home(&alarms, id).as_deref() == Some("n2"))
        .expect("n2 hosts an alarm");
    let set = Instant::now();
    alarms
        .ask_retrying(&id, AlarmCmd::Set { name: "wake".into(), after_ms: 3_000 }, RetryPolicy::default())
        .await
        .expect("the alarm is set");
    // SIGKILL: no hand-off, no goodbye; the reminder is only in the journal now.
    n2.0.kill().expect("kill -9 n2");
    let _ = n2.0.wait();
    assert!(set.elapsed() < Duration::from_millis(3_000), "n2 was killed after the alarm was due");
    let started = Instant::now();
    loop {
        if let Some(r) = rings(&alarms, &id).await {
            if r.get("wake").copied().unwrap_or(0) > 0 {
                break;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(90), "the alarm never rang on n1");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(home(&alarms, &id).as_deref(), Some("n1"));
    // Time for a second firing, had the first not been acknowledged.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = rings(&alarms, &id).await.expect("the alarm answers");
    assert_eq!(r.get("wake"), Some(&1), "rang {r:?}");
}
