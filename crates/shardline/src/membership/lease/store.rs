//! What lease-based membership needs from a coordination store, and an in-process store.
//!
//! Two kinds of keys:
//! - **ephemeral** keys expire `ttl` after their last write unless refreshed (etcd: a lease per
//!   key; NATS KV on a 2.9 server: a bucket whose `max_age` is the TTL, refreshed by a revision
//!   compare-and-set rewrite);
//! - **durable** keys stay, written with compare-and-set on their revision (the shard map).
//!
//! Every write returns the key's new revision; a compare-and-set that finds another revision
//! returns `None` and changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::membership::BoxFuture;

/// A key's revision: grows at every write of the store.
pub type Revision = u64;

/// A stored key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// Its value.
    pub value: Vec<u8>,
    /// Its revision.
    pub revision: Revision,
}

/// A change under a watched prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// Written.
    Put(Entry),
    /// Deleted or expired.
    Delete {
        /// The key.
        key: String,
    },
}

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached (or did not answer in time).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered with an error.
    #[error("store error: {0}")]
    Failed(String),
}

/// A coordination store (etcd, NATS KV, in-memory).
pub trait CoordinationStore: Send + Sync + 'static {
    /// Creates `key` only if absent, expiring `ttl` after its last write. `None`: it exists.
    fn create_ephemeral(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>>;
    /// Rewrites an ephemeral key whose revision is still `expected`, pushing its expiry back.
    fn refresh(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>>;
    /// Writes a durable key if its revision is `expected` (0: it must be absent).
    fn compare_and_put(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>>;
    /// Reads a key.
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, StoreError>>;
    /// Reads every key under `prefix`.
    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<Entry>, StoreError>>;
    /// Deletes a key (only at revision `expected`, when given). False when nothing was deleted.
    fn delete(&self, key: &str, expected: Option<Revision>) -> BoxFuture<'_, Result<bool, StoreError>>;
    /// Changes under `prefix` from now on.
    fn watch(&self, prefix: &str) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>>;
}

struct Stored {
    value: Vec<u8>,
    revision: Revision,
    expires: Option<Instant>,
}

#[derive(Default)]
struct Inner {
    keys: BTreeMap<String, Stored>,
    revision: Revision,
    watchers: Vec<(String, mpsc::Sender<WatchEvent>)>,
    down: bool,
    down_keys: BTreeSet<String>,
}

impl Inner {
    /// Drops expired keys (telling watchers), as a store would.
    fn expire(&mut self, now: Instant) {
        let gone: Vec<String> =
            self.keys.iter().filter(|(_, s)| s.expires.is_some_and(|e| e <= now)).map(|(k, _)| k.clone()).collect();
        for k in gone {
            self.keys.remove(&k);
            self.notify(WatchEvent::Delete { key: k });
        }
    }

    fn notify(&mut self, ev: WatchEvent) {
        let key = match &ev {
            WatchEvent::Put(e) => e.key.clone(),
            WatchEvent::Delete { key } => key.clone(),
        };
        self.watchers
            .retain(|(p, tx)| !key.starts_with(p.as_str()) || tx.try_send(ev.clone()).is_ok() || !tx.is_closed());
    }

    fn put(&mut self, key: &str, value: Vec<u8>, expires: Option<Instant>) -> Revision {
        self.revision += 1;
        let revision = self.revision;
        self.keys.insert(key.to_string(), Stored { value: value.clone(), revision, expires });
        self.notify(WatchEvent::Put(Entry { key: key.to_string(), value, revision }));
        revision
    }

    fn check(&mut self, key: Option<&str>) -> Result<(), StoreError> {
        if self.down || key.is_some_and(|k| self.down_keys.contains(k)) {
            return Err(StoreError::Unavailable("in-memory store is down".into()));
        }
        self.expire(Instant::now());
        Ok(())
    }
}

/// An in-process store with the same semantics as the real ones: for tests, and for clusters
/// whose nodes all live in one process. [`InMemoryStore::set_down`] simulates an outage.
#[derive(Clone, Default)]
pub struct InMemoryStore {
    inner: Arc<Mutex<Inner>>,
}

impl InMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every call fail with `Unavailable` (true) or work again (false).
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Makes every call on `key` fail with `Unavailable` (true) or work again (false): a store
    /// that answers some requests and not others.
    pub fn set_key_down(&self, key: &str, down: bool) {
        let mut g = self.lock();
        if down {
            g.down_keys.insert(key.to_string());
        } else {
            g.down_keys.remove(key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn call<T: Send + 'static>(
        &self,
        key: Option<&str>,
        f: impl FnOnce(&mut Inner) -> T,
    ) -> BoxFuture<'_, Result<T, StoreError>> {
        let r = {
            let mut g = self.lock();
            g.check(key).map(|()| f(&mut g))
        };
        Box::pin(async move { r })
    }
}

impl CoordinationStore for InMemoryStore {
    fn create_ephemeral(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let (name, key) = (key, key.to_string());
        self.call(Some(name), move |s| {
            if s.keys.contains_key(&key) {
                None
            } else {
                Some(s.put(&key, value, Some(Instant::now() + ttl)))
            }
        })
    }

    fn refresh(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let (name, key) = (key, key.to_string());
        self.call(Some(name), move |s| match s.keys.get(&key) {
            Some(e) if e.revision == expected => Some(s.put(&key, value, Some(Instant::now() + ttl))),
            _ => None,
        })
    }

    fn compare_and_put(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let (name, key) = (key, key.to_string());
        self.call(Some(name), move |s| {
            let current = s.keys.get(&key).map(|e| e.revision).unwrap_or(0);
            (current == expected).then(|| s.put(&key, value, None))
        })
    }

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, StoreError>> {
        let (name, key) = (key, key.to_string());
        self.call(Some(name), move |s| {
            s.keys.get(&key).map(|e| Entry { key: key.clone(), value: e.value.clone(), revision: e.revision })
        })
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<Entry>, StoreError>> {
        let prefix = prefix.to_string();
        self.call(None, move |s| {
            s.keys
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(prefix.as_str()))
                .map(|(k, e)| Entry { key: k.clone(), value: e.value.clone(), revision: e.revision })
                .collect()
        })
    }

    fn delete(&self, key: &str, expected: Option<Revision>) -> BoxFuture<'_, Result<bool, StoreError>> {
        let (name, key) = (key, key.to_string());
        self.call(Some(name), move |s| match s.keys.get(&key) {
            Some(e) if expected.is_none_or(|x| x == e.revision) => {
                s.keys.remove(&key);
                s.revision += 1;
                s.notify(WatchEvent::Delete { key });
                true
            }
            _ => false,
        })
    }

    fn watch(&self, prefix: &str) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>> {
        let prefix = prefix.to_string();
        let inner = self.inner.clone();
        self.call(None, move |s| {
            let (tx, rx) = mpsc::channel(1024);
            s.watchers.push((prefix, tx));
            // Expiry must be noticed even when nobody calls: a small ticker per watch.
            let weak = Arc::downgrade(&inner);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let Some(i) = weak.upgrade() else { return };
                    let mut g = i.lock().unwrap_or_else(|e| e.into_inner());
                    if g.watchers.is_empty() {
                        return;
                    }
                    g.expire(Instant::now());
                }
            });
            rx
        })
    }
}
