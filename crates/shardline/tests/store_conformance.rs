//! The in-memory coordination store passes the conformance suite every store must pass (the
//! etcd and NATS stores run the same suite against real servers), and an outage is reported as
//! a typed error.

use std::time::Duration;

use shardline::membership::lease::{conformance, CoordinationStore, InMemoryStore, StoreError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_store_conforms() {
    let store = InMemoryStore::new();
    conformance::run_all(std::sync::Arc::new(store), "conf", Duration::from_millis(400)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_a_typed_error_and_recovery_works() {
    let store = InMemoryStore::new();
    store.compare_and_put("k", b"v".to_vec(), 0).await.unwrap();
    store.set_down(true);
    assert!(matches!(store.get("k").await, Err(StoreError::Unavailable(_))));
    assert!(matches!(
        store.create_ephemeral("e", vec![], Duration::from_secs(1)).await,
        Err(StoreError::Unavailable(_))
    ));
    store.set_down(false);
    assert_eq!(store.get("k").await.unwrap().map(|e| e.value), Some(b"v".to_vec()));
}
