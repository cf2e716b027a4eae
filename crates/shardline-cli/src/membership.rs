//! `--membership seeds | etcd://HOST:PORT | nats://HOST:PORT`.

use std::sync::Arc;
use std::time::Duration;

use shardline::membership::lease::{LeaseConfig, Leases};
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

/// Builds the provider; a store that cannot be reached is an error.
pub async fn provider(
    spec: &MembershipSpec,
    cluster: &str,
    seeds: &[String],
) -> Result<Box<dyn MembershipProvider>, String> {
    let timeout = Duration::from_secs(3);
    Ok(match spec {
        MembershipSpec::Seeds => Box::new(Seeds::new(seeds.to_vec())),
        MembershipSpec::Etcd(addr) => {
            let store = EtcdStore::connect(std::slice::from_ref(addr), timeout)
                .await
                .map_err(|e| format!("etcd at {addr}: {e}"))?;
            Box::new(Leases::new(Arc::new(store), cluster, lease_config()))
        }
        MembershipSpec::Nats(url) => {
            let store = NatsStore::connect(url, cluster, lease_config().ttl, timeout)
                .await
                .map_err(|e| format!("NATS at {url}: {e}"))?;
            Box::new(Leases::new(Arc::new(store), cluster, lease_config()))
        }
    })
}
