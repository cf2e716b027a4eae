//! Traces across nodes: an ask from node `a` to an entity on node `b`, which asks on to an entity
//! on `a`, is one trace. Every span (`ask` at each caller, `handle` at each entity) carries the
//! first caller's trace id, and each names its parent: caller, entity, caller, entity, across
//! two real connections. A tell is traced the same way, and a trace a caller brings in (a
//! `traceparent` header) is the one the entities join.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::eventually;
use serde::{Deserialize, Serialize};
use shardline::{Cluster, Entity, EntityContext, EntityHandle, EntityId, EntitySettings, Gossip, TraceContext};
use tracing::span::{Attributes, Id, Record};
use tracing::{Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// A span as the subscriber saw it: its name and fields.
#[derive(Clone, Debug)]
struct Seen {
    name: &'static str,
    fields: HashMap<&'static str, String>,
}

impl Seen {
    fn get(&self, field: &str) -> &str {
        self.fields.get(field).map_or("", String::as_str)
    }
}

/// Keeps every span of `shardline::trace`, by id.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<HashMap<u64, Seen>>>);

struct Fields<'a>(&'a mut HashMap<&'static str, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name(), value.to_string());
    }
}

impl<S: Subscriber> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut seen = Seen { name: attrs.metadata().name(), fields: HashMap::new() };
        attrs.record(&mut Fields(&mut seen.fields));
        self.0.lock().unwrap().insert(id.into_u64(), seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(seen) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }
}

/// The one recorder of this test binary.
fn recorder() -> &'static Recorder {
    static RECORDER: OnceLock<Recorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let r = Recorder::default();
        tracing_subscriber::registry()
            .with(r.clone().with_filter(Targets::new().with_target("shardline::trace", Level::DEBUG)))
            .init();
        r
    })
}

/// The spans recorded for `entity`, by name.
fn spans(entity: &str, name: &str) -> Vec<Seen> {
    let all = recorder().0.lock().unwrap();
    all.values().filter(|s| s.name == name && s.get("entity") == entity).cloned().collect()
}

/// The one span named `name` of `entity`.
fn one(entity: &str, name: &str) -> Seen {
    let found = spans(entity, name);
    assert_eq!(found.len(), 1, "one {name} span of {entity}: {found:?}");
    found.into_iter().next().unwrap_or_else(|| unreachable!())
}

#[derive(Debug, Serialize, Deserialize)]
enum Relay {
    /// Asks the `Back` entity of that id, and answers its answer.
    To(String),
    /// Tells it.
    Tell(String),
}

struct Front;

impl Entity for Front {
    type Message = Relay;
    type Reply = String;

    fn new(_id: &EntityId) -> Self {
        Front
    }

    async fn handle(&mut self, ctx: &mut EntityContext, msg: Relay) -> String {
        let Some(back) = ctx.entities().handle::<Back>() else { return "no Back type".into() };
        match msg {
            Relay::To(id) => back.entity_ref(id).ask(()).await.unwrap_or_else(|e| e.to_string()),
            Relay::Tell(id) => back.entity_ref(id).tell(()).map_or_else(|e| e.to_string(), |()| "told".into()),
        }
    }
}

struct Back;

impl Entity for Back {
    type Message = ();
    type Reply = String;

    fn new(_id: &EntityId) -> Self {
        Back
    }

    async fn handle(&mut self, ctx: &mut EntityContext, (): ()) -> String {
        ctx.id().to_string()
    }
}

async fn node(name: &str, seed: Option<std::net::SocketAddr>) -> (Cluster, EntityHandle<Front>, EntityHandle<Back>) {
    let mut b = Cluster::builder().cluster_name("traces").node_name(name);
    if let Some(s) = seed {
        b = b.membership(Gossip::new([s.to_string()]));
    }
    let c = b.build().await.expect("node starts");
    let front = c.register::<Front>(EntitySettings::new("front").shards(8)).await.expect("registers");
    let back = c.register::<Back>(EntitySettings::new("back").shards(8)).await.expect("registers");
    (c, front, back)
}

/// An id whose shard `h` sees at home on `node`.
fn id_on<E: Entity>(h: &EntityHandle<E>, prefix: &str, node: &str) -> String {
    let homes = h.shard_homes();
    (0..10_000)
        .map(|i| format!("{prefix}{i}"))
        .find(|id| homes[h.shard_of(id).index()].as_ref().is_some_and(|n| &*n.name == node))
        .unwrap_or_else(|| panic!("no {prefix} id at home on {node}"))
}

