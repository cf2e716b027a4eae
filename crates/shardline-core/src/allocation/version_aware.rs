//! `VersionAware`: Shardcake's assignment algorithm, for rolling updates.
//!
//! 1. `average = num_shards / hosts` (a real number).
//! 2. Every host above the average offers `floor(count − average)` of its shards (its highest
//!    shard numbers: the seed picks them at random, we pick deterministically). When hosts run
//!    different versions no host offers anything: a rolling update is under way.
//! 3. Shards to place = unallocated shards, then the offered ones from the hosts with the most
//!    shards, then those on the oldest hosts.
//! 4. Each goes to the host with the fewest shards among those running the newest version,
//!    unless that is its current host, or that host has only one shard fewer (or more) than the
//!    current host: a move that gains one shard is not worth it.
//! 5. At most [`RoundLimit::per_round`] shards that have a live owner move per plan (Shardcake's
//!    `rebalanceRate`); unallocated shards are all placed.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::{AllocationStrategy, Loads, Move, Plan, RoundLimit};
use crate::membership::Member;
use crate::shard_map::ShardMap;

/// Balances shards, placing them on newest-version hosts only and not rebalancing while versions
/// are mixed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VersionAware {
    /// Most allocated shards moved per round.
    pub limit: RoundLimit,
}

impl VersionAware {
    /// No per-round limit: one plan reaches the rule's balance.
    pub fn unlimited() -> Self {
        VersionAware { limit: RoundLimit::UNLIMITED }
    }
}

impl AllocationStrategy for VersionAware {
    fn name(&self) -> &'static str {
        "version-aware"
    }

    fn plan(&self, hosts: &[Member], map: &ShardMap) -> Plan {
        let Some(newest) = hosts.iter().map(|m| &m.app_version).max() else {
            return Plan::default();
        };
        let loads = Loads::new(hosts, map);
        let n = hosts.len();
        let mixed = hosts.iter().any(|m| &m.app_version != newest);
        let average = f64::from(map.num_shards()) / n as f64;
        let mut counts: Vec<usize> = (0..n).map(|i| loads.count(i)).collect();

        // (shard, current host) in the order of step 3.
        let mut todo: Vec<(crate::id::ShardId, Option<usize>)> = loads.orphans.iter().map(|&s| (s, None)).collect();
        if !mixed {
            let mut extra = Vec::new();
            for (i, shards) in loads.shards.iter().enumerate() {
                let excess = (counts[i] as f64 - average).floor().max(0.0) as usize;
                extra.extend(shards.iter().rev().take(excess).map(|&s| (s, Some(i))));
            }
            extra.sort_by_key(|&(s, h)| {
                let h = h.unwrap_or(0);
                (Reverse(counts[h]), hosts[h].up_number, s)
            });
            todo.extend(extra);
        }

        // Newest-version hosts ordered by (shards, index): the least loaded is the first.
        let newest_only = |i: &usize| &hosts[*i].app_version == newest;
        let mut eligible: BTreeSet<(usize, usize)> = (0..n).filter(newest_only).map(|i| (counts[i], i)).collect();
        let mut moves = Vec::new();
        let mut budget = self.limit.per_round(map.num_shards() as usize);
        for (shard, current) in todo {
            let Some(&(least_count, least)) = eligible.first() else { break };
            if let Some(c) = current {
                if c == least || least_count + 1 >= counts[c] {
                    continue;
                }
                if budget == 0 {
                    break;
                }
                budget -= 1;
                if eligible.remove(&(counts[c], c)) {
                    eligible.insert((counts[c] - 1, c));
                }
                counts[c] -= 1;
            }
            eligible.remove(&(least_count, least));
            counts[least] += 1;
            eligible.insert((counts[least], least));
            moves.push(Move { shard, from: map.owner(shard).cloned(), to: loads.hosts[least].clone() });
        }
        Plan { moves, rejected: Vec::new() }
    }
}
