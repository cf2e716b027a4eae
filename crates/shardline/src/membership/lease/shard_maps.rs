//! `ShardMaps`: the coordinators' shard maps, kept in the coordination store.
//!
//! One durable key per entity type, `{cluster}/maps/{type}`, holding the map and the term of the
//! coordinator that wrote it. Writes are compare-and-set on the key's revision, so two writers
//! can never silently overwrite each other: a writer whose compare fails learns who wrote the key
//! and at which revision, and its coordinator decides (`CoordinatorEngine::handle_map_stored`):
//! deposed by a newer term, it stops at its first conflict; otherwise it writes again.
//!
//! The stored map may lag what regions host (writes are asynchronous and coalesced), which is
//! safe: a new coordinator only announces homes their owners confirm, and uses the stored map to
//! know which owners must report (or be fenced) before it allocates anything.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use shardline_core::{ShardMap, Term};

use super::store::{CoordinationStore, Revision, StoreError};
use crate::format::{self, Stored};

/// Why a map could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapStoreError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored value is not a shard map this version understands.
    #[error("stored shard map of `{type_key}` cannot be decoded: {reason}")]
    Corrupt {
        /// The entity type.
        type_key: String,
        /// What the decoder said.
        reason: String,
    },
    /// The key changed since the writer's last write: nothing was written. The coordinator
    /// decides what that means (`CoordinatorEngine::handle_map_stored`).
    #[error("shard map of `{type_key}` changed meanwhile (stored by term {stored:?})")]
    Conflict {
        /// The entity type.
        type_key: String,
        /// The term of the stored map; None when there is none or it cannot be read.
        stored: Option<Term>,
        /// The key's revision now (0: absent), for the next compare-and-set.
        revision: Revision,
    },
}

/// A stored map: its coordinator's term and the map.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredMap {
    term: Term,
    map: ShardMap,
}

impl Stored for StoredMap {
    const WHAT: &'static str = "shard map";
    const VERSION: u32 = 1;
    const READABLE_FROM: u32 = 1;
}

/// The stored form of `type_key`'s map, written by a coordinator of `term`.
pub(crate) fn encode_map(type_key: &str, term: Term, map: &ShardMap) -> Result<Vec<u8>, MapStoreError> {
    format::encode_as::<StoredMap>(&MapToStore { term, map })
        .map_err(|err| MapStoreError::Corrupt { type_key: type_key.to_string(), reason: err.to_string() })
}

/// Reads a stored map of `type_key`: its coordinator's term and the map.
pub(crate) fn decode_map(type_key: &str, value: &[u8]) -> Result<(Term, ShardMap), MapStoreError> {
    let stored: StoredMap = format::decode(value)
        .map_err(|err| MapStoreError::Corrupt { type_key: type_key.to_string(), reason: err.to_string() })?;
    Ok((stored.term, stored.map))
}

/// What is written: the same encoding as [`StoredMap`], without copying the map.
#[derive(Serialize)]
struct MapToStore<'a> {
    term: Term,
    map: &'a ShardMap,
}

/// A shard map as read from the store.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedMap {
    /// The term of the coordinator that wrote it.
    pub term: Term,
    /// The map.
    pub map: ShardMap,
    /// The key's revision, for the next compare-and-set.
    pub revision: Revision,
}

/// The shard maps of one cluster, in a coordination store.
///
/// ```
/// # tokio_test_block_on(async {
/// use std::sync::Arc;
/// use shardline::membership::lease::{InMemoryStore, ShardMaps};
/// use shardline_core::ShardMap;
///
/// let maps = ShardMaps::new(Arc::new(InMemoryStore::new()), "demo");
/// assert!(maps.load("account").await.unwrap().is_none());
/// let rev = maps.save("account", 1, &ShardMap::new(16).unwrap(), 0).await.unwrap();
/// let loaded = maps.load("account").await.unwrap().unwrap();
/// assert_eq!((loaded.term, loaded.revision), (1, rev));
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone)]
pub struct ShardMaps {
    store: Arc<dyn CoordinationStore>,
    prefix: String,
}

impl ShardMaps {
    /// The maps of `cluster` on `store`.
    pub fn new(store: Arc<dyn CoordinationStore>, cluster: &str) -> Self {
        ShardMaps { store, prefix: format!("{cluster}/maps/") }
    }

    fn key(&self, type_key: &str) -> String {
        format!("{}{type_key}", self.prefix)
    }

    /// Reads the map of `type_key` (None: never written).
    pub async fn load(&self, type_key: &str) -> Result<Option<LoadedMap>, MapStoreError> {
        let Some(e) = self.store.get(&self.key(type_key)).await? else { return Ok(None) };
        let (term, map) = decode_map(type_key, &e.value)?;
        Ok(Some(LoadedMap { term, map, revision: e.revision }))
    }

    /// Writes `map` for a coordinator of `term`, expecting the key at `expected` (0: absent),
    /// and returns the new revision. When the key is elsewhere, nothing is written:
    /// [`MapStoreError::Conflict`] says who wrote what is there, and at which revision.
    pub async fn save(
        &self,
        type_key: &str,
        term: Term,
        map: &ShardMap,
        expected: Revision,
    ) -> Result<Revision, MapStoreError> {
        let value = encode_map(type_key, term, map)?;
        let key = self.key(type_key);
        if let Some(rev) = self.store.compare_and_put(&key, value, expected).await? {
            return Ok(rev);
        }
        let (stored, revision) = match self.load(type_key).await {
            Ok(Some(current)) => (Some(current.term), current.revision),
            Ok(None) => (None, 0),
            Err(MapStoreError::Corrupt { .. }) => (None, self.store.get(&key).await?.map_or(0, |e| e.revision)),
            Err(e) => return Err(e),
        };
        Err(MapStoreError::Conflict { type_key: type_key.to_string(), stored, revision })
    }
}