/// Waits until both types have shards at home on both nodes (as `a` sees them).
async fn spread(front: &EntityHandle<Front>, back: &EntityHandle<Back>) {
    let (f, b) = (front.clone(), back.clone());
    eventually("both nodes host both types", Duration::from_secs(60), move || {
        let on = |homes: Vec<Option<shardline::NodeId>>, n: &str| {
            homes.iter().all(Option::is_some) && homes.iter().flatten().any(|h| &*h.name == n)
        };
        on(f.shard_homes(), "a") && on(f.shard_homes(), "b") && on(b.shard_homes(), "a") && on(b.shard_homes(), "b")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_caller_through_entities_on_two_nodes() {
    recorder();
    let (a, front, back) = node("a", None).await;
    let (_b, _, _) = node("b", Some(a.local_addr())).await;
    spread(&front, &back).await;
    // `a` asks a front entity on `b`, which asks a back entity on `a`.
    let (f, k) = (id_on(&front, "f", "b"), id_on(&back, "k", "a"));
    assert_eq!(front.entity_ref(&f).ask(Relay::To(k.clone())).await.unwrap(), k);

    let ask = one(&f, "ask");
    let trace = ask.get("trace_id").to_string();
    assert_eq!(trace.len(), 32, "{ask:?}");
    assert_eq!(ask.get("node").split('#').next(), Some("a"), "{ask:?}");
    assert_eq!(ask.get("parent_id"), "", "the first caller starts the trace: {ask:?}");
    let handle = one(&f, "handle");
    assert_eq!(handle.get("node").split('#').next(), Some("b"), "{handle:?}");
    assert_eq!(handle.get("trace_id"), trace, "the entity on b joins the caller's trace: {handle:?}");
    assert_eq!(handle.get("parent_id"), ask.get("span_id"), "{handle:?}");
    let nested = one(&k, "ask");
    assert_eq!(nested.get("node").split('#').next(), Some("b"), "{nested:?}");
    assert_eq!(nested.get("trace_id"), trace, "{nested:?}");
    assert_eq!(nested.get("parent_id"), handle.get("span_id"), "the entity's ask is its child: {nested:?}");
    let last = one(&k, "handle");
    assert_eq!(last.get("node").split('#').next(), Some("a"), "{last:?}");
    assert_eq!(last.get("trace_id"), trace, "back across to a, still one trace: {last:?}");
    assert_eq!(last.get("parent_id"), nested.get("span_id"), "{last:?}");
    let ids = [&ask, &handle, &nested, &last].map(|s| s.get("span_id").to_string());
    assert!(ids.iter().all(|i| i.len() == 16) && ids.iter().collect::<std::collections::HashSet<_>>().len() == 4);
    let kinds = [&ask, &handle, &nested, &last].map(|s| s.get("otel.kind").to_string());
    assert_eq!(kinds, ["client", "server", "client", "server"], "OpenTelemetry's kinds, as bridges read them");

    // A tell, inside a trace the caller brought in (say, from an HTTP request's header).
    let (f2, k2) = (id_on(&front, "g", "b"), id_on(&back, "m", "a"));
    let incoming = TraceContext::from_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    let answer = incoming.scope(front.entity_ref(&f2).ask(Relay::Tell(k2.clone()))).await;
    assert_eq!(answer.unwrap(), "told");
    let k2b = k2.clone();
    eventually("the tell is handled", Duration::from_secs(10), move || !spans(&k2b, "handle").is_empty()).await;
    let asked = one(&f2, "ask");
    assert_eq!(asked.get("trace_id"), "4bf92f3577b34da6a3ce929d0e0e4736", "{asked:?}");
    assert_eq!(asked.get("parent_id"), "00f067aa0ba902b7", "{asked:?}");
    let told = one(&k2, "tell");
    assert_eq!(told.get("parent_id"), one(&f2, "handle").get("span_id"), "{told:?}");
    let handled = one(&k2, "handle");
    assert_eq!(handled.get("trace_id"), "4bf92f3577b34da6a3ce929d0e0e4736", "{handled:?}");
    assert_eq!(handled.get("parent_id"), told.get("span_id"), "{handled:?}");
    assert_eq!(handled.get("node").split('#').next(), Some("a"), "{handled:?}");
    assert_eq!([told.get("otel.kind"), handled.get("otel.kind")], ["producer", "consumer"], "nobody waits on a tell");

    // An unsampled trace (flags 00) goes through both nodes and opens no span on either: the
    // decision of the node where it started travels with it.
    let (f3, k3) = (id_on(&front, "u", "b"), id_on(&back, "v", "a"));
    let unsampled = TraceContext::from_traceparent("00-5bf92f3577b34da6a3ce929d0e0e4736-10f067aa0ba902b7-00").unwrap();
    assert_eq!(unsampled.scope(front.entity_ref(&f3).ask(Relay::To(k3.clone()))).await.unwrap(), k3);
    for (entity, name) in [(&f3, "ask"), (&f3, "handle"), (&k3, "ask"), (&k3, "handle")] {
        assert!(spans(entity, name).is_empty(), "an unsampled trace opened a {name} span of {entity}");
    }
}
