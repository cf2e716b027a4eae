//! `--membership seeds | etcd://HOST:PORT | nats://HOST:PORT | tls://HOST:PORT | postgres://… |
//! sqlite://PATH`.
//!
//! The etcd, NATS and PostgreSQL stores are cargo features of this crate (`etcd`, `nats`,
//! `postgres`), off by default so that the demo builds with nothing but the Rust toolchain; the
//! SQLite store (for the nodes of one host) is compiled in. A spec naming a store this build
//! lacks is an error that says which feature to turn on, never a silent fall-back to seeds.

use std::sync::Arc;
use std::time::Duration;

use shardline::membership::lease::{CoordinationStore, LeaseConfig, Leases};
use shardline::{Gossip, GossipConfig, MembershipProvider};
use shardline_core::SplitBrainPolicy;
#[cfg(feature = "etcd")]
use shardline_etcd::EtcdStore;
#[cfg(feature = "nats")]
use shardline_nats::NatsStore;
#[cfg(feature = "postgres")]
use shardline_postgres::PostgresStore;
use shardline_sqlite::SqliteStore;

/// A parsed `--membership` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipSpec {
    /// Seed nodes (development, single host).
    Seeds,
    /// Leases on etcd at this address.
    Etcd(String),
    /// Leases on NATS JetStream KV at this URL.
    Nats(String),
    /// Leases in the PostgreSQL database at this URL (the journal's, usually), expiring by the
    /// server's clock.
    Postgres(String),
    /// Leases in the SQLite file at this path, shared by the nodes of one host.
    Sqlite(String),
}

impl std::str::FromStr for MembershipSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "seeds" {
            Ok(MembershipSpec::Seeds)
        } else if let Some(addr) = s.strip_prefix("etcd://").filter(|a| !a.is_empty()) {
            Ok(MembershipSpec::Etcd(addr.to_string()))
        } else if ["nats://", "tls://"].iter().any(|p| s.len() > p.len() && s.starts_with(p)) {
            Ok(MembershipSpec::Nats(s.to_string()))
        } else if ["postgres://", "postgresql://"].iter().any(|p| s.len() > p.len() && s.starts_with(p)) {
            Ok(MembershipSpec::Postgres(s.to_string()))
        } else if let Some(path) = s.strip_prefix("sqlite://").filter(|p| !p.is_empty()) {
            Ok(MembershipSpec::Sqlite(path.to_string()))
        } else {
            Err(format!(
                "expected seeds, etcd://HOST:PORT, nats://HOST:PORT, postgres://USER@HOST:PORT/DATABASE or \
                 sqlite://PATH, got {s:?}"
            ))
        }
    }
}

/// `url` with its password (or token) replaced by `…`, for logs and errors.
///
/// ```
/// assert_eq!(shardline_cli::redacted("nats://u:secret@h:1"), "nats://u:…@h:1");
/// assert_eq!(shardline_cli::redacted("nats://token@h:1"), "nats://…@h:1");
/// assert_eq!(shardline_cli::redacted("seeds"), "seeds");
/// ```
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split_once(':').map_or(String::new(), |(u, _)| format!("{u}:"));
            format!("{scheme}://{user}…@{host}{}", &rest[authority_end..])
        }
        None => url.to_string(),
    }
}

impl std::fmt::Display for MembershipSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MembershipSpec::Seeds => f.write_str("seeds"),
            MembershipSpec::Etcd(a) => write!(f, "etcd://{a}"),
            MembershipSpec::Nats(u) | MembershipSpec::Postgres(u) => f.write_str(u),
            MembershipSpec::Sqlite(p) => write!(f, "sqlite://{p}"),
        }
    }
}

/// A `--split-brain` value: `off`, `keep-majority`, `keep-oldest`, or `static-quorum:N` (see
/// [`resolve_split_brain`] for what each membership makes of it).
#[derive(Clone, Debug, PartialEq)]
pub struct SplitBrainArg(pub Option<SplitBrainPolicy>);

