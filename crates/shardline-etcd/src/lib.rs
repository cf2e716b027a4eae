//! [`EtcdStore`]: Shardline's [`CoordinationStore`] on etcd.
//!
//! - Ephemeral keys are put under a lease of their own (granted with the TTL); `refresh` is a
//!   transaction on the key's `mod_revision` plus a keep-alive of that lease, so a key whose
//!   writer stops refreshing disappears when its lease expires. etcd rounds short TTLs up to its
//!   minimum (about 2 s with default settings).
//! - Durable keys use transactions on `mod_revision` (0: absent).
//! - Revisions are etcd's `mod_revision`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use shardline::membership::lease::{CoordinationStore, Entry, Revision, StoreError, StoreUrl, WatchEvent};
use shardline::membership::BoxFuture;
use tokio::sync::mpsc;

/// A coordination store on an etcd cluster.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    /// The lease of each ephemeral key this process wrote.
    leases: Arc<Mutex<HashMap<String, i64>>>,
    timeout: Duration,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl EtcdStore {
    /// Connects to etcd endpoints (`http://127.0.0.1:2379` or `127.0.0.1:2379`).
    pub async fn connect(endpoints: &[String], timeout: Duration) -> Result<Self, StoreError> {
        let opts = etcd_client::ConnectOptions::new().with_connect_timeout(timeout).with_timeout(timeout);
        let client = tokio::time::timeout(timeout, Client::connect(endpoints, Some(opts)))
            .await
            .map_err(|_| StoreError::Unavailable(format!("etcd at {endpoints:?} did not answer within {timeout:?}")))?
            .map_err(unavailable)?;
        Ok(EtcdStore { client, leases: Arc::default(), timeout })
    }

    /// Connects to the etcd cluster of `url`:
    /// `etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][?ca=PATH]`. With `ca` (the servers' CA,
    /// PEM), the endpoints are `https` and their certificates must be for the hosts named.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), shardline::membership::lease::StoreError> {
    /// let url = "etcd://shardline:secret@etcd-0:2379,etcd-1:2379?ca=/etc/etcd/ca.pem";
    /// let store = shardline_etcd::EtcdStore::connect_url(url, std::time::Duration::from_secs(3)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_url(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        let bad = |reason: String| StoreError::Failed(format!("etcd url: {reason}"));
        let u = StoreUrl::parse(url)?;
        if u.scheme != "etcd" {
            return Err(bad(format!("scheme {:?}: etcd", u.scheme)));
        }
        let mut opts = etcd_client::ConnectOptions::new().with_connect_timeout(timeout).with_timeout(timeout);
        opts = match (u.user, u.password) {
            (Some(user), Some(password)) => opts.with_user(user, password),
            (Some(_), None) => return Err(bad("credentials are USER:PASSWORD".into())),
            _ => opts,
        };
        let mut scheme = "http";
        for (key, value) in u.options {
            match key.as_str() {
                "ca" => {
                    let pem = std::fs::read(&value).map_err(|e| bad(format!("ca {value}: {e}")))?;
                    let tls = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(pem));
                    opts = opts.with_tls(tls);
                    scheme = "https";
                }
                other => return Err(bad(format!("option {other:?}: only ca=PATH"))),
            }
        }
        let endpoints: Vec<String> = u.hosts.split(',').map(|h| format!("{scheme}://{h}")).collect();
        let client = tokio::time::timeout(timeout, Client::connect(&endpoints, Some(opts)))
            .await
            .map_err(|_| StoreError::Unavailable(format!("etcd at {endpoints:?} did not answer within {timeout:?}")))?
            .map_err(unavailable)?;
        Ok(EtcdStore { client, leases: Arc::default(), timeout })
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r.map_err(unavailable),
            Err(_) => Err(StoreError::Unavailable(format!("etcd did not answer within {:?}", self.timeout))),
        }
    }

    fn ttl_secs(ttl: Duration) -> i64 {
        ttl.as_secs_f64().ceil().max(1.0) as i64
    }
}

