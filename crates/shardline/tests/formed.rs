//! `Cluster::formed`: an application waits for the cluster it meant to start before it sends.

mod common;

use std::time::Duration;

use common::*;
use shardline::{Cluster, EntitySettings, Error, Formation, Gossip};

async fn member(name: &str, seed: Option<&Cluster>) -> Cluster {
    let mut builder = Cluster::builder().cluster_name("formed").node_name(name);
    if let Some(seed) = seed {
        builder = builder.membership(Gossip::new([seed.local_addr().to_string()]));
    }
    builder.build().await.unwrap()
}

async fn register(c: &Cluster) -> shardline::EntityHandle<Log> {
    let settings = EntitySettings::new("log").shards(16).rebalance_interval(Duration::from_millis(300));
    c.register::<Log>(settings).await.unwrap()
}

/// Two members are up, but only the first has registered the type, so it hosts every shard:
/// not formed. Once the second registers it too and gets shards, `formed(2)` resolves, both
/// nodes hold shards and every shard has a home among them. Asked for a third member that
/// never comes, it times out with a typed error and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn formed_waits_for_the_members_and_the_placement() {
    logs();
    let a = member("a", None).await;
    let ha = register(&a).await;
    let b = member("b", Some(&a)).await;
    let wait = Duration::from_secs(30);
    let started = std::time::Instant::now();
    while a.formation(2) != (Formation::Placing { type_key: "log".into() }) {
        assert!(started.elapsed() < wait, "b never came up: {:?}", a.formation(2));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = a.formed_within(2, Duration::from_millis(500)).await;
    assert_eq!(r, Err(Error::Timeout(Duration::from_millis(500))), "formed while b hosts nothing");
    let hb = register(&b).await;
    a.formed_within(2, wait).await.unwrap();
    for (name, h) in [("a", &ha), ("b", &hb)] {
        assert!(!h.hosted_shards().is_empty(), "{name} hosts no shard once formed");
    }
    let homes = ha.shard_homes();
    assert!(homes.iter().all(|h| h.as_ref().is_some_and(|h| h == a.node_id() || h == b.node_id())), "{homes:?}");
    assert_eq!(a.formation(2), Formation::Formed);
    assert_eq!(a.formation(3), Formation::Members { up: 2, wanted: 3 });
    let r = a.formed_within(3, Duration::from_millis(300)).await;
    assert_eq!(r, Err(Error::Timeout(Duration::from_millis(300))));
    b.leave().await.unwrap();
}
