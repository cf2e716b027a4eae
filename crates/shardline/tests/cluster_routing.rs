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
