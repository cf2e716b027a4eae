//! Waiting for the cluster to form: [`Cluster::formed`], what an application awaits after
//! `build()` before it sends, so that its first messages meet the cluster it meant to start and
//! not the one node that happened to be first.
//!
//! Right after `build()` the first node hosts every shard: the others have not joined yet, and
//! the coordinator gives new members shards only at its next rebalance round
//! ([`EntitySettings::rebalance_interval`](crate::EntitySettings::rebalance_interval)). Unlike
//! [`readiness`](Cluster::readiness), which asks this node alone (a probe must not depend on its
//! peers), this asks about the whole cluster as this node sees it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use shardline_core::{MemberStatus, NodeId};

use super::Cluster;
use crate::error::Error;

/// How often the wait looks again.
const POLL: Duration = Duration::from_millis(20);

/// Why the cluster has not formed yet, as [`Cluster::formation`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Formation {
    /// This node is up, at least the members asked for are up, and every shard of every
    /// registered type is served by an up member, each member that may host holding some.
    Formed,
    /// Fewer members are up than asked for.
    Members {
        /// Members up (this node included).
        up: usize,
        /// Members asked for.
        wanted: usize,
    },
    /// This node is not up yet (joining), or has no leader to place shards.
    NotJoined,
    /// A type's shards are not placed yet: some have no home or a home that is not up, or an
    /// up member that may host them holds none of them yet.
    Placing {
        /// The type.
        type_key: String,
    },
}

impl Cluster {
    /// Where the cluster's forming stands, as this node sees it (see [`Formation`]).
    pub fn formation(&self, members: usize) -> Formation {
        let view = self.view();
        let me = self.node_id();
        if view.leader.is_none() || view.view.get(me).map(|m| m.status) != Some(MemberStatus::Up) {
            return Formation::NotJoined;
        }
        let up: Vec<_> = view.view.members().filter(|m| m.status == MemberStatus::Up).collect();
        if up.len() < members {
            return Formation::Members { up: up.len(), wanted: members };
        }
        let up_ids: BTreeSet<&NodeId> = up.iter().map(|m| &m.node).collect();
        let hosts: BTreeSet<&NodeId> = up.iter().filter(|m| !m.is_proxy()).map(|m| &m.node).collect();
        for region in self.regions() {
            let homes = region.homes();
            let placed = homes.iter().all(|h| h.as_ref().is_some_and(|h| up_ids.contains(h)));
            let holding: BTreeSet<&NodeId> = homes.iter().flatten().collect();
            // With fewer shards than members, some members rightly hold none.
            let spread = homes.len() < hosts.len() || hosts.iter().all(|h| holding.contains(h));
            if !placed || !spread || !region.is_settled() {
                return Formation::Placing { type_key: region.settings().type_key.clone() };
            }
        }
        Formation::Formed
    }

    /// Resolves once at least `members` members are up (this node among them) and every
    /// registered type's shards are served by them, each member that may host holding some (see
    /// [`Formation`]); [`Error::Timeout`] after `timeout`. Register the types first: a type
    /// registered later is placed later.
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// async fn start(cluster: &shardline::Cluster) -> Result<(), shardline::Error> {
    ///     // Three nodes are starting: send nothing before all three serve.
    ///     cluster.formed_within(3, Duration::from_secs(30)).await
    /// }
    /// ```
    pub async fn formed_within(&self, members: usize, timeout: Duration) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            let formation = self.formation(members);
            if formation == Formation::Formed {
                return Ok(());
            }
            if started.elapsed() >= timeout {
                tracing::warn!(?formation, members, "the cluster did not form in time");
                return Err(Error::Timeout(timeout));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// [`formed_within`](Self::formed_within) with a 60 s limit.
    pub async fn formed(&self, members: usize) -> Result<(), Error> {
        self.formed_within(members, Duration::from_secs(60)).await
    }
}
