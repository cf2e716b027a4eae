//! [`NatsStore`]: Shardline's [`CoordinationStore`] on NATS JetStream key-value buckets.
//!
//! Debian's nats-server is 2.9, which has no per-key TTL, so (as in the Aether design):
//! - ephemeral keys live in a bucket whose `max_age` is the TTL: a key disappears `ttl` after its
//!   last write unless it is rewritten; `refresh` is a revision compare-and-set rewrite;
//! - durable keys live in a second bucket without `max_age`, written by revision
//!   compare-and-set.
//!
//! Keys use `/` between segments, stored with `.` (NATS subject tokens). Watches and lists take
//! a prefix that ends at a segment boundary. A 2.9 server publishes nothing when `max_age`
//! expires a key, so a watch also re-lists its prefix every quarter TTL and reports the keys that
//! vanished.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures_util::StreamExt;
use shardline::membership::lease::{CoordinationStore, Entry, Revision, StoreError, StoreUrl, WatchEvent};
use shardline::membership::BoxFuture;
use tokio::sync::mpsc;

/// A coordination store on NATS JetStream KV.
#[derive(Clone)]
pub struct NatsStore {
    ephemeral: kv::Store,
    durable: kv::Store,
    ttl: Duration,
    timeout: Duration,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// The server's address without credentials or options, and how to connect to it.
fn connect_options(url: &str) -> Result<(String, async_nats::ConnectOptions), StoreError> {
    let bad = |reason: String| StoreError::Failed(format!("NATS url: {reason}"));
    let u = StoreUrl::parse(url)?;
    if u.scheme != "nats" && u.scheme != "tls" {
        return Err(bad(format!("scheme {:?}: nats or tls", u.scheme)));
    }
    let mut options = async_nats::ConnectOptions::new().require_tls(u.scheme == "tls");
    options = match (u.user, u.password) {
        (Some(user), Some(password)) => options.user_and_password(user, password),
        (Some(token), None) => options.token(token),
        _ => options,
    };
    for (key, value) in u.options {
        match key.as_str() {
            "ca" => {
                let path = std::path::PathBuf::from(value);
                if !path.is_file() {
                    return Err(bad(format!("ca {}: no such file", path.display())));
                }
                options = options.add_root_certificates(path).require_tls(true);
            }
            other => return Err(bad(format!("option {other:?}: only ca=PATH"))),
        }
    }
    Ok((format!("{}://{}", u.scheme, u.hosts), options))
}

fn subject(key: &str) -> String {
    key.replace('/', ".")
}

fn unsubject(key: &str) -> String {
    key.replace('.', "/")
}

impl NatsStore {
    /// Connects to `url` and opens (or creates) the buckets `{name}-ephemeral` (max age `ttl`)
    /// and `{name}-durable`.
    ///
    /// `url` is `nats://HOST:PORT`, with credentials as NATS writes them
    /// (`nats://USER:PASSWORD@…` or `nats://TOKEN@…`), and for TLS `tls://HOST:PORT` or
    /// `?ca=PATH` (the server's CA, PEM; TLS is then required).
    pub async fn connect(url: &str, name: &str, ttl: Duration, timeout: Duration) -> Result<Self, StoreError> {
        let (server, options) = connect_options(url)?;
        let client = tokio::time::timeout(timeout, options.connection_timeout(timeout).connect(server.as_str()))
            .await
            .map_err(|_| StoreError::Unavailable(format!("NATS at {server} did not answer within {timeout:?}")))?
            .map_err(unavailable)?;
        let js = jetstream::new(client);
        let open = |bucket: String, max_age: Duration| {
            let js = js.clone();
            async move {
                if let Ok(s) = js.get_key_value(&bucket).await {
                    return Ok(s);
                }
                let config = kv::Config { bucket: bucket.clone(), history: 1, max_age, ..Default::default() };
                match js.create_key_value(config).await {
                    Ok(s) => Ok(s),
                    // Nodes that start together race to create the bucket: the losers find it
                    // made by the winner.
                    Err(e) => js.get_key_value(&bucket).await.map_err(|_| unavailable(e)),
                }
            }
        };
        let mut ephemeral = open(format!("{name}-ephemeral"), ttl).await?;
        // The bucket's max age is every key's real lifetime. Shorter than this node's TTL, a
        // key would vanish while its node still hosts (the node fences only at TTL − margin):
        // refused. Longer (a bucket made by nodes with a longer TTL) is safe, only slower.
        let made_with = ephemeral.stream.info().await.map_err(unavailable)?.config.max_age;
        if made_with < ttl {
            return Err(StoreError::Failed(format!(
                "the bucket {name}-ephemeral keeps keys for {made_with:?}, less than this node's lease TTL \
                 {ttl:?}: keys would expire while their nodes still host. Every node of a cluster must use \
                 the same TTL (or delete the bucket when none runs)"
            )));
        }
        if made_with > ttl {
            tracing::warn!(
                bucket = %format!("{name}-ephemeral"),
                ?made_with,
                ?ttl,
                "the bucket keeps keys longer than this node's lease TTL: a crashed node's shards move only once its key expires"
            );
        }
        let durable = open(format!("{name}-durable"), Duration::ZERO).await?;
        Ok(NatsStore { ephemeral, durable, ttl, timeout })
    }