impl CoordinationStore for EtcdStore {
    fn create_ephemeral(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            let mut c = self.client.clone();
            let lease = self.bounded(c.lease_grant(Self::ttl_secs(ttl), None)).await?.id();
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.as_str(), value, Some(PutOptions::new().with_lease(lease)))]);
            let r = self.bounded(c.txn(txn)).await?;
            if r.succeeded() {
                self.leases.lock().unwrap_or_else(|e| e.into_inner()).insert(key, lease);
                Ok(r.header().map(|h| h.revision() as Revision))
            } else {
                let _ = self.bounded(c.lease_revoke(lease)).await;
                Ok(None)
            }
        })
    }

    fn refresh(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
        _ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            let Some(lease) = self.leases.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied() else {
                return Ok(None);
            };
            let mut c = self.client.clone();
            let keep_alive = async {
                let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
                keeper.keep_alive().await?;
                Ok::<_, etcd_client::Error>(stream.message().await?.is_some_and(|m| m.ttl() > 0))
            };
            let alive = match tokio::time::timeout(self.timeout, keep_alive).await {
                Ok(Ok(alive)) => alive,
                // etcd no longer knows the lease: it expired, and the key went with it. A lapsed
                // lease is not an outage: the caller must learn that its key is gone.
                Ok(Err(etcd_client::Error::LeaseKeepAliveError(e))) if e == "lease not found" => false,
                Ok(Err(e)) => return Err(unavailable(e)),
                Err(_) => {
                    return Err(StoreError::Unavailable(format!("etcd did not answer within {:?}", self.timeout)))
                }
            };
            if !alive {
                self.leases.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                return Ok(None);
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, expected as i64)])
                .and_then([TxnOp::put(key.as_str(), value, Some(PutOptions::new().with_lease(lease)))]);
            let r = self.bounded(c.txn(txn)).await?;
            Ok(if r.succeeded() { r.header().map(|h| h.revision() as Revision) } else { None })
        })
    }

    fn compare_and_put(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> BoxFuture<'_, Result<Option<Revision>, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            let mut c = self.client.clone();
            let cmp = if expected == 0 {
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(key.as_str(), CompareOp::Equal, expected as i64)
            };
            let txn = Txn::new().when([cmp]).and_then([TxnOp::put(key.as_str(), value, None)]);
            let r = self.bounded(c.txn(txn)).await?;
            Ok(if r.succeeded() { r.header().map(|h| h.revision() as Revision) } else { None })
        })
    }

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            let mut c = self.client.clone();
            let r = self.bounded(c.get(key.as_str(), None)).await?;
            Ok(r.kvs().first().map(|kv| Entry {
                key: key.clone(),
                value: kv.value().to_vec(),
                revision: kv.mod_revision() as Revision,
            }))
        })
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<Entry>, StoreError>> {
        let prefix = prefix.to_string();
        Box::pin(async move {
            let mut c = self.client.clone();
            let r = self.bounded(c.get(prefix.as_str(), Some(GetOptions::new().with_prefix()))).await?;
            Ok(r.kvs()
                .iter()
                .map(|kv| Entry {
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                    value: kv.value().to_vec(),
                    revision: kv.mod_revision() as Revision,
                })
                .collect())
        })
    }

    fn delete(&self, key: &str, expected: Option<Revision>) -> BoxFuture<'_, Result<bool, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            let mut c = self.client.clone();
            let cmp = match expected {
                Some(rev) => Compare::mod_revision(key.as_str(), CompareOp::Equal, rev as i64),
                None => Compare::create_revision(key.as_str(), CompareOp::Greater, 0),
            };
            let txn = Txn::new().when([cmp]).and_then([TxnOp::delete(key.as_str(), None)]);
            let r = self.bounded(c.txn(txn)).await?;
            if r.succeeded() {
                let lease = self.leases.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                if let Some(lease) = lease {
                    let _ = self.bounded(c.lease_revoke(lease)).await;
                }
            }
            Ok(r.succeeded())
        })
    }

    fn watch(&self, prefix: &str) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>> {
        let prefix = prefix.to_string();
        Box::pin(async move {
            let mut c = self.client.clone();
            let mut stream = self.bounded(c.watch(prefix.as_str(), Some(WatchOptions::new().with_prefix()))).await?;
            let (tx, rx) = mpsc::channel(1024);
            tokio::spawn(async move {
                while let Ok(Some(resp)) = stream.message().await {
                    for ev in resp.events() {
                        let Some(kv) = ev.kv() else { continue };
                        let key = String::from_utf8_lossy(kv.key()).into_owned();
                        let we = match ev.event_type() {
                            EventType::Put => WatchEvent::Put(Entry {
                                key,
                                value: kv.value().to_vec(),
                                revision: kv.mod_revision() as Revision,
                            }),
                            EventType::Delete => WatchEvent::Delete { key },
                        };
                        if tx.send(we).await.is_err() {
                            return;
                        }
                    }
                }
                tracing::warn!("etcd watch ended");
            });
            Ok(rx)
        })
    }
}
