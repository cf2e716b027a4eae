//! Lease-based membership on the in-memory store (the same provider runs on etcd and NATS,
//! tested against real servers in their crates and by the multi-process tests).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use shardline::membership::lease::{InMemoryStore, LeaseConfig, Leases};
use shardline::{Cluster, EntityHandle};

fn config() -> LeaseConfig {
    LeaseConfig { ttl: Duration::from_millis(900), safety_margin: Duration::from_millis(300), ..LeaseConfig::default() }
}

async fn lease_node(name: &str, store: &InMemoryStore) -> (Cluster, EntityHandle<Log>) {
    logs();
    let c = Cluster::builder()
        .cluster_name("leases")
        .node_name(name)
        .membership(Leases::new(Arc::new(store.clone()), "leases", config()))
        .build()
        .await
        .expect("node starts");
    let h = c.register::<Log>(settings()).await.expect("type registers");
    (c, h)
}

fn names(h: &EntityHandle<Log>) -> Vec<String> {
    h.shard_homes().iter().map(|o| o.as_ref().map(|n| n.name.to_string()).unwrap_or_default()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_members_shards_move_after_its_lease_expires() {
    let store = InMemoryStore::new();
    let (_a, ha) = lease_node("a", &store).await;
    let (b, _hb) = lease_node("b", &store).await;
    let (_c, _hc) = lease_node("c", &store).await;
    let h = ha.clone();
    eventually("shards on all three", Duration::from_secs(30), move || {
        let n = names(&h);
        ["a", "b", "c"].iter().all(|x| n.iter().any(|y| y == x))
    })
    .await;
    for i in 0..30 {
        ha.entity_ref(format!("v{i}")).ask(Cmd::Append(i)).await.unwrap();
    }
    b.crash();
    let h = ha.clone();
    eventually("b's shards moved", Duration::from_secs(30), move || names(&h).iter().all(|n| n == "a" || n == "c"))
        .await;
    for i in 0..30 {
        ha.entity_ref(format!("w{i}")).ask(Cmd::Append(i)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_fences_every_node() {
    let store = InMemoryStore::new();
    let (a, ha) = lease_node("a", &store).await;
    let (b, hb) = lease_node("b", &store).await;
    let h = ha.clone();
    eventually("shards on both", Duration::from_secs(30), move || {
        let n = names(&h);
        n.iter().all(|x| !x.is_empty()) && n.iter().any(|x| x == "b")
    })
    .await;
    store.set_down(true);
    // Both stop every shard before their lease could be taken over.
    let (ra, rb) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(10), a.downed()),
        tokio::time::timeout(Duration::from_secs(10), b.downed())
    );
    assert!(ra.is_ok() && rb.is_ok(), "both nodes fenced themselves");
    assert!(ha.hosted_shards().is_empty() && hb.hosted_shards().is_empty(), "no shard hosted while unfenced");
    store.set_down(false);
    // The cluster recovers with new incarnations.
    let (_a2, ha2) = lease_node("a", &store).await;
    let (_b2, _hb2) = lease_node("b", &store).await;
    all_homed(&ha2).await;
    ha2.entity_ref("after").ask(Cmd::Append(1)).await.unwrap();
}
