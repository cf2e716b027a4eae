//! The simulated coordination store: keys with revisions, ephemeral keys that expire on the
//! simulation's clock, compare-and-set as etcd and NATS KV give it.

use std::collections::BTreeMap;

use shardline_core::lease::{Revision, StoreAnswer, StoreOp, StoreValue, StoredEntry};

#[derive(Clone, Debug)]
pub struct Stored {
    pub value: StoreValue,
    pub revision: Revision,
    pub expires: Option<u64>,
}

#[derive(Default)]
pub struct Store {
    pub keys: BTreeMap<String, Stored>,
    revision: Revision,
}

impl Store {
    /// Drops keys expired at `now`.
    pub fn expire(&mut self, now: u64) {
        self.keys.retain(|_, k| k.expires.is_none_or(|e| e > now));
    }

    fn put(&mut self, key: &str, value: StoreValue, expires: Option<u64>) -> Revision {
        self.revision += 1;
        self.keys.insert(key.to_string(), Stored { value, revision: self.revision, expires });
        self.revision
    }

    fn entry(key: &str, s: &Stored) -> StoredEntry {
        StoredEntry { key: key.to_string(), value: Ok(s.value.clone()), revision: s.revision }
    }

    /// Applies `op` at `now`.
    pub fn apply(&mut self, now: u64, op: &StoreOp) -> StoreAnswer {
        self.expire(now);
        match op {
            StoreOp::CreateEphemeral { key, value, ttl_ms } => {
                if self.keys.contains_key(key) {
                    return StoreAnswer::Written(None);
                }
                StoreAnswer::Written(Some(self.put(key, value.clone(), Some(now + ttl_ms))))
            }
            StoreOp::Refresh { key, value, revision, ttl_ms } => match self.keys.get(key) {
                Some(s) if s.revision == *revision => {
                    StoreAnswer::Written(Some(self.put(key, value.clone(), Some(now + ttl_ms))))
                }
                _ => StoreAnswer::Written(None),
            },
            StoreOp::CompareAndPut { key, value, revision } => {
                let current = self.keys.get(key).map_or(0, |s| s.revision);
                if current != *revision {
                    return StoreAnswer::Written(None);
                }
                StoreAnswer::Written(Some(self.put(key, value.clone(), None)))
            }
            StoreOp::Get { key, .. } => StoreAnswer::Entry(self.keys.get(key).map(|s| Self::entry(key, s))),
            StoreOp::List { prefix, .. } => StoreAnswer::Entries(
                self.keys
                    .iter()
                    .filter(|(k, _)| k.starts_with(prefix.as_str()))
                    .map(|(k, s)| Self::entry(k, s))
                    .collect(),
            ),
            StoreOp::Delete { key, revision } => {
                if revision.is_none_or(|r| self.keys.get(key).is_some_and(|s| s.revision == r)) {
                    self.keys.remove(key);
                }
                StoreAnswer::Deleted
            }
        }
    }
}
