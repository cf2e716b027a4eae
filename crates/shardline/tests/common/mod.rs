//! A test entity and cluster helpers. Tests wait on conditions with generous deadlines, never on
//! fixed sleeps.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shardline::{Cluster, ClusterBuilder, Entity, EntityContext, EntityHandle, EntityId, EntitySettings, Gossip};

pub static STARTED: AtomicUsize = AtomicUsize::new(0);
pub static STOPPED: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, Serialize, Deserialize)]
pub enum Cmd {
    /// Appends a value; replies with the whole log.
    Append(u64),
    Get,
    Passivate,
    Sleep(u64),
}

/// Keeps the values it received, in order: order and loss are visible in replies.
pub struct Log {
    pub values: Vec<u64>,
}

impl Entity for Log {
    type Message = Cmd;
    type Reply = Vec<u64>;

    fn new(_id: &EntityId) -> Self {
        Log { values: Vec::new() }
    }

    async fn handle(&mut self, ctx: &mut EntityContext, msg: Cmd) -> Vec<u64> {
        match msg {
            Cmd::Append(v) => self.values.push(v),
            Cmd::Get => {}
            Cmd::Passivate => ctx.passivate(),
            Cmd::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
        self.values.clone()
    }

    async fn started(&mut self, _ctx: &mut EntityContext) {
        STARTED.fetch_add(1, Ordering::Relaxed);
    }

    async fn stopped(&mut self, _ctx: &mut EntityContext) {
        STOPPED.fetch_add(1, Ordering::Relaxed);
    }

    fn hand_over(&self) -> Option<Vec<u8>> {
        postcard::to_allocvec(&self.values).ok()
    }

    fn take_over(_id: &EntityId, data: &[u8]) -> Option<Self> {
        postcard::from_bytes(data).ok().map(|values| Log { values })
    }
}

pub fn settings() -> EntitySettings {
    EntitySettings::new("log").shards(32).ask_timeout(Duration::from_secs(10)).hand_off_timeout(Duration::from_secs(3))
}

pub fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub async fn node(name: &str, seed: Option<std::net::SocketAddr>) -> (Cluster, EntityHandle<Log>) {
    logs();
    node_with(Cluster::builder().cluster_name("test").node_name(name), seed).await
}

/// A node built from `b`, joining by `seed`, with the `Log` type registered.
pub async fn node_with(b: ClusterBuilder, seed: Option<std::net::SocketAddr>) -> (Cluster, EntityHandle<Log>) {
    let b = match seed {
        Some(s) => b.membership(Gossip::new([s.to_string()])),
        None => b,
    };
    let c = b.build().await.expect("node starts");
    let h = c.register::<Log>(settings()).await.expect("type registers");
    (c, h)
}

/// Waits until `cond` holds, polling; panics with `what` after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every shard has a known home on `h`'s node.
pub async fn all_homed(h: &EntityHandle<Log>) {
    let h = h.clone();
    eventually("every shard homed", Duration::from_secs(30), move || h.shard_homes().iter().all(|o| o.is_some())).await;
}

pub fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}
