//! `Ranges`: Endless's "stateless balanced" strategy. Hosts are ordered (by membership slot,
//! then age, then name) and host `i` of `n` owns the shards `s` with `⌊s × n / S⌋ = i`: one
//! contiguous range each, of `⌊S / n⌋` or `⌈S / n⌉` shards. Every node can compute the map from
//! the member list alone.

use super::{moves_to, AllocationStrategy, Plan, RoundLimit};
use crate::id::{NodeId, ShardId};
use crate::membership::Member;
use crate::shard_map::ShardMap;

/// Contiguous shard ranges over the ordered member list.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranges {
    /// Most allocated shards moved per round (default: no limit, so that one plan puts every
    /// shard where every node computes it should be).
    pub limit: RoundLimit,
}

impl Default for Ranges {
    fn default() -> Self {
        Ranges { limit: RoundLimit::UNLIMITED }
    }
}

impl Ranges {
    /// Owner of `shard` among `hosts` for `num_shards` shards (None without hosts).
    pub fn owner_of(hosts: &[Member], shard: ShardId, num_shards: u32) -> Option<NodeId> {
        let ordered = Self::order(hosts);
        let i = Self::index(shard, ordered.len(), num_shards)?;
        ordered.get(i).map(|m| m.node.clone())
    }

    fn index(shard: ShardId, hosts: usize, num_shards: u32) -> Option<usize> {
        if hosts == 0 {
            return None;
        }
        Some(((u64::from(shard.0) * hosts as u64) / u64::from(num_shards.max(1))) as usize)
    }

    fn order(hosts: &[Member]) -> Vec<&Member> {
        let mut ordered: Vec<&Member> = hosts.iter().collect();
        ordered.sort_by(|a, b| {
            (a.slot.unwrap_or(u32::MAX), a.up_number, &a.node).cmp(&(b.slot.unwrap_or(u32::MAX), b.up_number, &b.node))
        });
        ordered
    }
}

impl AllocationStrategy for Ranges {
    fn name(&self) -> &'static str {
        "ranges"
    }

    fn plan(&self, hosts: &[Member], map: &ShardMap) -> Plan {
        let ordered = Self::order(hosts);
        let moves = moves_to(map, |shard| {
            let i = Self::index(shard, ordered.len(), map.num_shards())?;
            ordered.get(i).map(|m| m.node.clone())
        });
        Plan { moves: self.limit.apply(moves, hosts, map.num_shards() as usize), rejected: Vec::new() }
    }
}
