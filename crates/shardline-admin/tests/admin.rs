//! The admin API over real HTTP on 127.0.0.1, against an in-process node.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use shardline::{Cluster, Entity, EntityContext, EntityId, EntitySettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Serialize, Deserialize)]
struct Ping;

struct Echo;

impl Entity for Echo {
    type Message = Ping;
    type Reply = u8;
    fn new(_: &EntityId) -> Self {
        Echo
    }
    async fn handle(&mut self, _: &mut EntityContext, _: Ping) -> u8 {
        1
    }
}

/// One HTTP/1.1 request on a connection of its own: the status and the body.
async fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, body.to_string())
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// A node with one entity type, named as its cluster (the tests of this binary share one metrics
/// recorder), and its admin API; returns the API's address.
async fn node(name: &str, metrics: Option<metrics_exporter_prometheus::PrometheusHandle>) -> (Cluster, SocketAddr) {
    let c = Cluster::builder().cluster_name(name).build().await.unwrap();
    c.register::<Echo>(EntitySettings::new(name).shards(16)).await.unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(shardline_admin::serve(l, shardline_admin::router(c.clone(), metrics, None)));
    (c, addr)
}

async fn ready_within(addr: SocketAddr, limit: Duration) -> Value {
    let start = Instant::now();
    loop {
        let (status, body) = request(addr, "GET", "/health/ready").await;
        if status == 200 {
            return json(&body);
        }
        assert_eq!(status, 503, "{body}");
        assert!(json(&body)["error"].as_str().is_some_and(|e| e.starts_with("not ready")), "{body}");
        assert!(start.elapsed() < limit, "not ready within {limit:?}: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_once_up_with_its_shards_and_not_while_leaving() {
    let (c, addr) = node("admin-ready", None).await;
    let (status, body) = request(addr, "GET", "/health/live").await;
    assert_eq!((status, json(&body)["status"].as_str()), (200, Some("live")));
    let ready = ready_within(addr, Duration::from_secs(10)).await;
    assert_eq!(ready["status"], "Up");
    // A lone node is given every shard of its type, and has started them all.
    assert_eq!((ready["shards_given"].as_u64(), ready["shards_started"].as_u64()), (Some(16), Some(16)));
    c.leave().await.unwrap();
    let (status, body) = request(addr, "GET", "/health/ready").await;
    assert_eq!(status, 503, "a node that left is not ready: {body}");
    assert!(json(&body)["error"].as_str().is_some_and(|e| e.contains("not ready")), "{body}");
    // Alive still: it serves.
    assert_eq!(request(addr, "GET", "/health/live").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_paths_and_methods_are_json_errors_and_the_node_keeps_serving() {
    let (_c, addr) = node("admin-bad", None).await;
    let (status, body) = request(addr, "GET", "/no/such/path").await;
    assert_eq!(status, 404);
    assert_eq!(json(&body)["error"], "no such path");
    let (status, body) = request(addr, "POST", "/health/live").await;
    assert_eq!(status, 405);
    assert!(json(&body)["error"].as_str().is_some(), "{body}");
    // Without a recorder, metrics are a 503 that says why, not an empty page.
    let (status, body) = request(addr, "GET", "/metrics").await;
    assert_eq!(status, 503);
    assert!(json(&body)["error"].as_str().is_some_and(|e| e.contains("no metrics")), "{body}");
    // A request line that is not HTTP closes that connection only.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"\x00\x01garbage\r\n\r\n").await.unwrap();
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut sink)).await.unwrap();
    assert_eq!(request(addr, "GET", "/health/live").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_render_what_the_runtime_counts() {
    // The only test in this binary that installs the process's recorder.
    let handle = shardline_admin::install_prometheus().unwrap();
    assert!(shardline_admin::install_prometheus().is_err(), "a second recorder is refused");
    let (c, addr) = node("admin-metrics", Some(handle)).await;
    // A peer that completes the handshake and then sends an unknown frame kind: the transport
    // closes that connection and counts a bad frame.
    let mut s = TcpStream::connect(c.local_addr()).await.unwrap();
    let mut hello = Vec::new();
    shardline::transport::Wire::<()>::Hello {
        protocol: shardline::transport::PROTOCOL_VERSION,
        cluster: "admin-metrics".into(),
        from: shardline::NodeId::new("probe", 1),
        listen: "127.0.0.1:9".parse().unwrap(),
        to: None,
        newest: shardline::transport::PROTOCOL_VERSION,
    }
    .encode_into(&mut hello)
    .unwrap();
    s.write_all(&hello).await.unwrap();
    s.write_all(&[0, 0, 0, 6, 250, 251, 252, 253, 254, 255]).await.unwrap();
    let start = Instant::now();
    loop {
        let (status, body) = request(addr, "GET", "/metrics").await;
        assert_eq!(status, 200);
        if body.lines().any(|l| l.starts_with("shardline_transport_bad_frames_total ") && !l.ends_with(" 0")) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the bad frame was never counted:\n{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What the node hosts, read at the scrape.
    ready_within(addr, Duration::from_secs(10)).await;
    let echo = c.handle::<Echo>().unwrap();
    let counted = |body: &str, outcome: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("shardline_asks_total{{outcome=\"{outcome}\"}} ")))
            .and_then(|n| n.parse::<u64>().ok())
    };
    let before = counted(&request(addr, "GET", "/metrics").await.1, "ok").expect("asks are counted");
    echo.entity_ref("a").ask(Ping).await.unwrap();
    echo.entity_ref("b").ask(Ping).await.unwrap();
    // Enough asks that some are timed (one in 64 per thread).
    for i in 0..300 {
        echo.entity_ref(format!("many-{}", i % 5)).ask(Ping).await.unwrap();
    }
    let (_, body) = request(addr, "GET", "/metrics").await;
    assert!(counted(&body, "ok").is_some_and(|n| n >= before + 302), "{body}");
    assert_eq!(counted(&body, "timeout"), Some(0), "{body}");
    let timed =
        body.lines().find_map(|l| l.strip_prefix("shardline_ask_seconds_count ")).and_then(|n| n.parse::<u64>().ok());
    assert!(timed.is_some_and(|n| n >= 300 / 64 - 1), "{body}");
    assert!(body.lines().any(|l| l.starts_with("shardline_ask_seconds_bucket{le=\"+Inf\"} ")), "{body}");
    for line in
        ["shardline_shards_hosted{type=\"admin-metrics\"} 16", "shardline_entities_in_memory{type=\"admin-metrics\"} 7"]
    {
        assert!(body.lines().any(|l| l == line), "no line {line} in:\n{body}");
    }
    // Leaving stops every shard here, each counted with how long its entities took to stop.
    c.leave().await.unwrap();
    let (_, body) = request(addr, "GET", "/metrics").await;
    // At least once each: a last node's leave sometimes stops its shards twice (see the design
    // notes, "The admin API, first part").
    let stops = body
        .lines()
        .find_map(|l| l.strip_prefix("shardline_shard_stops_total{type=\"admin-metrics\"} "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(stops.is_some_and(|n| n >= 16), "{body}");
    assert!(body.lines().any(|l| l.starts_with("shardline_shard_stop_seconds")), "{body}");
    assert!(body.lines().any(|l| l == "shardline_shards_hosted{type=\"admin-metrics\"} 0"), "{body}");
}
