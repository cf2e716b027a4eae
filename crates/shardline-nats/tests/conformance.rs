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

/// A server that takes TLS connections only, with a user and password: the store connects with
/// both in its URL, and not with a wrong password, without the CA, or trusting another CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_over_tls_with_a_password() {
    use shardline::dev_certs::DevCa;
    let ca = DevCa::new("test CA").expect("a CA");
    let other = DevCa::new("another CA").expect("a CA");
    let cert = ca.node("localhost", 1).expect("a certificate");
    let mut dir = std::path::PathBuf::new();
    let server = ServerProcess::nats_with(|d| {
        dir = d.to_path_buf();
        std::fs::write(d.join("server.pem"), &cert.cert).unwrap();
        std::fs::write(d.join("server.key"), &cert.key).unwrap();
        std::fs::write(d.join("ca.pem"), &ca.pem().cert).unwrap();
        std::fs::write(d.join("other.pem"), &other.pem().cert).unwrap();
        let at = |f: &str| d.join(f).display().to_string();
        ["--tls", "--tlscert", &at("server.pem"), "--tlskey", &at("server.key"), "--user", "shard", "--pass", "p@ss"]
            .map(String::from)
            .to_vec()
    })
    .expect("nats-server starts");
    let port = server.addr.rsplit_once(':').map(|(_, p)| p.to_string()).unwrap();
    let ca_pem = dir.join("ca.pem").display().to_string();
    let connect = |url: String| async move {
        NatsStore::connect(&url, "tls", Duration::from_secs(2), Duration::from_secs(3)).await.map(drop)
    };
    connect(format!("nats://shard:p%40ss@localhost:{port}?ca={ca_pem}")).await.expect("TLS and the password");
    let store = NatsStore::connect(
        &format!("tls://shard:p%40ss@localhost:{port}?ca={ca_pem}"),
        "tls",
        Duration::from_secs(2),
        Duration::from_secs(3),
    )
    .await
    .expect("tls://");
    store.compare_and_put("k", b"v".to_vec(), 0).await.expect("a write");
    assert_eq!(store.get("k").await.unwrap().map(|e| e.value), Some(b"v".to_vec()));
    for refused in [
        format!("nats://shard:wrong@localhost:{port}?ca={ca_pem}"),
        format!("nats://localhost:{port}?ca={ca_pem}"),
        format!("nats://shard:p%40ss@localhost:{port}"),
        format!("nats://shard:p%40ss@localhost:{port}?ca={}", dir.join("other.pem").display()),
    ] {
        assert!(connect(refused.clone()).await.is_err(), "{refused}");
    }
}
