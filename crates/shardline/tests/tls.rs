//! Mutual TLS between real nodes on real sockets: a TLS cluster serves, and refuses a plain-TCP
//! peer, a certificate of another CA, an expired certificate and a certificate for another node
//! name, each with one log line on the refusing node, which keeps serving its good peers.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use common::*;
use shardline::transport::tls::dev::{DevCa, Pem};
use shardline::transport::{TlsConfig, Transport};
use shardline::{Cluster, ConfigError, EntityHandle, NodeId, TransportConfig, TransportError};

/// Everything the nodes of this test binary log.
fn captured() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .try_init()
            .expect("the only subscriber of this test binary");
        log
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut log = self.0.lock().unwrap();
        log.extend_from_slice(buf);
        // Also to the test's own output, where a failure shows it.
        print!("{}", String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The lines logged so far that contain `what`.
fn lines(what: &str) -> Vec<String> {
    let log = captured().lock().unwrap();
    String::from_utf8_lossy(&log).lines().filter(|l| l.contains(what)).map(str::to_string).collect()
}

fn tls(pem: &Pem, ca: &DevCa) -> TlsConfig {
    TlsConfig::from_pem(pem.cert.as_bytes(), pem.key.as_bytes(), ca.pem().cert.as_bytes()).unwrap()
}

async fn tls_node(name: &str, seed: Option<SocketAddr>, ca: &DevCa) -> (Cluster, EntityHandle<Log>) {
    let b = Cluster::builder().cluster_name("secure").node_name(name).tls(tls(&ca.node(name, 1).unwrap(), ca));
    node_with(b, seed).await
}

/// A peer that dials `addr` claiming to be node `name`, with `tls` or in plain TCP.
async fn dial_as(addr: SocketAddr, name: &str, tls: Option<TlsConfig>) -> Result<NodeId, TransportError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = TransportConfig { tls, ..TransportConfig::new("secure") };
    let rogue: Transport<()> = Transport::new(NodeId::new(name, 7), &listener, config).unwrap();
    rogue.send_to_address(addr, ()).await
}

/// Asks through `h` for entities all over the cluster (some on the other node).
async fn serves(h: &EntityHandle<Log>, round: u64) {
    for i in 0..16 {
        let reply = h.entity_ref(format!("e{i}")).ask(Cmd::Append(round)).await.expect("the cluster serves");
        assert_eq!(reply.last(), Some(&round));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_refuses_every_peer_it_cannot_trust_and_keeps_serving() {
    captured();
    let ca = DevCa::new("test CA").unwrap();
    let (c1, _h1) = tls_node("n1", None, &ca).await;
    let (_c2, h2) = tls_node("n2", Some(c1.local_addr()), &ca).await;
    all_homed(&h2).await;
    eventually("two members", Duration::from_secs(30), || {
        h2.shard_homes().iter().flatten().any(|n| n.name.as_ref() == "n1")
    })
    .await;
    serves(&h2, 1).await;
    assert!(lines("NO TLS").iter().all(|l| !l.contains("node=n1 ")), "TLS nodes do not warn of plain TCP");

    // A port probe (connects, closes) is no peer: nothing to refuse, nothing logged.
    let before = lines("refusing connection").len();
    drop(tokio::net::TcpStream::connect(c1.local_addr()).await.unwrap());
    serves(&h2, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(lines("refusing connection").len(), before, "a port probe is not logged as a refusal");

    let other_ca = DevCa::new("another CA").unwrap();
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let expired = ca.node_valid("n2", now - 10 * day, now - day).unwrap();
    let cases: Vec<(&str, Option<TlsConfig>, &str)> = vec![
        ("plain TCP", None, "does not speak TLS"),
        ("another CA", Some(tls(&other_ca.node("n2", 1).unwrap(), &ca)), "UnknownIssuer"),
        ("expired", Some(tls(&expired, &ca)), "xpired"),
        ("another node's name", Some(tls(&ca.node("n3", 1).unwrap(), &ca)), "not for node \"n2\""),
    ];
    for (round, (case, config, why)) in cases.into_iter().enumerate() {
        let before = lines("refusing connection").len();
        let refused = dial_as(c1.local_addr(), "n2", config).await;
        assert!(refused.is_err(), "{case}: refused, got {refused:?}");
        eventually(&format!("{case}: the refusal logged"), Duration::from_secs(10), || {
            lines("refusing connection").len() > before
        })
        .await;
        // Anything else the refusal would log is logged by now.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let new: Vec<String> = lines("refusing connection").into_iter().skip(before).collect();
        assert_eq!(new.len(), 1, "{case}: one line on the refusing node: {new:#?}");
        assert!(new[0].contains("WARN") && new[0].contains(why), "{case}: says why ({why}): {}", new[0]);
        serves(&h2, round as u64 + 2).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_tls_says_so_and_refuses_a_tls_peer() {
    captured();
    let c = Cluster::builder().cluster_name("secure").node_name("plain").build().await.unwrap();
    assert!(lines("NO TLS").iter().any(|l| l.contains("node=plain ")), "a plain node warns that it runs without TLS");
    let ca = DevCa::new("test CA").unwrap();
    let before = lines("speaks TLS").len();
    let refused = dial_as(c.local_addr(), "n2", Some(tls(&ca.node("n2", 1).unwrap(), &ca))).await;
    assert!(refused.is_err(), "refused, got {refused:?}");
    eventually("the refusal logged", Duration::from_secs(10), || lines("speaks TLS").len() > before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_to_start_with_a_certificate_for_another_name() {
    captured();
    let ca = DevCa::new("test CA").unwrap();
    let built = Cluster::builder()
        .cluster_name("secure")
        .node_name("n1")
        .tls(tls(&ca.node("n9", 1).unwrap(), &ca))
        .build()
        .await;
    match built {
        Err(ConfigError::Invalid { name: "tls", reason }) => assert!(reason.contains("n1"), "{reason}"),
        Err(e) => panic!("expected a TLS setting error, got {e}"),
        Ok(_) => panic!("a node started with a certificate for another name"),
    }
}

#[test]
fn unreadable_tls_files_are_errors_that_name_them() {
    let missing = TlsConfig::from_files("/nonexistent/n1.pem", "/nonexistent/n1.key", "/nonexistent/ca.pem");
    assert!(missing.is_err_and(|e| e.to_string().contains("/nonexistent/n1.pem")));
    let ca = DevCa::new("test CA").unwrap();
    let pem = ca.node("n1", 1).unwrap();
    let no_key = TlsConfig::from_pem(pem.cert.as_bytes(), b"not a key", ca.pem().cert.as_bytes());
    assert!(no_key.is_err_and(|e| e.to_string().contains("key")));
    let other = ca.node("n2", 1).unwrap();
    let mismatched = TlsConfig::from_pem(pem.cert.as_bytes(), other.key.as_bytes(), ca.pem().cert.as_bytes());
    assert!(mismatched.is_err(), "a key that is not the certificate's is refused");
}