impl std::str::FromStr for SplitBrainArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let policy = match s {
            "off" => None,
            "keep-majority" => Some(SplitBrainPolicy::KeepMajority),
            "keep-oldest" => Some(SplitBrainPolicy::KeepOldest { down_if_alone: true }),
            _ => match s.strip_prefix("static-quorum:").map(str::parse::<usize>) {
                Some(Ok(quorum)) if quorum > 0 => Some(SplitBrainPolicy::StaticQuorum { quorum }),
                _ => {
                    return Err(format!(
                        "expected off, keep-majority, keep-oldest or static-quorum:N (N ≥ 1), got {s:?}"
                    ))
                }
            },
        };
        Ok(SplitBrainArg(policy))
    }
}

/// The lease and gossip settings of a `--split-brain` value (None: the membership's default)
/// and its stable-after. Gossip: the policy, `keep-majority` by default, with the stable-after
/// as its down margin too; `off` is gossip without a resolver (both sides of a partition go
/// on). Leases: the store race (which keeps the larger side) unless `off`; the other policies
/// are gossip's, and an error here.
pub fn resolve_split_brain(
    spec: &MembershipSpec,
    split_brain: Option<&SplitBrainArg>,
    stable_after_ms: u64,
) -> Result<(LeaseConfig, GossipConfig), String> {
    let gossip = match split_brain.map_or(Some(SplitBrainPolicy::KeepMajority), |a| a.0.clone()) {
        Some(policy) => GossipConfig::with_split_brain(policy, stable_after_ms),
        None => {
            GossipConfig { stable_after_ms, down_margin_ms: stable_after_ms, ..GossipConfig::without_split_brain() }
        }
    };
    let mut leases = lease_config();
    match (split_brain.map(|a| &a.0), spec) {
        (_, MembershipSpec::Seeds) => {}
        (Some(None), _) => leases.split_brain = None,
        (None | Some(Some(SplitBrainPolicy::KeepMajority)), _) => {
            if let Some(c) = leases.split_brain.as_mut() {
                c.stable_after_ms = stable_after_ms;
            }
        }
        (Some(Some(other)), _) => {
            return Err(format!(
                "--split-brain {other:?} is for gossip membership; lease membership ({spec}) races for a key in its \
                 store, which keeps the larger side: use keep-majority (the default) or off"
            ))
        }
    }
    Ok((leases, gossip))
}

/// Lease settings of the lease providers (TTL 3 s).
pub fn lease_config() -> LeaseConfig {
    LeaseConfig::default()
}

/// Connects to the coordination store of a lease spec (None for seeds); an unreachable store
/// is an error.
pub async fn store(spec: &MembershipSpec, cluster: &str) -> Result<Option<Arc<dyn CoordinationStore>>, String> {
    let timeout = Duration::from_secs(3);
    match spec {
        MembershipSpec::Seeds => Ok(None),
        MembershipSpec::Etcd(addr) => etcd_store(addr, timeout).await.map(Some),
        MembershipSpec::Nats(url) => nats_store(url, cluster, timeout).await.map(Some),
        MembershipSpec::Postgres(url) => postgres_store(url, cluster, timeout).await.map(Some),
        MembershipSpec::Sqlite(path) => {
            let store = SqliteStore::open(path).map_err(|e| format!("SQLite at {path}: {e}"))?;
            Ok(Some(Arc::new(store)))
        }
    }
}

/// The store's tables go in the schema the journal of `shardline node` uses for this cluster.
#[cfg(feature = "postgres")]
async fn postgres_store(url: &str, cluster: &str, timeout: Duration) -> Result<Arc<dyn CoordinationStore>, String> {
    let schema = crate::store::schema_name(cluster);
    let store = PostgresStore::connect(url, &schema, timeout)
        .await
        .map_err(|e| format!("PostgreSQL at {}: {e}", redacted(url)))?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "postgres"))]
async fn postgres_store(url: &str, _cluster: &str, _timeout: Duration) -> Result<Arc<dyn CoordinationStore>, String> {
    Err(missing_feature("postgres", url))
}

#[cfg(feature = "etcd")]
async fn etcd_store(addr: &str, timeout: Duration) -> Result<Arc<dyn CoordinationStore>, String> {
    let url = format!("etcd://{addr}");
    let store = EtcdStore::connect_url(&url, timeout).await.map_err(|e| format!("etcd at {}: {e}", redacted(&url)))?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "etcd"))]
