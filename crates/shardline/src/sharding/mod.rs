//! Layer 3: the sharding runtime: what the commands of the core's region, coordinator and host
//! engines do on a node, and the [`Entity`](entity::Entity) contract the hosts run, which the
//! entity layer re-exports and builds on.
//!
//! | file | what it is |
//! |---|---|
//! | `entity.rs`, `settings.rs`, `claim.rs` | the contract an entity type implements, its settings, its shard's journal claim (the bottom: they name nothing above them) |
//! | `message.rs`, `envelope.rs` | the wire's frames; a message on its way to an entity |
//! | `region.rs`, `coordinator.rs` | the region and coordinator engines' commands carried out, on the shared driver |
//! | `host/` | one hosted shard: its entities' mailboxes and tasks, on the core's `HostEngine` |
//! | `inbound.rs`, `types.rs` | frames from peers handed to the region or coordinator they are for |
//! | `refusal.rs` | every error a turned-away message gets |
//! | `ask/` | the bookkeeping of asks: replies awaited, deadlines, stats |
//! | `node.rs` | what the runtime sees of its node: transport, clock, lease, registry |

pub(crate) mod ask;
pub(crate) mod claim;
pub(crate) mod coordinator;
pub(crate) mod entity;
pub(crate) mod envelope;
pub(crate) mod host;
pub(crate) mod inbound;
pub(crate) mod message;
pub(crate) mod node;
pub(crate) mod refusal;
pub(crate) mod region;
pub(crate) mod reminder;
pub(crate) mod settings;
pub(crate) mod types;
