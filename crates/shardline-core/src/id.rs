//! Names of things: entity types, entities, shards and nodes, and the hash that maps an
//! entity to its shard.
//!
//! The shard of an entity is part of the wire contract: two nodes that disagree on it would
//! route the same entity to two places. [`shard_of`] is therefore pinned by test vectors.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Names an entity type, e.g. `"account"`. One region per node serves each type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TypeKey(pub Arc<str>);

impl TypeKey {
    /// Creates a type key.
    pub fn new(name: impl AsRef<str>) -> Self {
        TypeKey(Arc::from(name.as_ref()))
    }

    /// The type name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TypeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Identifies an entity within its type. Any UTF-8 string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EntityId(pub Arc<str>);

impl EntityId {
    /// Creates an entity id.
    pub fn new(id: impl AsRef<str>) -> Self {
        EntityId(Arc::from(id.as_ref()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shard this entity belongs to; see [`shard_of`].
    pub fn shard(&self, num_shards: u32) -> ShardId {
        shard_of(&self.0, num_shards)
    }
}

impl fmt::Display for EntityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A shard: a group of entities that always live together, numbered `0..num_shards`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShardId(pub u32);

impl ShardId {
    /// The shard number as an index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard-{}", self.0)
    }
}

/// Maps an entity id to its shard: `xxh3_64(UTF-8 bytes) % num_shards`.
///
/// `num_shards` of 0 is treated as 1 so the function is total.
///
/// ```
/// use shardline_core::{shard_of, ShardId};
/// assert_eq!(shard_of("acct-42", 1), ShardId(0));
/// assert!(shard_of("acct-42", 1024).0 < 1024);
/// ```
#[inline]
pub fn shard_of(entity_id: &str, num_shards: u32) -> ShardId {
    let n = u64::from(num_shards.max(1));
    ShardId((xxhash_rust::xxh3::xxh3_64(entity_id.as_bytes()) % n) as u32)
}

/// A node of the cluster: a stable name (pod name, address) and an incarnation that changes at
/// every start, so a restarted node is never mistaken for its previous life.
///
/// Ordering is by name, then incarnation, which gives strategies a deterministic order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId {
    /// Stable name, e.g. `"node-1"` or `"10.0.0.7:7101"`.
    pub name: Arc<str>,
    /// Changes at every start of the node (e.g. its start time in milliseconds).
    pub incarnation: u64,
}

impl NodeId {
    /// Creates a node id.
    pub fn new(name: impl AsRef<str>, incarnation: u64) -> Self {
        NodeId { name: Arc::from(name.as_ref()), incarnation }
    }

    /// True when both ids name the same node, whatever the incarnation.
    pub fn same_name(&self, other: &NodeId) -> bool {
        self.name == other.name
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.name, self.incarnation)
    }
}