async fn etcd_store(addr: &str, _timeout: Duration) -> Result<Arc<dyn CoordinationStore>, String> {
    Err(missing_feature("etcd", &format!("etcd://{addr}")))
}

#[cfg(feature = "nats")]
async fn nats_store(url: &str, cluster: &str, timeout: Duration) -> Result<Arc<dyn CoordinationStore>, String> {
    let store = NatsStore::connect(url, cluster, lease_config().ttl, timeout)
        .await
        .map_err(|e| format!("NATS at {}: {e}", redacted(url)))?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "nats"))]
async fn nats_store(url: &str, _cluster: &str, _timeout: Duration) -> Result<Arc<dyn CoordinationStore>, String> {
    Err(missing_feature("nats", url))
}

#[cfg(any(not(feature = "etcd"), not(feature = "nats"), not(feature = "postgres")))]
fn missing_feature(feature: &str, spec: &str) -> String {
    format!(
        "--membership {} needs the `{feature}` feature, which this build lacks: \
         rebuild with `cargo build --release -p shardline-cli --features {feature}`",
        redacted(spec)
    )
}

/// Builds the provider; a store that cannot be reached is an error.
pub async fn provider(
    spec: &MembershipSpec,
    cluster: &str,
    seeds: &[String],
) -> Result<Box<dyn MembershipProvider>, String> {
    provider_with(spec, cluster, seeds, lease_config(), GossipConfig::default()).await
}

/// [`provider`] with settings of its own. With gossip, set `gossip.term_floor` to the journal's
/// highest fence term (see [`Gossip::term_floor`]).
pub async fn provider_with(
    spec: &MembershipSpec,
    cluster: &str,
    seeds: &[String],
    leases: LeaseConfig,
    gossip: GossipConfig,
) -> Result<Box<dyn MembershipProvider>, String> {
    Ok(match store(spec, cluster).await? {
        None => Box::new(Gossip::new(seeds.to_vec()).with_config(gossip)),
        Some(store) => Box::new(Leases::new(store, cluster, leases)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_specs_parse_and_print_back() {
        for (text, spec) in [
            ("seeds", MembershipSpec::Seeds),
            ("etcd://127.0.0.1:2379", MembershipSpec::Etcd("127.0.0.1:2379".into())),
            ("nats://127.0.0.1:4222", MembershipSpec::Nats("nats://127.0.0.1:4222".into())),
            (
                "postgres://postgres@127.0.0.1:5432/test",
                MembershipSpec::Postgres("postgres://postgres@127.0.0.1:5432/test".into()),
            ),
            ("sqlite://run/members.db", MembershipSpec::Sqlite("run/members.db".into())),
        ] {
            assert_eq!(text.parse(), Ok(spec.clone()), "{text}");
            assert_eq!(spec.to_string(), text);
        }
        for bad in ["", "etcd://", "postgres://", "sqlite://", "zookeeper://x"] {
            assert!(bad.parse::<MembershipSpec>().is_err(), "{bad:?}");
        }
    }

    /// Gossip resolves partitions unless told `off`; lease membership takes only keep-majority
    /// or off.
    #[test]
    fn split_brain_flags_resolve_to_keep_majority_by_default() {
        let arg = |s: &str| s.parse::<SplitBrainArg>().ok();
        let gossip =
            |a: Option<SplitBrainArg>| resolve_split_brain(&MembershipSpec::Seeds, a.as_ref(), 5_000).map(|r| r.1);
        assert_eq!(gossip(None).ok().and_then(|g| g.split_brain), Some(SplitBrainPolicy::KeepMajority));
        assert_eq!(gossip(arg("off")).ok().map(|g| g.split_brain), Some(None));
        let oldest = Some(SplitBrainPolicy::KeepOldest { down_if_alone: true });
        assert_eq!(gossip(arg("keep-oldest")).ok().and_then(|g| g.split_brain), oldest);
        let etcd = MembershipSpec::Etcd("127.0.0.1:2379".into());
        assert!(resolve_split_brain(&etcd, arg("keep-oldest").as_ref(), 5_000).is_err());
        let leases = resolve_split_brain(&etcd, arg("off").as_ref(), 5_000).map(|r| r.0.split_brain.is_none());
        assert_eq!(leases, Ok(true));
    }
}
