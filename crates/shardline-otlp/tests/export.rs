//! The exporter against a collector over a real connection: the example's trace arrives whole
//! (five spans, one trace id, each under its parent, across both nodes), and a collector that
//! is down costs the spans it would have taken, counted, without a hang.

#[allow(dead_code)]
#[path = "../../../examples/traces.rs"]
mod example;

use std::time::{Duration, Instant};

use example::attr;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_reaches_the_collector_with_every_span_under_its_parent() {
    let spans = example::run().await.expect("the example runs");
    example::print(&spans);
    let find = |name: &str, entity_type: &str| {
        let found: Vec<_> =
            spans.iter().filter(|s| s["name"] == name && attr(s, "entity_type") == entity_type).collect();
        assert_eq!(found.len(), 1, "one {name} of {entity_type}: {spans:#?}");
        found[0].clone()
    };
    let node = |s: &serde_json::Value| attr(s, "node").split('#').next().unwrap_or("").to_string();
    let ask = find("ask", "front");
    let handle = find("handle", "front");
    let nested = find("ask", "back");
    let last = find("handle", "back");
    let lookup = spans.iter().find(|s| s["name"] == "lookup").expect("the application's span").clone();
    assert!(ask.get("parentSpanId").is_none(), "the first caller starts the trace: {ask}");
    for (child, parent) in [(&handle, &ask), (&nested, &handle), (&last, &nested), (&lookup, &last)] {
        assert_eq!(child["parentSpanId"], parent["spanId"], "{child} under {parent}");
    }
    assert_eq!([node(&ask), node(&handle), node(&nested), node(&last)], ["a", "b", "b", "a"]);
    assert_eq!(spans.len(), 5, "{spans:#?}");
    // Kinds as OTLP names them: client, server, client, server, internal.
    let kinds: Vec<_> = [&ask, &handle, &nested, &last, &lookup].iter().map(|s| s["kind"].as_u64()).collect();
    assert_eq!(kinds, [Some(3), Some(2), Some(3), Some(2), Some(1)]);
    // A span lasts from its start to its end; the caller's outlasts the entity's it waited on.
    let nanos = |s: &serde_json::Value, k: &str| s[k].as_str().and_then(|t| t.parse::<u128>().ok()).unwrap_or(0);
    for s in &spans {
        assert!(
            nanos(s, "startTimeUnixNano") > 0 && nanos(s, "endTimeUnixNano") >= nanos(s, "startTimeUnixNano"),
            "{s}"
        );
    }
    assert!(nanos(&ask, "endTimeUnixNano") >= nanos(&handle, "endTimeUnixNano"));
}

#[test]
fn a_collector_that_is_down_loses_the_batch_without_a_hang() {
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let mut config = shardline_otlp::OtlpConfig::new(&format!("http://127.0.0.1:{port}"), "down").expect("an endpoint");
    config.timeout = Duration::from_secs(2);
    let (layer, guard) = shardline_otlp::layer(config).expect("the exporter starts");
    use tracing_subscriber::prelude::*;
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        let ctx = shardline::TraceContext::root();
        let span = tracing::debug_span!("ask", trace_id = %ctx.trace_hex(), span_id = %ctx.span_hex());
        drop(span);
    });
    let start = Instant::now();
    guard.flush(Duration::from_secs(10)).expect("a flush ends even when the collector is down");
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(guard.lost(), 1, "the span the collector did not take is counted");
}
