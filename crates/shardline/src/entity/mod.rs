//! Layer 4: typed entities.
//!
//! An [`Entity`] is a piece of state with an id, handling one message at a time. Shardline keeps
//! at most one live instance per id in the cluster. An idle entity costs little more than its
//! state: a task and a mailbox exist only while it has messages.
//!
//! **Where the state lives.** An entity's state is in the memory of the node that hosts its
//! shard, and nowhere else. When the shard moves (a node joins and shards are rebalanced, a node
//! leaves gracefully), the entity starts again on its new node from [`Entity::new`], *unless* it
//! implements [`hand_over`](Entity::hand_over) and [`take_over`](Entity::take_over), which carry
//! its state to the new owner with the hand-off. A crashed node hands nothing over, and
//! passivation ends the instance: state that must outlive those belongs in a journal or a
//! database. `examples/counter.rs` shows state that survives moves; `examples/devices.rs` adds
//! passivation and a partition key.
//!
//! **Its protocol.** An entity receives one message type and answers one reply type: that is
//! what travels. Written by hand, they are two enums and a `match` in
//! [`handle`](Entity::handle):
//!
//! ```no_run
//! use shardline::{Entity, EntityContext, EntityId};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! enum Cmd { Add(i64), Get }
//!
//! struct Counter { n: i64 }
//!
//! impl Entity for Counter {
//!     type Message = Cmd;
//!     type Reply = i64;
//!     fn new(_id: &EntityId) -> Self { Counter { n: 0 } }
//!     async fn handle(&mut self, _ctx: &mut EntityContext, msg: Cmd) -> i64 {
//!         if let Cmd::Add(k) = msg { self.n += k; }
//!         self.n
//!     }
//! }
//! ```
//!
//! Or a method per request, each answered with its own type ([`Request`]), by
//! [`messages`](crate::messages) (and [`commands`](crate::commands) for an [`EventSourced`]
//! type): `counter.ask(Add { k: 5 })` answers an `i64`.
//!
//! ```no_run
//! use shardline::{Entity, EntityId};
//!
//! struct Counter { n: i64 }
//!
//! #[shardline::messages]
//! impl Entity for Counter {
//!     fn new(_id: &EntityId) -> Self { Counter { n: 0 } }
//!
//!     #[message]
//!     fn add(&mut self, k: i64) -> i64 { self.n += k; self.n }
//!
//!     #[message]
//!     fn get(&self) -> i64 { self.n }
//! }
//! ```

pub mod daemon;
pub mod event_sourced;
mod handles;
mod request;
mod retry;
mod schema;

pub use crate::journal::RequestId;
pub use crate::sharding::entity::{Entity, EntityContext};
pub use crate::sharding::reminder::{Reminder, When};
pub use crate::sharding::settings::{EntitySettings, EventSourcedSettings, StrategyKind, CLOCK_SKEW_MARGIN};
pub use event_sourced::{EventSourced, EventSourcedHandle, Persist, PersistError, Persistent, Remind};
pub use handles::{Entities, EntityHandle, EntityRef};
pub use request::Request;
pub use retry::{Attempts, RetryPolicy};
pub use schema::decode_old;
