//! Lease-based membership on the in-memory store (the same provider runs on etcd and NATS,
//! tested against real servers in their crates and by the multi-process tests).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use shardline::membership::lease::{InMemoryStore, LeaseConfig, Leases, ShardMaps};
use shardline::{Cluster, EntityHandle};

/// Short leases, so that the tests wait little for expiry, yet long enough that a busy machine's
/// scheduling stalls do not fence a healthy node (900 ms once did, in CI: a node fenced for good
/// before it was given a shard).
fn config() -> LeaseConfig {
    LeaseConfig {
        ttl: Duration::from_millis(2_000),
        safety_margin: Duration::from_millis(500),
        ..LeaseConfig::default()
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_resumes_from_the_stored_map() {
    let store = InMemoryStore::new();
    let maps = ShardMaps::new(Arc::new(store.clone()), "leases");
    let nodes = [lease_node("a", &store).await, lease_node("b", &store).await, lease_node("c", &store).await];
    let h = nodes[0].1.clone();
    eventually("shards on all three", Duration::from_secs(30), move || {
        let n = names(&h);
        ["a", "b", "c"].iter().all(|x| n.iter().any(|y| y == x))
    })
    .await;
    let (leader, term) = nodes[0].0.view().leader.expect("a leader");
    // The leader's map reaches the store.
    let mut stored = None;
    for _ in 0..100 {
        let m = maps.load("log").await.expect("store answers");
        let leader_map = nodes.iter().find(|(c, _)| c.node_id() == &leader).map(|(c, _)| c.shard_counts("log"));
        if let (Some(m), Some(counts)) = (m, leader_map) {
            let stored_counts: std::collections::HashMap<_, _> =
                m.map.counts().into_iter().map(|(k, v)| (k.clone(), v)).collect();
            if m.term == term && m.map.unallocated().count() == 0 && stored_counts == counts {
                stored = Some(m);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stored = stored.expect("the leader stores its settled map");
    let (survivor, _) = nodes.iter().find(|(c, _)| c.node_id() != &leader).expect("a follower");
    for i in 0..30 {
        survivor.handle::<Log>().expect("registered").entity_ref(format!("k{i}")).ask(Cmd::Append(i)).await.unwrap();
    }
    nodes.iter().find(|(c, _)| c.node_id() == &leader).expect("leader").0.crash();
    // A new leader (larger term) takes over and stores its own map; shards on the surviving
    // nodes keep their owner and epoch: resumed, not reallocated.
    let mut resumed = None;
    for _ in 0..200 {
        if let Some(m) = maps.load("log").await.expect("store answers") {
            if m.term > term
                && m.map.unallocated().count() == 0
                && m.map.iter().all(|(_, s)| s.owner.as_ref() != Some(&leader))
            {
                resumed = Some(m);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resumed = resumed.expect("the new leader stores a map without the dead leader");
    for (shard, slot) in stored.map.iter() {
        if slot.owner.as_ref() != Some(&leader) {
            assert_eq!(resumed.map.home(shard), slot.home(), "shard {shard:?} of a surviving node was moved");
        }
    }
    // Entities on surviving nodes kept running: their state is intact.
    let h = survivor.handle::<Log>().expect("registered");
    for i in 0..30u64 {
        let id = format!("k{i}");
        let log = h.entity_ref(id.clone()).ask(Cmd::Get).await.unwrap();
        if stored.map.owner(shardline_core::shard_of(&id, 32)) != Some(&leader) {
            assert_eq!(log, vec![i], "{id} lost its state");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbered_slots_fill_the_smallest_hole() {
    logs();
    let store = InMemoryStore::new();
    let start = |name: &'static str| {
        let store = store.clone();
        async move {
            let config = LeaseConfig { numbered_slots: true, ..config() };
            Cluster::builder()
                .cluster_name("slots")
                .node_name(name)
                .membership(Leases::new(Arc::new(store), "slots", config))
                .build()
                .await
                .expect("node starts")
        }
    };
    let slots = |c: &Cluster| -> Vec<(String, Option<u32>)> {
        c.view().view.members().filter(|m| !m.status.is_fenced()).map(|m| (m.node.name.to_string(), m.slot)).collect()
    };
    // One after the other: a new member joins once the leader answered its keep-alive.
    let joined = |c: &Cluster, n: usize| c.view().view.members().filter(|m| !m.status.is_fenced()).count() == n;
    let a = start("a").await;
    let b = start("b").await;
    let a1 = a.clone();
    eventually("b joined", Duration::from_secs(20), move || joined(&a1, 2)).await;
    let c = start("c").await;
    let want = vec![("a".to_string(), Some(0)), ("b".to_string(), Some(1)), ("c".to_string(), Some(2))];
    let a2 = a.clone();
    let w = want.clone();
    eventually("slots 0, 1, 2 in joining order", Duration::from_secs(20), move || slots(&a2) == w).await;
    b.crash();
    // b's number stays a hole (nobody renumbers); the next node to join takes it.
    let a3 = a.clone();
    let want = vec![("a".to_string(), Some(0)), ("c".to_string(), Some(2))];
    eventually("b's lease lapsed", Duration::from_secs(20), move || slots(&a3) == want).await;
    let d = start("d").await;
    let a3 = a.clone();
    let want = vec![("a".to_string(), Some(0)), ("c".to_string(), Some(2)), ("d".to_string(), Some(1))];
    eventually("d takes slot 1", Duration::from_secs(20), move || slots(&a3) == want).await;
    drop((c, d));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_its_key_steps_down_before_the_key_expires() {
    use shardline::membership::lease::{CoordinationStore, WatchEvent};
    use shardline_core::DomainEvent;
    let store = InMemoryStore::new();
    // The margin is smaller than the renewal period (TTL/3): stepping down on the next failed
    // renewal instead of at the deadline would come after the key expired.
    let config =
        LeaseConfig { ttl: Duration::from_millis(3_000), safety_margin: Duration::from_millis(500), ..config() };
    let start = |name: &'static str| {
        let (store, config) = (store.clone(), config.clone());
        async move {
            let c = Cluster::builder()
                .cluster_name("leases")
                .node_name(name)
                .membership(Leases::new(Arc::new(store), "leases", config))
                .build()
                .await
                .expect("node starts");
            let h = c.register::<Log>(settings()).await.expect("type registers");
            (c, h)
        }
    };
    logs();
    let nodes = [start("a").await, start("b").await];
    let (a, ha) = (&nodes[0].0, nodes[0].1.clone());
    let h = ha.clone();
    eventually("shards on both", Duration::from_secs(30), move || {
        let n = names(&h);
        n.iter().all(|x| !x.is_empty()) && n.iter().any(|x| x == "b")
    })
    .await;
    let (leader, term) = a.view().leader.expect("a leader");
    let leader_node = &nodes.iter().find(|(c, _)| c.node_id() == &leader).expect("the leader is one of them").0;
    let mut events = leader_node.events();
    let mut watch = store.watch("leases/leader").await.expect("store answers");
    store.set_key_down("leases/leader", true);
    loop {
        match tokio::time::timeout(Duration::from_secs(10), watch.recv()).await {
            Ok(Some(WatchEvent::Delete { .. })) => break,
            Ok(Some(_)) => continue,
            other => panic!("the leader key never expired: {other:?}"),
        }
    }
    // Order, not clocks: the leader's step-down is in its event stream already when the key's
    // expiry is seen. (Timestamps taken by two test tasks would measure their scheduling too.)
    let stepped_down = loop {
        match events.try_recv() {
            Ok((_, DomainEvent::LeadershipLost { .. })) => break true,
            Ok(_) | Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => continue,
            Err(_) => break false,
        }
    };
    assert!(stepped_down, "the old leader still coordinated when its key expired");
    assert!(!leader_node.view().view.is_fenced(&leader), "only leadership was lost, not membership");
    // The key works again: someone leads with a larger term and every shard is homed.
    store.set_key_down("leases/leader", false);
    let a2 = a.clone();
    eventually("a new term", Duration::from_secs(30), move || a2.view().leader.is_some_and(|(_, t)| t > term)).await;
    all_homed(&ha).await;
    ha.entity_ref("after").ask(Cmd::Append(1)).await.unwrap();
}

/// An unreadable term counter in the store is never read as 0 (terms would repeat): no node
/// takes a term from it, so nobody leads and nothing is allocated, until it is readable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_term_counter_is_never_taken_as_zero() {
    use shardline::membership::lease::CoordinationStore;
    let store = InMemoryStore::new();
    let key = "leases/term";
    store.compare_and_put(key, vec![0xff; 11], 0).await.unwrap().expect("garbage written");
    let (a, _ha) = lease_node("a", &store).await;
    // Several renewal rounds (TTL/3 each): a node that read the garbage as 0 would lead with term 1.
    tokio::time::sleep(config().ttl * 3).await;
    assert_eq!(a.view().leader, None, "nobody leads from an unreadable counter");
    let current = store.get(key).await.unwrap().expect("counter still there");
    assert_eq!(current.value, vec![0xff; 11], "the counter was not overwritten");
    // Repaired (term 41 was the last): the next leader takes 42.
    let term = postcard::to_allocvec(&41u64).unwrap();
    store.compare_and_put(key, term, current.revision).await.unwrap().expect("repaired");
    eventually("a leads", Duration::from_secs(20), || a.view().leader.is_some()).await;
    assert_eq!(a.view().leader.map(|(_, t)| t), Some(42));
}

/// Members started together (as the demo and a rollout start them) all join: a new member joins
/// once the leader answered its keep-alive, and the answers must reach a node that is still
/// starting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_started_together_all_join() {
    let store = InMemoryStore::new();
    let (a, _ha) = lease_node("a", &store).await;
    let ((b, hb), (c, hc)) = tokio::join!(lease_node("b", &store), lease_node("c", &store));
    let members = |x: &Cluster| x.view().view.members().filter(|m| !m.status.is_fenced()).count();
    let a2 = a.clone();
    eventually("three members", Duration::from_secs(10), move || members(&a2) == 3).await;
    // And they route: every shard's home is known on each of them.
    for h in [hb, hc] {
        eventually("every home known", Duration::from_secs(10), move || h.shard_homes().iter().all(Option::is_some))
            .await;
    }
    drop((b, c));
}
