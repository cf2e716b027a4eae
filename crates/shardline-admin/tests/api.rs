//! The cluster endpoints over real HTTP, against in-process nodes on 127.0.0.1 that form a
//! cluster by gossip: any node answers for the whole cluster, drains, rebalances, streams events.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use shardline::{Cluster, Entity, EntityContext, EntityId, EntitySettings, Gossip};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
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

const SHARDS: u32 = 16;

/// One HTTP/1.1 request on a connection of its own: the status and the body.
async fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let (status, _, body) = request_with(addr, method, path, "").await;
    (status, body)
}

/// A request with `headers` (each ending in CRLF): the status, the head and the body.
async fn request_with(addr: SocketAddr, method: &str, path: &str, headers: &str) -> (u16, String, String) {
    exchange(addr, method, path, headers, "").await
}

/// A request with `headers` and `body`, on a connection of its own: the status, the head and the
/// body of the answer (a status of 0 when none could be read).
async fn exchange(addr: SocketAddr, method: &str, path: &str, headers: &str, body: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    // A server may answer before it has read a body it refuses; the write may then fail.
    let _ = s.write_all(body.as_bytes()).await;
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw).await;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

async fn get_json(addr: SocketAddr, path: &str) -> (u16, Value) {
    let (status, body) = request(addr, "GET", path).await;
    (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body}")))
}

/// A node of cluster `cluster` (joining by `seed`) with one entity type, and its admin API.
async fn node(cluster: &str, name: &str, seed: Option<SocketAddr>) -> (Cluster, SocketAddr) {
    node_with_token(cluster, name, seed, None).await
}

async fn node_with_token(
    cluster: &str,
    name: &str,
    seed: Option<SocketAddr>,
    token: Option<shardline_admin::AdminToken>,
) -> (Cluster, SocketAddr) {
    // Drains, rebalances and assignments asked of one node travel to another: every node holds
    // the cluster's admin secret, as the docs ask.
    let b = Cluster::builder().cluster_name(cluster).node_name(name).admin_secret("the-admin-secret-of-these-tests");
    let b = match seed {
        Some(s) => b.membership(Gossip::new([s.to_string()])),
        None => b,
    };
    let c = b.build().await.unwrap();
    c.register::<Echo>(EntitySettings::new("echo").shards(SHARDS)).await.unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(shardline_admin::serve(l, shardline_admin::router(c.clone(), None, token)));
    (c, addr)
}

async fn three(cluster: &str) -> Vec<(Cluster, SocketAddr)> {
    let a = node(cluster, "a", None).await;
    let seed = Some(a.0.local_addr());
    let b = node(cluster, "b", seed).await;
    let c = node(cluster, "c", seed).await;
    vec![a, b, c]
}