    async fn bounded<T>(&self, f: impl std::future::Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, f)
            .await
            .map_err(|_| StoreError::Unavailable(format!("NATS did not answer within {:?}", self.timeout)))?
    }

    /// Where `key` lives: ephemeral keys are the ones present in the ephemeral bucket.
    async fn entry_in(&self, store: &kv::Store, key: &str) -> Result<Option<Entry>, StoreError> {
        let e = store.entry(subject(key)).await.map_err(unavailable)?;
        Ok(e.filter(|e| e.operation == kv::Operation::Put).map(|e| Entry {
            key: key.to_string(),
            value: e.value.to_vec(),
            revision: e.revision,
        }))
    }

    /// The live keys under `prefix`. The names come from the stream's per-subject state, a plain
    /// request: the client's `keys()` runs an ordered consumer, and a 2.9 server can leave it
    /// waiting forever when messages expire while it runs (nats-server issue 3481). That hang
    /// held a node's lease loop until its lease lapsed.
    async fn keys_in(&self, store: &kv::Store, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::new();
        let mut subjects = store.stream.info_with_subjects(format!("{}>", store.prefix)).await.map_err(unavailable)?;
        let mut names = Vec::new();
        while let Some(s) = subjects.next().await {
            let (subject, _) = s.map_err(unavailable)?;
            let Some(k) = subject.strip_prefix(store.prefix.as_str()) else { continue };
            let key = unsubject(k);
            if key.starts_with(prefix) {
                names.push(key);
            }
        }
        for key in names {
            if let Some(e) = self.entry_in(store, &key).await? {
                out.push(e);
            }
        }
        Ok(out)
    }
}

impl CoordinationStore for NatsStore {
    fn create_ephemeral(
        &self,
        key: &str,
        value: Vec<u8>,
        _ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let key = key.to_string();
        Box::pin(self.bounded(async move {
            match self.ephemeral.create(subject(&key), value.into()).await {
                Ok(rev) => Ok(Some(rev)),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(None),
                Err(e) => Err(unavailable(e)),
            }
        }))
    }

    fn refresh(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
        _ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let key = key.to_string();
        Box::pin(self.bounded(async move {
            match self.ephemeral.update(subject(&key), value.into(), expected).await {
                Ok(rev) => Ok(Some(rev)),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
                Err(e) => Err(unavailable(e)),
            }
        }))
    }

