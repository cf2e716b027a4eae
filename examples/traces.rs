//! One trace across two nodes, exported over OTLP/HTTP.
//!
//! Node `a` asks a `Front` entity that lives on node `b`; it asks a `Back` entity that lives on
//! `a`, whose handler opens a span of its own. Every span goes to a collector with the caller's
//! trace id, and each names its parent, so the collector sees one tree:
//!
//! ```text
//! trace c6a7989aac22e51fa92610615dadd562  (5 spans on 2 nodes)
//! ask front f2 on a 1195 µs
//!   handle front f2 on b 660 µs
//!     ask back k0 on b 604 µs
//!       handle back k0 on a 92 µs
//!         lookup 8 µs
//! ```
//!
//! The collector here is a few lines that take OTLP/HTTP JSON, so the example runs on its own;
//! point `OtlpConfig::new` at a real one (the OpenTelemetry Collector, Jaeger or Tempo on port
//! 4318) to see the same tree in its UI. Run with
//! `cargo run -p shardline-otlp --example traces`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline::{Cluster, Entity, EntityContext, EntityHandle, EntityId, EntitySettings, Gossip};
use tracing_subscriber::prelude::*;

#[derive(Debug, Serialize, Deserialize)]
pub struct Relay(pub String);

/// Asks the `Back` entity its message names, and answers what it answered.
pub struct Front;

impl Entity for Front {
    type Message = Relay;
    type Reply = String;

    fn new(_id: &EntityId) -> Self {
        Front
    }

    async fn handle(&mut self, ctx: &mut EntityContext, Relay(to): Relay) -> String {
        let Some(back) = ctx.entities().handle::<Back>() else { return "no Back type here".into() };
        back.entity_ref(to).ask(()).await.unwrap_or_else(|e| e.to_string())
    }
}

/// Answers its own id, from inside an application span.
pub struct Back;

impl Entity for Back {
    type Message = ();
    type Reply = String;

    fn new(_id: &EntityId) -> Self {
        Back
    }

    async fn handle(&mut self, ctx: &mut EntityContext, (): ()) -> String {
        tracing::debug_span!(target: "traces", "lookup").in_scope(|| ctx.id().to_string())
    }
}

/// The spans a collector received, as OTLP JSON.
pub type Received = Arc<Mutex<Vec<serde_json::Value>>>;

/// A stand-in for an OpenTelemetry collector: takes OTLP/HTTP JSON posts on 127.0.0.1.
pub fn collector() -> std::io::Result<(String, Received)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let received: Received = Arc::default();
    let spans = received.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut r = BufReader::new(conn);
            let mut len = 0;
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 2) {
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; len];
            let ok = r.read_exact(&mut body).is_ok();
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
                let all = v["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().cloned().unwrap_or_default();
                spans.lock().unwrap_or_else(|e| e.into_inner()).extend(all);
            }
            let status = if ok { "200 OK" } else { "400 Bad Request" };
            let _ = write!(r.get_mut(), "HTTP/1.1 {status}\r\nContent-Length: 2\r\n\r\n{{}}");
        }
    });
    Ok((endpoint, received))
}

/// A node with both types registered.
type Node = (Cluster, EntityHandle<Front>, EntityHandle<Back>);

async fn node(name: &str, seed: Option<std::net::SocketAddr>) -> Result<Node, Box<dyn std::error::Error>> {
    let mut b = Cluster::builder().cluster_name("traces").node_name(name);
    if let Some(s) = seed {
        b = b.membership(Gossip::new([s.to_string()]));
    }
    let c = b.build().await?;
    let front = c.register::<Front>(EntitySettings::new("front").shards(8)).await?;
    let back = c.register::<Back>(EntitySettings::new("back").shards(8)).await?;
    Ok((c, front, back))
}

