//! Requests that change the cluster (drain, rebalance, shard assignments) reach the node that
//! acts on them as cluster messages. Without TLS anyone who knows the cluster's name can connect
//! as a peer: such a peer must not be able to drain a node or move shards, while a node that holds
//! the cluster's admin secret can, and questions that change nothing stay open.

mod common;

use std::time::Duration;

use common::{eventually, logs, node_with};
use shardline::{AdminError, Cluster, MemberStatus};

const SECRET: &str = "the-admin-secret-of-this-test";

fn up(c: &Cluster, n: usize) -> bool {
    c.view().view.members().filter(|m| m.status == MemberStatus::Up).count() == n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_the_admin_secret_cannot_drain_or_rebalance() {
    logs();
    let builder = |name: &str| Cluster::builder().cluster_name("admin-auth").node_name(name);
    let (n1, _) = node_with(builder("n1").admin_secret(SECRET), None).await;
    let seed = Some(n1.local_addr());
    let (n2, _) = node_with(builder("n2").admin_secret(SECRET), seed).await;
    // Outsiders that know the cluster's name: one without a secret, one with another secret.
    let (outsider, _) = node_with(builder("outsider").proxy(), seed).await;
    let (guesser, _) = node_with(builder("guesser").proxy().admin_secret("a-guess-at-the-admin-secret"), seed).await;
    for c in [&n1, &n2, &outsider, &guesser] {
        let c2 = c.clone();
        eventually("four members up", Duration::from_secs(30), move || up(&c2, 4)).await;
    }
    for intruder in [&outsider, &guesser] {
        let refused = intruder.drain("n2").await;
        assert!(matches!(refused, Err(AdminError::Unauthorized(_))), "drain: {refused:?}");
        let refused = intruder.rebalance("log").await;
        assert!(matches!(refused, Err(AdminError::Unauthorized(_))), "rebalance: {refused:?}");
        // Questions stay open.
        assert!(intruder.shard_map("log").await.is_ok());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(up(&n1, 4), "nobody left: {:?}", n1.view().view.members().map(|m| m.status).collect::<Vec<_>>());
    // A node with the secret drains another.
    assert!(n1.rebalance("log").await.is_ok());
    n1.drain("n2").await.expect("a node with the secret drains n2");
    tokio::time::timeout(Duration::from_secs(60), n2.left()).await.expect("n2 leaves").expect("n2 left cleanly");
}
