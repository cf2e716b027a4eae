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

/// An etcd that speaks HTTPS only and requires a user: the store connects with the CA and the
/// password in its URL, and not with a wrong password, without the CA, or trusting another CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_with_a_password() {
    use shardline::dev_certs::DevCa;
    let ca = DevCa::new("test CA").expect("a CA");
    let other = DevCa::new("another CA").expect("a CA");
    let cert = ca.node("localhost", 1).expect("a certificate");
    let mut dir = std::path::PathBuf::new();
    let server = ServerProcess::etcd_with(|d| {
        dir = d.to_path_buf();
        std::fs::write(d.join("server.pem"), &cert.cert).unwrap();
        std::fs::write(d.join("server.key"), &cert.key).unwrap();
        std::fs::write(d.join("ca.pem"), &ca.pem().cert).unwrap();
        std::fs::write(d.join("other.pem"), &other.pem().cert).unwrap();
        Some((d.join("server.pem"), d.join("server.key")))
    })
    .expect("etcd starts");
    let port = server.addr.rsplit_once(':').map(|(_, p)| p.to_string()).unwrap();
    let ca_pem = dir.join("ca.pem").display().to_string();
    let t = Duration::from_secs(3);
    // Turn authentication on, as an operator would (a root user first).
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(std::fs::read(&ca_pem).unwrap()));
    let opts = etcd_client::ConnectOptions::new().with_tls(tls);
    let mut admin =
        etcd_client::Client::connect([format!("https://localhost:{port}")], Some(opts)).await.expect("an admin client");
    admin.user_add("root", "p@ss", None).await.expect("root added");
    admin.user_grant_role("root", "root").await.expect("root's role");
    admin.auth_enable().await.expect("auth on");

    let store = EtcdStore::connect_url(&format!("etcd://root:p%40ss@localhost:{port}?ca={ca_pem}"), t)
        .await
        .expect("TLS and the password");
    store.compare_and_put("k", b"v".to_vec(), 0).await.expect("a write");
    assert_eq!(store.get("k").await.unwrap().map(|e| e.value), Some(b"v".to_vec()));
    let anonymous = EtcdStore::connect_url(&format!("etcd://localhost:{port}?ca={ca_pem}"), t).await;
    let refused = match anonymous {
        Ok(s) => s.get("k").await.map(drop),
        Err(e) => Err(e),
    };
    assert!(refused.is_err(), "no user: no read");
    for url in [
        format!("etcd://root:wrong@localhost:{port}?ca={ca_pem}"),
        format!("etcd://root:p%40ss@localhost:{port}"),
        format!("etcd://root:p%40ss@localhost:{port}?ca={}", dir.join("other.pem").display()),
    ] {
        let r = match EtcdStore::connect_url(&url, t).await {
            Ok(s) => s.get("k").await.map(drop),
            Err(e) => Err(e),
        };
        assert!(r.is_err(), "{url}");
    }
}