/// An id of a `prefix…` entity whose shard lives on `node`, once both nodes host shards.
async fn id_on<E: Entity>(h: &EntityHandle<E>, prefix: &str, node: &str) -> String {
    loop {
        let homes = h.shard_homes();
        let on = |id: &String| homes[h.shard_of(id).index()].as_ref().is_some_and(|n| &*n.name == node);
        let everywhere =
            homes.iter().flatten().any(|n| &*n.name == "a") && homes.iter().flatten().any(|n| &*n.name == "b");
        if everywhere && homes.iter().all(Option::is_some) {
            if let Some(id) = (0..1000).map(|i| format!("{prefix}{i}")).find(on) {
                return id;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the two nodes and the ask; returns the spans of its trace, as the collector got them.
pub async fn run() -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error>> {
    let (endpoint, received) = collector()?;
    let (otlp, guard) = shardline_otlp::layer(shardline_otlp::OtlpConfig::new(&endpoint, "traces-example")?)?;
    let traced = tracing_subscriber::filter::Targets::new()
        .with_target("shardline::trace", tracing::Level::DEBUG)
        .with_target("traces", tracing::Level::DEBUG);
    tracing_subscriber::registry().with(otlp.with_filter(traced)).try_init()?;

    let (a, front, back) = node("a", None).await?;
    let (_b, ..) = node("b", Some(a.local_addr())).await?;
    let f = tokio::time::timeout(Duration::from_secs(60), id_on(&front, "f", "b")).await?;
    let k = tokio::time::timeout(Duration::from_secs(60), id_on(&back, "k", "a")).await?;
    let answer = front.entity_ref(&f).ask(Relay(k.clone())).await?;
    assert_eq!(answer, k, "the answer came back through both nodes");
    guard.flush(Duration::from_secs(10))?;
    if guard.lost() > 0 {
        return Err(format!("{} spans lost on the way to the collector", guard.lost()).into());
    }

    let spans = received.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let first = spans
        .iter()
        .find(|s| s["name"] == "ask" && attr(s, "entity") == f)
        .ok_or("the first ask's span was not exported")?;
    let trace = first["traceId"].clone();
    Ok(spans.into_iter().filter(|s| s["traceId"] == trace).collect())
}

/// A span's attribute, as text.
pub fn attr<'a>(span: &'a serde_json::Value, key: &str) -> &'a str {
    let all = span["attributes"].as_array().map(Vec::as_slice).unwrap_or_default();
    all.iter().find(|a| a["key"] == key).and_then(|a| a["value"]["stringValue"].as_str()).unwrap_or("")
}

/// Prints the trace as a tree, each span under its parent.
pub fn print(spans: &[serde_json::Value]) {
    let mut children: HashMap<&str, Vec<&serde_json::Value>> = HashMap::new();
    for s in spans {
        children.entry(s["parentSpanId"].as_str().unwrap_or("")).or_default().push(s);
    }
    let ids: Vec<&str> = spans.iter().filter_map(|s| s["spanId"].as_str()).collect();
    let nodes: std::collections::HashSet<&str> =
        spans.iter().map(|s| attr(s, "node")).filter(|n| !n.is_empty()).collect();
    let trace = spans.first().and_then(|s| s["traceId"].as_str()).unwrap_or("");
    println!("trace {trace}  ({} spans on {} nodes)", spans.len(), nodes.len());
    // Roots: spans whose parent is not in the trace (the first caller's).
    let mut stack: Vec<(&serde_json::Value, usize)> =
        spans.iter().filter(|s| !ids.contains(&s["parentSpanId"].as_str().unwrap_or(""))).map(|s| (s, 0)).collect();
    while let Some((s, depth)) = stack.pop() {
        let nanos = |k: &str| s[k].as_str().and_then(|t| t.parse::<u128>().ok()).unwrap_or(0);
        let micros = nanos("endTimeUnixNano").saturating_sub(nanos("startTimeUnixNano")) / 1000;
        let mut line = vec![s["name"].as_str().unwrap_or("?").to_string()];
        line.extend(
            [attr(s, "entity_type"), attr(s, "entity")].iter().filter(|a| !a.is_empty()).map(|a| a.to_string()),
        );
        if let Some(node) = attr(s, "node").split('#').next().filter(|n| !n.is_empty()) {
            line.push(format!("on {node}"));
        }
        println!("{:indent$}{} {micros} µs", "", line.join(" "), indent = depth * 2);
        if let Some(c) = s["spanId"].as_str().and_then(|id| children.get(id)) {
            stack.extend(c.iter().map(|c| (*c, depth + 1)));
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spans = run().await?;
    print(&spans);
    // caller, entity on b, its ask, the entity on a, and the application's span inside it.
    if spans.len() != 5 {
        return Err(format!("the trace has {} spans, not 5", spans.len()).into());
    }
    Ok(())
}
