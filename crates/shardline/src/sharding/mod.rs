//! Layer 3: the sharding runtime. Drivers that feed the core's engines with frames, membership
//! changes and time, and carry their commands out.

pub(crate) mod coordinator;
pub(crate) mod envelope;
pub(crate) mod message;
pub(crate) mod node;
pub(crate) mod pending;
pub(crate) mod region;
pub(crate) mod wakeup;
