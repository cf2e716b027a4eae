//! `--membership seeds | etcd://HOST:PORT | nats://HOST:PORT`.

use std::sync::Arc;
use std::time::Duration;

use shardline::membership::lease::{CoordinationStore, LeaseConfig, Leases};
use shardline::{MembershipProvider, Seeds};
use shardline_etcd::EtcdStore;
use shardline_nats::NatsStore;

/// A parsed `--membership` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipSpec {
    /// Seed nodes (development, single host).
    Seeds,
    /// Leases on etcd at this address.
    Etcd(String),
    /// Leases on NATS JetStream KV at this URL.
    Nats(String),
}

impl std::str::FromStr for MembershipSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "seeds" {
            Ok(MembershipSpec::Seeds)
        } else if let Some(addr) = s.strip_prefix("etcd://").filter(|a| !a.is_empty()) {
            Ok(MembershipSpec::Etcd(addr.to_string()))
        } else if s.starts_with("nats://") && s.len() > "nats://".len() {
            Ok(MembershipSpec::Nats(s.to_string()))
        } else {
            Err(format!("expected seeds, etcd://HOST:PORT or nats://HOST:PORT, got {s:?}"))
        }
    }
}

impl std::fmt::Display for MembershipSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MembershipSpec::Seeds => f.write_str("seeds"),
            MembershipSpec::Etcd(a) => write!(f, "etcd://{a}"),
            MembershipSpec::Nats(u) => f.write_str(u),
        }
    }
}

/// Lease settings of the lease providers (TTL 5 s).
pub fn lease_config() -> LeaseConfig {
    LeaseConfig::default()
}

/// Connects to the coordination store of a lease spec (None for seeds); an unreachable store
/// is an error.
pub async fn store(spec: &MembershipSpec, cluster: &str) -> Result<Option<Arc<dyn CoordinationStore>>, String> {
    let timeout = Duration::from_secs(3);
    Ok(match spec {
        MembershipSpec::Seeds => None,
        MembershipSpec::Etcd(addr) => Some(Arc::new(
            EtcdStore::connect(std::slice::from_ref(addr), timeout)
                .await
                .map_err(|e| format!("etcd at {addr}: {e}"))?,
        )),
        MembershipSpec::Nats(url) => Some(Arc::new(
            NatsStore::connect(url, cluster, lease_config().ttl, timeout)
                .await
                .map_err(|e| format!("NATS at {url}: {e}"))?,
        )),
    })
}

/// Builds the provider; a store that cannot be reached is an error.
pub async fn provider(
    spec: &MembershipSpec,
    cluster: &str,
    seeds: &[String],
) -> Result<Box<dyn MembershipProvider>, String> {
    provider_with(spec, cluster, seeds, lease_config()).await
}

/// [`provider`] with lease settings of its own.
pub async fn provider_with(
    spec: &MembershipSpec,
    cluster: &str,
    seeds: &[String],
    leases: LeaseConfig,
) -> Result<Box<dyn MembershipProvider>, String> {
    Ok(match store(spec, cluster).await? {
        None => Box::new(Seeds::new(seeds.to_vec())),
        Some(store) => Box::new(Leases::new(store, cluster, leases)),
    })
}
