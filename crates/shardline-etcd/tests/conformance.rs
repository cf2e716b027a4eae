//! Needs: etcd (Debian `etcd-server`). The test starts its own etcd on free loopback ports; a
//! missing binary fails the test.

use std::time::Duration;

use shardline::membership::lease::server::ServerProcess;
use shardline::membership::lease::{conformance, CoordinationStore, StoreError};
use shardline_etcd::EtcdStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_store_conforms() {
    let server = ServerProcess::etcd().expect("etcd starts");
    let store = EtcdStore::connect(std::slice::from_ref(&server.addr), Duration::from_secs(5)).await.expect("connects");
    // etcd's minimum lease TTL is about 2 s.
    conformance::run_all(std::sync::Arc::new(store), "conf", Duration::from_secs(2)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_outage_is_a_typed_error_then_recovers() {
    let mut server = ServerProcess::etcd().expect("etcd starts");
    let store = EtcdStore::connect(std::slice::from_ref(&server.addr), Duration::from_secs(2)).await.expect("connects");
    store.compare_and_put("k", b"v".to_vec(), 0).await.unwrap();
    server.stop();
    assert!(matches!(store.get("k").await, Err(StoreError::Unavailable(_))));
    server.resume().unwrap();
    let mut ok = false;
    for _ in 0..100 {
        if let Ok(Some(e)) = store.get("k").await {
            assert_eq!(e.value, b"v");
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "store usable again after etcd came back");
}
