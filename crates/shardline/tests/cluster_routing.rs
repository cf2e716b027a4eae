//! In-process clusters on 127.0.0.1: routing, hand-off on join, graceful leave.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_asks_and_tells() {
    let (_c, h) = node("solo", None).await;
    let e = h.entity_ref("a");
    assert_eq!(e.ask(Cmd::Append(1)).await.unwrap(), vec![1]);
    e.tell(Cmd::Append(2)).unwrap();
    assert_eq!(e.ask(Cmd::Append(3)).await.unwrap(), vec![1, 2, 3]);
    assert_eq!(h.entity_ref("b").ask(Cmd::Get).await.unwrap(), Vec::<u64>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_route_to_one_owner_and_rebalance_on_join() {
    let (a, ha) = node("a", None).await;
    let seed = Some(a.local_addr());
    let (_b, hb) = node("b", seed).await;
    let (_c, hc) = node("c", seed).await;
    // Every entity has one owner, whoever asks.
    for i in 0..64u64 {
        let id = format!("e{i}");
        let via = [&ha, &hb, &hc][i as usize % 3];
        assert_eq!(via.entity_ref(&id).ask(Cmd::Append(i)).await.unwrap(), vec![i]);
        let other = [&hb, &hc, &ha][i as usize % 3];
        assert_eq!(other.entity_ref(&id).ask(Cmd::Get).await.unwrap(), vec![i], "{id} seen from another node");
    }
    // All three host shards once balanced.
    let (ha2, hb2, hc2) = (ha.clone(), hb.clone(), hc.clone());
    eventually("shards spread over 3 nodes", Duration::from_secs(30), move || {
        let (x, y, z) = (ha2.hosted_shards().len(), hb2.hosted_shards().len(), hc2.hosted_shards().len());
        x + y + z == 32 && x >= 10 && y >= 10 && z >= 10
    })
    .await;
    // State moved with the shards (hand-over), and every node sees the same entity.
    for i in 0..64u64 {
        let id = format!("e{i}");
        assert_eq!(ha.entity_ref(&id).ask(Cmd::Get).await.unwrap(), vec![i], "{id}");
        assert_eq!(hc.entity_ref(&id).ask(Cmd::Get).await.unwrap(), vec![i], "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_leave_loses_nothing_and_keeps_order() {
    let (a, ha) = node("a", None).await;
    let seed = Some(a.local_addr());
    let (b, _hb) = node("b", seed).await;
    let (_c, hc) = node("c", seed).await;
    all_homed(&hc).await;
    let hc2 = hc.clone();
    eventually("b hosts shards", Duration::from_secs(30), move || {
        hc2.shard_homes().iter().any(|o| o.as_ref().is_some_and(|n| &*n.name == "b"))
    })
    .await;
    // Tell a stream of appends to 16 entities while b leaves; then every entity has all of
    // its values, in order.
    let sender = {
        let hc = hc.clone();
        tokio::spawn(async move {
            for v in 0..200u64 {
                for e in 0..16 {
                    hc.entity_ref(format!("k{e}")).tell(Cmd::Append(v)).unwrap();
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    b.leave_within(Duration::from_secs(30)).await.expect("leave completes");
    sender.await.unwrap();
    for e in 0..16 {
        // The state moved with the shard: every value, in order.
        let got = ha.entity_ref(format!("k{e}")).ask(Cmd::Get).await.unwrap();
        let want: Vec<u64> = (0..200).collect();
        assert_eq!(got, want, "k{e}");
    }
    assert!(hc.shard_homes().iter().all(|o| o.as_ref().is_some_and(|n| &*n.name != "b")));
}

/// Every node leaves in turn; the last one has nowhere to hand its shards, so it stops them
/// itself (stop hooks run) instead of waiting for a hand-off nobody can take. Its entities' state
/// is gone with it: without a journal nothing outlives the last node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_node_leaving_stops_its_shards_and_returns() {
    let (a, _ha) = node("a", None).await;
    let seed = Some(a.local_addr());
    let (b, _hb) = node("b", seed).await;
    let (c, hc) = node("c", seed).await;
    all_homed(&hc).await;
    for i in 0..32u64 {
        hc.entity_ref(format!("e{i}")).ask(Cmd::Append(i)).await.unwrap();
    }
    a.leave_within(Duration::from_secs(30)).await.expect("a leaves");
    b.leave_within(Duration::from_secs(30)).await.expect("b leaves");
    // Everything is on c now, state included.
    assert_eq!(hc.hosted_shards().len(), 32);
    for i in 0..32u64 {
        assert_eq!(hc.entity_ref(format!("e{i}")).ask(Cmd::Get).await.unwrap(), vec![i]);
    }
    let stopped = STOPPED.load(std::sync::atomic::Ordering::Relaxed);
    // Before the fix this waited for its whole limit and returned `Timeout`.
    c.leave_within(Duration::from_secs(20)).await.expect("the last node leaves");
    assert!(hc.hosted_shards().is_empty(), "the last node stopped every shard");
    let hooks = STOPPED.load(std::sync::atomic::Ordering::Relaxed) - stopped;
    assert!(hooks >= 32, "the stop hook ran for each of the 32 entities, ran {hooks} times");
    // Asks after the leave fail as not processed.
    let err = hc.entity_ref("e1").ask(Cmd::Get).await.expect_err("the node is gone");
    assert!(err.is_safe_to_retry(), "{err:?}");
}

/// With a partition key, entities that share it share a shard, hence a node, wherever they are
/// asked from and after the shards spread over three nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entities_with_one_partition_key_share_a_shard_and_a_node() {
    use shardline::{Cluster, EntityHandle, EntitySettings, Gossip};
    logs();
    fn home(id: &str) -> &str {
        id.split_once('/').map_or(id, |(home, _)| home)
    }
    async fn start(name: &str, seed: Option<std::net::SocketAddr>) -> (Cluster, EntityHandle<Log>) {
        let b = Cluster::builder().cluster_name("colocate").node_name(name);
        let b = match seed {
            Some(s) => b.membership(Gossip::new([s.to_string()])),
            None => b,
        };
        let c = b.build().await.unwrap();
        let h = c.register::<Log>(EntitySettings::new("device").shards(16).partition_key(home)).await.unwrap();
        (c, h)
    }
    let (a, ha) = start("a", None).await;
    let (_b, hb) = start("b", Some(a.local_addr())).await;
    let (_c, hc) = start("c", Some(a.local_addr())).await;
    let (hb2, hc2) = (hb.clone(), hc.clone());
    eventually("shards on b and c", Duration::from_secs(30), move || {
        hb2.hosted_shards().len() >= 3 && hc2.hosted_shards().len() >= 3
    })
    .await;
    let mut shards = std::collections::BTreeSet::new();
    for h in 0..12 {
        let ids: Vec<String> = ["thermostat", "door", "lamp"].iter().map(|d| format!("home-{h}/{d}")).collect();
        let shard = ha.shard_of(&ids[0]);
        shards.insert(shard);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(ha.shard_of(id), shard, "{id}");
            // Asked through another node each time: one instance, one log.
            let via = [&ha, &hb, &hc][i];
            assert_eq!(via.entity_ref(id).ask(Cmd::Append(h)).await.unwrap(), vec![h], "{id}");
        }
        let hosts: Vec<&str> = [("a", &ha), ("b", &hb), ("c", &hc)]
            .iter()
            .filter(|(_, x)| x.hosted_shards().contains(&shard))
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(hosts.len(), 1, "home-{h}'s shard is hosted once: {hosts:?}");
    }
    assert!(shards.len() > 1, "homes spread over shards");
    // Without the key the same ids would scatter: the function is what keeps them together.
    let plain = EntitySettings::new("device").shards(16);
    let scattered =
        (0..12).any(|h| plain.shard_of(&format!("home-{h}/door")) != plain.shard_of(&format!("home-{h}/lamp")));
    assert!(scattered);
}
