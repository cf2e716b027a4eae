//! Layer 3: the sharding runtime. Drivers that feed the core's engines with frames, membership
//! changes and time, and carry their commands out; shard hosts that run entities; and the
//! [`Entity`](entity::Entity) contract they host, which the entity layer re-exports and builds on.

pub(crate) mod ask_stats;
pub(crate) mod claim;
pub(crate) mod coordinator;
pub(crate) mod deadlines;
pub(crate) mod entity;
pub(crate) mod envelope;
pub(crate) mod host;
pub(crate) mod message;
pub(crate) mod node;
pub(crate) mod pending;
pub(crate) mod region;
pub(crate) mod settings;
pub(crate) mod wakeup;
