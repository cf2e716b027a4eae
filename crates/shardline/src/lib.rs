//! # Shardline
//!
//! Cluster sharding for Rust: stateful entities, each named by a type and an id, live on exactly
//! one node of a cluster; callers message them by id from any node; when nodes join, leave or
//! die, shards of entities move without two copies ever running at once.
//!
//! ```no_run
//! use shardline::{Cluster, Entity, EntityId, EntitySettings, Gossip};
//!
//! struct Counter(i64);
//!
//! // Each `#[message]` method is a request with its own reply: `Add { by }` answers an `i64`.
//! #[shardline::messages]
//! impl Entity for Counter {
//!     fn new(_: &EntityId) -> Self { Counter(0) }
//!
//!     #[message]
//!     fn add(&mut self, by: i64) -> i64 { self.0 += by; self.0 }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let cluster = Cluster::builder()
//!     .node_name("node-1")
//!     .bind("127.0.0.1:7101")
//!     .membership(Gossip::new(["127.0.0.1:7101"]))
//!     .build()
//!     .await?;
//! let counters = cluster.register::<Counter>(EntitySettings::new("counter").shards(256)).await?;
//! let n: i64 = counters.entity_ref("c-42").ask(Add { by: 10 }).await?;
//! cluster.leave().await?;
//! # Ok(()) }
//! ```
//!
//! Layers, each importing only those below it (a test checks it): [`transport`] (framed TCP,
//! generic over what it carries), [`membership`] (providers), [`journal`] (the interface entities
//! persist through), the sharding runtime (drivers around `shardline-core`'s engines, shard
//! hosts, and the [`Entity`] contract they host), [`entity`] (the typed API), and [`Cluster`],
//! the node that wires them.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod cluster;
#[cfg(feature = "test-support")]
pub mod drills;
mod driver;
pub mod entity;
mod error;
pub mod format;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzz;
#[cfg(test)]
mod golden;
pub mod journal;
pub mod membership;
pub mod ports;
#[cfg(feature = "sabotage")]
pub mod sabotage;
#[cfg(not(feature = "sabotage"))]
mod sabotage;
pub(crate) mod sharding;
pub mod trace;
// The node-to-node transport: public only for the transport's own tests (`test-support`); what
// applications use of it is re-exported below.
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub mod transport;
#[cfg(not(feature = "test-support"))]
mod transport;

pub use clock::Clock;
pub use cluster::{
    AdminError, Cluster, ClusterBuilder, ClusterStatus, Formation, MemberReport, Readiness, RebalancingReport,
    ShardMapReport, ShardReport,
};
pub use entity::daemon::{DaemonContext, DaemonHandle};
pub use entity::{
    Attempts, Entities, Entity, EntityContext, EntityHandle, EntityRef, EntitySettings, EventSourced,
    EventSourcedHandle, EventSourcedSettings, Reminder, Request, RequestId, RetryPolicy, StrategyKind, When,
};
pub use error::{ConfigError, Error, Processed, TransportError};
pub use journal::Journal;
pub use membership::{ClusterView, Gossip, GossipConfig, MembershipProvider};
pub use sharding::ask::stats::AskStats;
pub use sharding::region::Hosting;
pub use sharding::settings::IntoJournal;
pub use shardline_core::host::PassivationPolicy;
pub use shardline_core::{DomainEvent, EntityId, Epoch, MemberStatus, NodeId, ShardId, TypeKey};
#[cfg(feature = "macros")]
pub use shardline_macros::{commands, messages};
pub use trace::TraceContext;

/// What the macros' expansions name, so that their users need no dependency of their own.
#[doc(hidden)]
pub mod __private {
    pub use serde;
}
#[cfg(feature = "dev-certs")]
pub use transport::tls::dev as dev_certs;
pub use transport::{
    Connection, Listener, Network, TlsConfig, TlsError, TransportConfig, OLDEST_PROTOCOL, PROTOCOL_VERSION,
};
