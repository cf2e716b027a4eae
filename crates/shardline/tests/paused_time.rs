//! The runtime on a paused clock. Every driver of a node reads the node's one `Clock`, on tokio's
//! time: shard hosts (idle times), the deadlines of asks and the hosting lease. So a test that
//! pauses tokio's time moves all of them together, and an hour of the node's life takes no hour.

mod common;

use std::time::Duration;

use common::*;
use shardline::{Cluster, EntitySettings, Error};
use tokio::time::Instant;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn ask_deadlines_and_idle_passivation_follow_the_paused_clock() {
    logs();
    let c = Cluster::builder().cluster_name("paused").build().await.unwrap();
    let idle = Duration::from_secs(600);
    let h = c.register::<Log>(EntitySettings::new("log").shards(4).passivate_after(idle)).await.unwrap();
    h.entity_ref("a").ask(Cmd::Append(1)).await.unwrap();

    // A handler that takes a minute, asked with 30 s: the ask ends at its deadline on the node's
    // clock, up to two sweeps of the deadlines late, never early.
    let asked = Instant::now();
    let r = h.entity_ref("slow").ask_timeout(Cmd::Sleep(60_000), Duration::from_secs(30)).await;
    let waited = asked.elapsed();
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    assert!(waited >= Duration::from_secs(30) && waited <= Duration::from_millis(30_100), "waited {waited:?}");
    assert_eq!(h.local_entities(), 2);

    // Idle for longer than `passivate_after` on the node's clock: both are passivated.
    tokio::time::sleep(idle * 2 + Duration::from_secs(60)).await;
    assert_eq!(h.local_entities(), 0, "idle entities passivated on the paused clock");
    assert_eq!(h.entity_ref("a").ask(Cmd::Get).await.unwrap(), Vec::<u64>::new(), "restarted on demand");
    c.leave().await.unwrap();
}
