//! `ConsistentHash`: a ring of virtual nodes, as in kubernetes-controller-sharding and Aether.
//!
//! Each host puts `vnodes_per_weight × weight` points on a 64-bit ring, at hashes of its
//! *name* (not its incarnation, so a restarted node gets its shards back). Shards sit at evenly
//! spaced positions and belong to the first point at or after them. Adding a host only takes
//! shards from others onto it; removing one only gives its shards away.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{moves_to, AllocationStrategy, Plan, RoundLimit};
use crate::id::NodeId;
use crate::membership::Member;
use crate::shard_map::ShardMap;

/// Consistent hashing with weighted virtual nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct ConsistentHash {
    /// Virtual nodes per unit of weight (default 150).
    pub vnodes_per_weight: u32,
    /// Most allocated shards moved per round (default: no limit; a membership change moves
    /// close to the minimum anyway).
    pub limit: RoundLimit,
}

impl Default for ConsistentHash {
    fn default() -> Self {
        ConsistentHash { vnodes_per_weight: 150, limit: RoundLimit::UNLIMITED }
    }
}

impl ConsistentHash {
    /// The owner of every shard, in shard order (empty when there are no hosts).
    pub fn owners(&self, hosts: &[Member], num_shards: u32) -> Vec<NodeId> {
        if hosts.is_empty() {
            return Vec::new();
        }
        let mut ring: Vec<(u64, usize)> = Vec::new();
        for (i, m) in hosts.iter().enumerate() {
            let points = u64::from(self.vnodes_per_weight.max(1)) * u64::from(m.weight.max(1));
            ring.extend((0..points).map(|v| (xxh3_64_with_seed(m.node.name.as_bytes(), v), i)));
        }
        // Ties between equal points go to the smaller name: independent of the hosts' order.
        ring.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| hosts[a.1].node.name.cmp(&hosts[b.1].node.name)));
        let s = u128::from(num_shards);
        let mut owners = Vec::with_capacity(num_shards as usize);
        let mut p = 0;
        for shard in 0..s {
            let pos = ((shard << 64) / s) as u64;
            while p < ring.len() && ring[p].0 < pos {
                p += 1;
            }
            let (_, host) = ring[if p == ring.len() { 0 } else { p }];
            owners.push(hosts[host].node.clone());
        }
        owners
    }
}

impl AllocationStrategy for ConsistentHash {
    fn name(&self) -> &'static str {
        "consistent-hash"
    }

    fn plan(&self, hosts: &[Member], map: &ShardMap) -> Plan {
        let owners = self.owners(hosts, map.num_shards());
        let moves = moves_to(map, |s| owners.get(s.index()).cloned());
        Plan { moves: self.limit.apply(moves, hosts, map.num_shards() as usize), rejected: Vec::new() }
    }
}