/// Polls `path` on `addr` until `cond` holds of its JSON; panics with the last answer after 30 s.
async fn until(addr: SocketAddr, path: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let (status, v) = get_json(addr, path).await;
        if status == 200 && cond(&v) {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{what}: last answer {status} {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn members_up_with_shards(v: &Value, names: &[&str]) -> bool {
    let Some(members) = v["members"].as_array() else { return false };
    let up: Vec<&str> = members.iter().filter(|m| m["status"] == "Up").filter_map(|m| m["name"].as_str()).collect();
    let shards: u64 = members.iter().filter_map(|m| m["shards"].as_u64()).sum();
    up.len() == names.len() && names.iter().all(|n| up.contains(n)) && shards == u64::from(SHARDS)
}

fn owners(map: &Value) -> Vec<String> {
    map["shards"]
        .as_array()
        .map_or(Vec::new(), |s| s.iter().map(|s| s["node"].as_str().unwrap_or("-").to_string()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_answers_for_the_whole_cluster() {
    let nodes = three("admin-any").await;
    // Asked of the last to join, which does not lead.
    let addr = nodes[2].1;
    // Asked until what the members say they host agrees with the leader's map: a join moves
    // shards for a moment after every member is up.
    let start = Instant::now();
    let (cluster, map) = loop {
        let cluster = until(addr, "/api/cluster", "three members hosting every shard", |v| {
            members_up_with_shards(v, &["a", "b", "c"])
        })
        .await;
        let (status, map) = get_json(addr, "/api/shards?type=echo").await;
        assert_eq!(status, 200, "{map}");
        let agree = cluster["members"].as_array().unwrap().iter().all(|m| {
            let name = m["name"].as_str().unwrap_or_default();
            m["shards"].as_u64() == Some(owners(&map).iter().filter(|o| *o == name).count() as u64)
        });
        if agree {
            break (cluster, map);
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the counts never agreed with the map: {cluster} vs {map}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(cluster["node"], "c");
    let leader = cluster["leader"].as_str().expect("a leader").to_string();
    assert!(cluster["term"].as_u64().is_some_and(|t| t > 0), "{cluster}");
    assert_eq!(cluster["types"], serde_json::json!(["echo"]));
    for m in cluster["members"].as_array().unwrap() {
        assert!(m["error"].is_null(), "every member answered: {m}");
        assert!(m["entities"].as_u64().is_some() && m["app_version"].is_string() && m["roles"].is_array(), "{m}");
    }

    // The map, from the leader, through c: every shard owned, each with its epoch.
    assert_eq!((map["type"].as_str(), map["leader"].as_str()), (Some("echo"), Some(leader.as_str())));
    assert!(map["version"].as_u64().is_some_and(|v| v > 0));
    let shards = map["shards"].as_array().unwrap();
    assert_eq!(shards.len(), SHARDS as usize);
    for (i, s) in shards.iter().enumerate() {
        assert_eq!(s["shard"].as_u64(), Some(i as u64));
        assert!(s["node"].is_string() && s["epoch"].as_str().is_some_and(|e| e.contains('.')), "{s}");
    }
    // Without a type: the only one registered.
    let (status, same) = get_json(addr, "/api/shards").await;
    assert_eq!((status, same["type"].as_str()), (200, Some("echo")));

    let (status, r) = get_json(addr, "/api/rebalancing?type=echo").await;
    assert_eq!(status, 200, "{r}");
    assert!(r["in_progress"].is_boolean() && r["moved"].is_u64() && r["total"].is_u64(), "{r}");
    let (status, all) = get_json(addr, "/api/rebalancing").await;
    assert_eq!((status, all["types"].as_array().map(Vec::len)), (200, Some(1)), "{all}");

    // Bad input: clear JSON errors, and the node keeps serving.
    let (status, e) = get_json(addr, "/api/shards?type=nope").await;
    assert_eq!(status, 404);
    assert!(e["error"].as_str().is_some_and(|m| m.contains("nope")), "{e}");
    let (status, e) = get_json(addr, "/api/shards?type=echo&type=echo").await;
    assert_eq!(status, 400, "a repeated parameter: {e}");
    assert!(e["error"].is_string());
    let (status, e) = get_json(addr, "/api/rebalancing?type=nope").await;
    assert_eq!((status, e["error"].is_string()), (404, true));
    let (status, e) = get_json(addr, "/api/cluster/extra").await;
    assert_eq!((status, e["error"].is_string()), (404, true));
    let (status, body) = request(addr, "DELETE", "/api/shards").await;
    assert_eq!(status, 405, "{body}");
    let (status, _) = get_json(addr, "/api/cluster").await;
    assert_eq!(status, 200, "still serving");

    // The OpenAPI document names every route the node serves, and each one it names is served.
    let (status, doc) = get_json(addr, "/api/openapi.json").await;
    assert_eq!((status, doc["openapi"].as_str().map(|v| v.starts_with("3."))), (200, Some(true)));
    let paths = doc["paths"].as_object().expect("paths");
    for route in [
        "/",
        "/health/live",
        "/health/ready",
        "/metrics",
        "/api/cluster",
        "/api/shards",
        "/api/rebalancing",
        "/api/rebalance",
        "/api/events",
        "/api/nodes/{name}/drain",
        "/api/openapi.json",
    ] {
        assert!(paths.contains_key(route), "{route} is not documented");
    }
    for (path, methods) in paths {
        for method in methods.as_object().unwrap().keys() {
            if path == "/api/events" || path.contains("drain") {
                continue; // a stream that does not end; a drain that would start
            }
            let (status, body) = request(addr, &method.to_uppercase(), path).await;
            assert!(status != 405 && !body.contains("no such path"), "{method} {path}: {status} {body}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_hands_the_shards_off_and_the_node_leaves() {
    let nodes = three("admin-drain").await;
    let (a, c) = (nodes[0].1, nodes[2].0.clone());
    until(a, "/api/cluster", "three members hosting every shard", |v| members_up_with_shards(v, &["a", "b", "c"]))
        .await;
    let (status, e) = get_json(a, "/api/nodes/ghost/drain").await;
    assert_eq!(status, 405, "drain is a POST: {e}");
    let (status, body) = request(a, "POST", "/api/nodes/ghost/drain").await;
    assert_eq!(status, 404, "{body}");

    // Asked of a, carried out by c.
    let (status, body) = request(a, "POST", "/api/nodes/c/drain").await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = request(a, "POST", "/api/nodes/c/drain").await;
    assert!(status == 409 || status == 404, "a second drain: leaving already, or gone: {status} {body}");
    assert!(body.contains("\"error\""), "{body}");
    tokio::time::timeout(Duration::from_secs(30), c.left()).await.expect("c left in time").expect("c left cleanly");
    let map = until(a, "/api/shards?type=echo", "every shard on a or b", |m| {
        let o = owners(m);
        o.len() == SHARDS as usize && o.iter().all(|n| n == "a" || n == "b")
    })
    .await;
    assert!(owners(&map).iter().any(|n| n == "a") && owners(&map).iter().any(|n| n == "b"), "{map}");
    let (status, body) = request(a, "POST", "/api/nodes/c/drain").await;
    assert_eq!(status, 404, "c is gone: {body}");
}

/// Reads server-sent events from `addr` until `done` holds of the events seen (or 30 s pass).
async fn watch_events(addr: SocketAddr, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut lines = BufReader::new(s).lines();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done(&seen) {
        let line = tokio::time::timeout_at(deadline, lines.next_line()).await;
        let Ok(Ok(Some(line))) = line else { panic!("stream ended or stalled; seen {seen:?}") };
        // Chunked encoding interleaves chunk sizes; the events are the `data:` lines.
        if let Some(data) = line.strip_prefix("data: ") {
            seen.push(serde_json::from_str(data).unwrap_or_else(|e| panic!("event not JSON ({e}): {data}")));
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_the_leader_reach_every_node_and_a_rebalance_is_reported() {
    let nodes = three("admin-events").await;
    let (a, c) = (nodes[0].1, nodes[2].1);
    until(a, "/api/cluster", "three members hosting every shard", |v| members_up_with_shards(v, &["a", "b", "c"]))
        .await;
    let leader = get_json(c, "/api/cluster").await.1["leader"].as_str().unwrap().to_string();
    let watcher_addr = nodes.iter().find(|(n, _)| *n.node_id().name != *leader).unwrap().1;
    // A fourth node joins: the leader moves shards to it, and a node that does not lead tells.
    let watcher = tokio::spawn(watch_events(watcher_addr, |seen| {
        seen.iter().any(|e| e["kind"] == "ShardMigrated") && seen.iter().any(|e| e["kind"] == "RebalancingCompleted")
    }));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _d = node("admin-events", "d", Some(nodes[0].0.local_addr())).await;
    let seen = watcher.await.unwrap();
    let moved = seen.iter().find(|e| e["kind"] == "ShardMigrated").unwrap();
    assert_eq!(moved["type"], "echo");
    assert!(moved["shard"].is_u64() && moved["from"].is_string() && moved["to"]["node"] == "d", "{moved}");
    let r = until(c, "/api/rebalancing?type=echo", "the round done", |r| r["in_progress"] == false).await;
    assert_eq!(r["reason"], "membership", "{r}");
    assert!(r["moved"].as_u64().is_some_and(|m| m > 0) && r["moved"] == r["total"], "{r}");

    // An operator's rebalance of a balanced map: accepted, reported, nothing moves.
    let (status, body) = request(c, "POST", "/api/rebalance?type=echo").await;
    assert_eq!(status, 202, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["type"], "echo");
    let (status, body) = request(c, "POST", "/api/rebalance?type=nope").await;
    assert_eq!(status, 404, "{body}");
}

/// One request with a body and its content type: the status and the JSON answer.
async fn send(addr: SocketAddr, method: &str, path: &str, content_type: &str, body: &str) -> (u16, Value) {
    let (status, _, answer) = exchange(addr, method, path, &format!("Content-Type: {content_type}\r\n"), body).await;
    (status, serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {answer}")))
}

fn assignments(pairs: impl IntoIterator<Item = (u32, &'static str)>) -> String {
    let list: Vec<Value> = pairs.into_iter().map(|(s, n)| serde_json::json!({ "shard": s, "node": n })).collect();
    serde_json::json!({ "assignments": list }).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_assignments_through_the_api_move_shards_and_bad_ones_are_refused_whole() {
    struct Ext;
    impl Entity for Ext {
        type Message = Ping;
        type Reply = u8;
        fn new(_: &EntityId) -> Self {
            Ext
        }
        async fn handle(&mut self, _: &mut EntityContext, _: Ping) -> u8 {
            2
        }
    }
    let nodes = [node("admin-ext", "a", None).await].into_iter().collect::<Vec<_>>();
    let b = node("admin-ext", "b", Some(nodes[0].0.local_addr())).await;
    let ext = EntitySettings::new("ext").shards(SHARDS).strategy(shardline::StrategyKind::External);
    let ha = nodes[0].0.register::<Ext>(ext.clone()).await.unwrap();
    b.0.register::<Ext>(ext).await.unwrap();
    let addr = b.1;
    let all_placed = |m: &Value| {
        let o = owners(m);
        o.len() == SHARDS as usize
            && o.iter().all(|o| o == "a" || o == "b")
            && o.iter().any(|o| o == "a")
            && o.iter().any(|o| o == "b")
    };
    until(addr, "/api/shards?type=ext", "unassigned shards placed on both by the fallback", all_placed).await;

    let (status, r) =
        send(addr, "PUT", "/api/shards?type=ext", "application/json", &assignments((0..8).map(|s| (s, "b")))).await;
    assert_eq!(status, 202, "{r}");
    assert_eq!(r["type"], "ext");
    let (status, r) =
        send(addr, "PUT", "/api/shards?type=ext", "application/json", &assignments((8..16).map(|s| (s, "a")))).await;
    assert_eq!(status, 202, "{r}");
    let wanted: Vec<String> = (0..SHARDS).map(|s| if s < 8 { "b".into() } else { "a".into() }).collect();
    until(addr, "/api/shards?type=ext", "the shards where they were assigned", |m| owners(m) == wanted).await;
    // They serve there.
    assert_eq!(ha.entity_ref("x").ask(Ping).await.unwrap(), 2);

    // Refused whole: the valid first pair of a bad body is not taken either.
    let refused = [
        (assignments([(0, "a"), (99, "a")]), "application/json", 422),
        (assignments([(0, "a"), (1, "ghost")]), "application/json", 422),
        (assignments([]), "application/json", 422),
        ("{\"assignments\": [".to_string(), "application/json", 400),
        ("{\"assignments\": [{\"shard\": -1, \"node\": \"a\"}]}".to_string(), "application/json", 422),
        ("{\"assignments\": [], \"extra\": 1}".to_string(), "application/json", 422),
        (assignments([(0, "a")]), "text/plain", 415),
        (
            format!("{{\"assignments\": [], \"pad\": \"{}\"}}", "x".repeat(shardline_admin::MAX_BODY)),
            "application/json",
            413,
        ),
    ];
    for (body, content_type, want) in refused {
        let (status, e) = send(addr, "PUT", "/api/shards?type=ext", content_type, &body).await;
        assert_eq!(status, want, "{}: {e}", &body[..body.len().min(80)]);
        assert!(e["error"].is_string(), "{e}");
    }
    let (status, e) = send(addr, "PUT", "/api/shards?type=echo", "application/json", &assignments([(0, "a")])).await;
    assert_eq!(status, 422, "echo does not take assignments: {e}");
    let (status, _) = send(addr, "PUT", "/api/shards?type=nope", "application/json", &assignments([(0, "a")])).await;
    assert_eq!(status, 404);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, map) = get_json(addr, "/api/shards?type=ext").await;
    assert_eq!((status, owners(&map)), (200, wanted), "nothing of the refused bodies was taken");
}

/// With a token, acting and following the events need it (401 JSON otherwise); reads do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_and_the_event_stream_need_the_token() {
    let secret = "a-long-enough-admin-token";
    let token = shardline_admin::AdminToken::new(secret).unwrap();
    let (_c, addr) = node_with_token("admin-auth", "a", None, Some(token)).await;
    until(addr, "/api/cluster", "the node up", |v| members_up_with_shards(v, &["a"])).await;
    let right = format!("Authorization: Bearer {secret}\r\n");
    let wrong = format!("Authorization: Bearer {secret}x\r\n");
    let acts = [
        ("POST", "/api/rebalance?type=echo"),
        ("POST", "/api/nodes/nobody/drain"),
        ("PUT", "/api/shards?type=echo"),
        ("GET", "/api/events"),
    ];
    for (method, path) in acts {
        for (what, header) in [("no token", ""), ("a wrong token", wrong.as_str()), ("a bare token", secret)] {
            let header = if header == secret { format!("Authorization: {secret}\r\n") } else { header.to_string() };
            let (status, head, body) = request_with(addr, method, path, &header).await;
            assert_eq!(status, 401, "{method} {path} with {what}: {body}");
            assert!(head.to_ascii_lowercase().contains("www-authenticate: bearer"), "{head}");
            let v: Value = serde_json::from_str(&body).unwrap();
            assert!(v["error"].as_str().is_some_and(|e| e.contains("bearer token")), "{v}");
            assert!(!body.contains(secret), "the answer never repeats the token");
        }
    }
    // With it: the actions run (an unknown node is the cluster's own 404).
    let (status, _, body) = request_with(addr, "POST", "/api/rebalance?type=echo", &right).await;
    assert_eq!(status, 202, "{body}");
    let (status, _, body) = request_with(addr, "POST", "/api/nodes/nobody/drain", &right).await;
    assert_eq!(status, 404, "{body}");
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET /api/events HTTP/1.1\r\nHost: {addr}\r\n{right}\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut first = String::new();
    BufReader::new(s).read_line(&mut first).await.unwrap();
    assert!(first.contains(" 200 "), "the stream opens with the token: {first}");
    // Reads stay open: probes and scrapers carry no secret.
    for path in ["/api/cluster", "/api/shards?type=echo", "/api/rebalancing", "/health/live", "/"] {
        assert_eq!(request(addr, "GET", path).await.0, 200, "{path}");
    }
}
