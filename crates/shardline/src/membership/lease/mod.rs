//! Lease-based coordination: membership, leader election and the shard map rest on a
//! coordination store (etcd, NATS JetStream KV, or the in-memory store), so that a partition
//! or a dead node can never leave a shard with two owners.

#[cfg(feature = "test-support")]
pub mod conformance;
pub(crate) mod keepalive;
pub(crate) mod provider;
#[cfg(feature = "test-support")]
pub mod server;
pub(crate) mod shard_maps;
mod store;
mod store_url;
pub(crate) mod values;

pub use provider::{LeaseConfig, Leases};
pub use shard_maps::{LoadedMap, MapStoreError, ShardMaps};
pub use store::{CoordinationStore, Entry, InMemoryStore, Revision, StoreError, WatchEvent};
pub use store_url::StoreUrl;
pub use values::LeaseValueError;