    fn compare_and_put(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let key = key.to_string();
        Box::pin(self.bounded(async move {
            if expected == 0 {
                match self.durable.create(subject(&key), value.into()).await {
                    Ok(rev) => Ok(Some(rev)),
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(None),
                    Err(e) => Err(unavailable(e)),
                }
            } else {
                match self.durable.update(subject(&key), value.into(), expected).await {
                    Ok(rev) => Ok(Some(rev)),
                    Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
                    Err(e) => Err(unavailable(e)),
                }
            }
        }))
    }

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, StoreError>> {
        let key = key.to_string();
        Box::pin(self.bounded(async move {
            if let Some(e) = self.entry_in(&self.ephemeral, &key).await? {
                return Ok(Some(e));
            }
            self.entry_in(&self.durable, &key).await
        }))
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<Entry>, StoreError>> {
        let prefix = prefix.to_string();
        Box::pin(self.bounded(async move {
            let mut all = self.keys_in(&self.ephemeral, &prefix).await?;
            all.extend(self.keys_in(&self.durable, &prefix).await?);
            all.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(all)
        }))
    }

    fn delete(&self, key: &str, expected: Option<Revision>) -> BoxFuture<'_, Result<bool, StoreError>> {
        let key = key.to_string();
        Box::pin(self.bounded(async move {
            for store in [&self.ephemeral, &self.durable] {
                let Some(e) = self.entry_in(store, &key).await? else { continue };
                if expected.is_some_and(|x| x != e.revision) {
                    return Ok(false);
                }
                return match store.delete_expect_revision(subject(&key), Some(e.revision)).await {
                    Ok(()) => Ok(true),
                    Err(_) => Ok(false),
                };
            }
            Ok(false)
        }))
    }

    fn watch(&self, prefix: &str) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>> {
        let prefix = prefix.to_string();
        Box::pin(self.bounded(async move {
            if !prefix.ends_with('/') {
                return Err(StoreError::Failed(format!("NATS watches need a prefix ending in '/': {prefix:?}")));
            }
            let pattern = format!("{}>", subject(&prefix));
            let (tx, rx) = mpsc::channel(1024);
            for store in [self.ephemeral.clone(), self.durable.clone()] {
                let mut w = store.watch(pattern.clone()).await.map_err(unavailable)?;
                let tx = tx.clone();
                tokio::spawn(async move {
                    while let Some(Ok(e)) = w.next().await {
                        let key = unsubject(&e.key);
                        let ev = match e.operation {
                            kv::Operation::Put => {
                                WatchEvent::Put(Entry { key, value: e.value.to_vec(), revision: e.revision })
                            }
                            kv::Operation::Delete | kv::Operation::Purge => WatchEvent::Delete { key },
                        };
                        if tx.send(ev).await.is_err() {
                            return;
                        }
                    }
                });
            }
            // Expiry by max_age is silent on a 2.9 server: notice vanished keys by re-listing.
            let me = self.clone();
            let tick = (self.ttl / 4).max(Duration::from_millis(100));
            tokio::spawn(async move {
                let mut known: BTreeSet<String> = BTreeSet::new();
                loop {
                    tokio::time::sleep(tick).await;
                    if tx.is_closed() {
                        return;
                    }
                    let Ok(now) = me.keys_in(&me.ephemeral, &prefix).await else { continue };
                    let now: BTreeSet<String> = now.into_iter().map(|e| e.key).collect();
                    for gone in known.difference(&now) {
                        if tx.send(WatchEvent::Delete { key: gone.clone() }).await.is_err() {
                            return;
                        }
                    }
                    known = now;
                }
            });
            Ok(rx)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_tls_are_read_from_the_url() {
        assert_eq!(connect_options("nats://127.0.0.1:4222").unwrap().0, "nats://127.0.0.1:4222");
        let ca = std::env::temp_dir().join(format!("shardline-nats-url-{}.pem", std::process::id()));
        std::fs::write(&ca, "").unwrap();
        assert_eq!(connect_options(&format!("nats://u:p%40ss@h:1?ca={}", ca.display())).unwrap().0, "nats://h:1");
        let _ = std::fs::remove_file(&ca);
        assert_eq!(connect_options("tls://tok@h:1").unwrap().0, "tls://h:1");
        for bad in ["h:1", "http://h:1", "nats://h:1?ca=/nonexistent", "nats://h:1?tls=1"] {
            assert!(connect_options(bad).is_err(), "{bad}");
        }
    }
}
