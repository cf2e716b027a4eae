//! Needs: nats-server with JetStream (Debian `nats-server`). The test starts its own server on a
//! free loopback port; a missing binary fails the test.

use std::time::Duration;

use shardline::membership::lease::server::ServerProcess;
use shardline::membership::lease::{conformance, CoordinationStore, StoreError};
use shardline_nats::NatsStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_store_conforms() {
    let server = ServerProcess::nats().expect("nats-server starts");
    let ttl = Duration::from_secs(1);
    let store = NatsStore::connect(&format!("nats://{}", server.addr), "conf", ttl, Duration::from_secs(5))
        .await
        .expect("connects");
    conformance::run_all(std::sync::Arc::new(store), "conf", ttl).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_outage_is_a_typed_error_then_recovers() {
    let mut server = ServerProcess::nats().expect("nats-server starts");
    let store =
        NatsStore::connect(&format!("nats://{}", server.addr), "out", Duration::from_secs(2), Duration::from_secs(2))
            .await
            .expect("connects");
    store.compare_and_put("k", b"v".to_vec(), 0).await.unwrap();
    server.stop();
    assert!(matches!(store.get("k").await, Err(StoreError::Unavailable(_))));
    server.resume().unwrap();
    let mut ok = false;
    for _ in 0..150 {
        if let Ok(Some(e)) = store.get("k").await {
            assert_eq!(e.value, b"v");
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "store usable again after nats-server came back");
}
