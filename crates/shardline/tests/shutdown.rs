//! `Cluster::leave_on`: a node serves until its application's shutdown signal, then hands its
//! shards off and leaves.

mod common;

use std::time::Duration;

use common::*;
use shardline::Gossip;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_leaves_gracefully_when_its_signal_fires() {
    let (a, ha) = node("a", None).await;
    let b = shardline::Cluster::builder()
        .cluster_name("test")
        .node_name("b")
        .membership(Gossip::new([a.local_addr().to_string()]))
        .build()
        .await
        .unwrap();
    let hb = b.register::<Log>(settings()).await.unwrap();
    a.formed(2).await.unwrap();
    let id = (0..500).map(|i| format!("x{i}")).find(|id| hb.hosted_shards().contains(&hb.shard_of(id))).unwrap();
    ha.entity_ref(&id).ask(Cmd::Append(7)).await.unwrap();
    let (stop, signal) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        let r = b
            .leave_on(async {
                let _ = signal.await;
            })
            .await;
        (r, b)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!serving.is_finished(), "left before its signal");
    stop.send(()).unwrap();
    let (r, _b) = serving.await.unwrap();
    r.unwrap();
    // b handed its shards over (the log's state with it) before it left.
    let ha2 = ha.clone();
    eventually("a hosts every shard", Duration::from_secs(30), move || ha2.hosted_shards().len() == 32).await;
    assert_eq!(ha.entity_ref(&id).ask(Cmd::Get).await.unwrap(), vec![7]);
    a.leave().await.unwrap();
}
