//! The demo application of the `shardline` binary: its entity types, shared with the tests.

pub mod account;
pub mod alarm;
pub mod heap;
pub mod history;
pub mod membership;
pub use membership::redacted;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use shardline::entity::{EventSourcedHandle, EventSourcedSettings};
use shardline::journal::Journal;
use shardline::{Cluster, ConfigError, EntityHandle, EntitySettings, StrategyKind};

pub use account::{Account, AccountCmd, AccountReply, Echo, MemoryAccount};
pub use alarm::{register_alarms, Alarm, AlarmCmd, Alarms};

/// Settings of the demo's account type.
pub fn account_settings(shards: u32) -> EntitySettings {
    EntitySettings::new("account")
        .shards(shards)
        .ask_timeout(Duration::from_secs(5))
        .hand_off_timeout(Duration::from_secs(5))
}

/// The handle of the demo's accounts.
pub type Accounts = EventSourcedHandle<Account>;

/// Registers the account type: hosted in `journal` on a node, routed only on a proxy (None).
pub async fn register_accounts(
    cluster: &Cluster,
    shards: u32,
    strategy: &StrategyKind,
    journal: Option<Arc<dyn Journal>>,
) -> Result<Accounts, ConfigError> {
    register_accounts_with(cluster, account_type(shards, strategy, journal)).await
}

/// The account type's settings: [`account_settings`] with a strategy, and a journal on a node.
pub fn account_type(shards: u32, strategy: &StrategyKind, journal: Option<Arc<dyn Journal>>) -> EntitySettings {
    let settings = account_settings(shards).strategy(strategy.clone());
    match journal {
        Some(j) => settings.journal(j),
        None => settings,
    }
}

/// The settings of the accounts kept in memory ([`MemoryAccount`], type `memory-account`): the
/// accounts' settings under another type key, with no journal. Nodes serve them beside the
/// journaled ones, as the floor the demo and `durable-ask` measure against.
/// Under `external`, whose shards wait for an operator's placement, they take least-shards.
pub fn memory_account_settings(shards: u32, strategy: &StrategyKind) -> EntitySettings {
    let strategy = match strategy {
        StrategyKind::External => &StrategyKind::LeastShards,
        other => other,
    };
    EntitySettings::new("memory-account")
        .shards(shards)
        .ask_timeout(Duration::from_secs(5))
        .hand_off_timeout(Duration::from_secs(5))
        .strategy(strategy.clone())
}

/// Registers the in-memory accounts (see [`memory_account_settings`]).
pub async fn register_memory_accounts(
    cluster: &Cluster,
    shards: u32,
    strategy: &StrategyKind,
) -> Result<EntityHandle<MemoryAccount>, ConfigError> {
    cluster.register::<MemoryAccount>(memory_account_settings(shards, strategy)).await
}

/// Registers the account type with these settings.
pub async fn register_accounts_with(cluster: &Cluster, settings: EntitySettings) -> Result<Accounts, ConfigError> {
    cluster.register_event_sourced::<Account>(settings, EventSourcedSettings::default()).await
}

/// A `--strategy` value: `least-shards` (default), `version-aware`, `consistent-hash`, `ranges`,
/// `external` (shards placed through the admin API's `PUT /api/shards`).
#[derive(Clone, Debug, PartialEq)]
pub struct StrategyArg(pub StrategyKind);

impl std::str::FromStr for StrategyArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(StrategyArg(match s {
            "least-shards" => StrategyKind::LeastShards,
            "version-aware" => StrategyKind::VersionAware,
            "consistent-hash" => StrategyKind::ConsistentHash,
            "ranges" => StrategyKind::Ranges,
            "external" => StrategyKind::External,
            _ => {
                return Err(format!(
                    "expected least-shards, version-aware, consistent-hash, ranges or external, got {s:?}"
                ))
            }
        }))
    }
}

impl std::fmt::Display for StrategyArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            StrategyKind::LeastShards => "least-shards",
            StrategyKind::VersionAware => "version-aware",
            StrategyKind::ConsistentHash => "consistent-hash",
            StrategyKind::Ranges => "ranges",
            StrategyKind::External => "external",
        })
    }
}
