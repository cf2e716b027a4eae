//! `LeastShards`: new shards go to the host with the fewest; rebalancing moves shards from the
//! fullest hosts to the emptiest, a bounded number per round (Akka's strategy).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{AllocationStrategy, Loads, Move, Plan};
use crate::membership::Member;
use crate::shard_map::ShardMap;

/// Balances the number of shards per host.
///
/// Unallocated shards are always all placed. Rebalancing moves at most
/// `min(absolute_limit, max(1, ceil(relative_limit × num_shards)))` allocated shards per plan,
/// so a big change spreads over several rounds; applied round after round, the plans reach
/// `max − min ≤ 1` with the least number of moves that can get there.
#[derive(Clone, Debug, PartialEq)]
pub struct LeastShards {
    /// Most allocated shards moved per round (0: no absolute limit).
    pub absolute_limit: usize,
    /// Most allocated shards moved per round as a fraction of all shards.
    pub relative_limit: f64,
}

impl Default for LeastShards {
    fn default() -> Self {
        LeastShards { absolute_limit: 100, relative_limit: 0.1 }
    }
}

impl LeastShards {
    /// No per-round limit: one plan reaches balance.
    pub fn unlimited() -> Self {
        LeastShards { absolute_limit: 0, relative_limit: 1.0 }
    }

    fn round_limit(&self, num_shards: usize) -> usize {
        let relative = ((self.relative_limit.max(0.0) * num_shards as f64).ceil() as usize).max(1);
        if self.absolute_limit == 0 {
            relative
        } else {
            relative.min(self.absolute_limit)
        }
    }
}

/// Per-host target counts reaching `max − min ≤ 1` with the fewest moves: every host gets
/// `q = total / n`, and the `total % n` hosts holding the most shards get one more.
pub(crate) fn balanced_targets(counts: &[usize], total: usize) -> Vec<usize> {
    let n = counts.len();
    let (q, r) = (total / n, total % n);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (Reverse(counts[i]), i));
    let mut targets = vec![q; n];
    for &i in order.iter().take(r) {
        targets[i] += 1;
    }
    targets
}

impl AllocationStrategy for LeastShards {
    fn name(&self) -> &'static str {
        "least-shards"
    }

    fn plan(&self, hosts: &[Member], map: &ShardMap) -> Plan {
        if hosts.is_empty() {
            return Plan::default();
        }
        let loads = Loads::new(hosts, map);
        let n = hosts.len();
        let counts: Vec<usize> = (0..n).map(|i| loads.count(i)).collect();
        let targets = balanced_targets(&counts, map.num_shards() as usize);
        let mut now = counts.clone();

        // Hosts below target, fewest shards first.
        let mut takers: BinaryHeap<Reverse<(usize, usize)>> =
            (0..n).filter(|&i| now[i] < targets[i]).map(|i| Reverse((now[i], i))).collect();
        let mut moves = Vec::new();
        let take = |now: &mut Vec<usize>, takers: &mut BinaryHeap<Reverse<(usize, usize)>>| {
            let Reverse((_, i)) = takers.pop()?;
            now[i] += 1;
            if now[i] < targets[i] {
                takers.push(Reverse((now[i], i)));
            }
            Some(i)
        };

        for &shard in &loads.orphans {
            let Some(i) = take(&mut now, &mut takers) else { break };
            let from = map.owner(shard).cloned();
            moves.push(Move { shard, from, to: loads.hosts[i].clone() });
        }

        // Rebalance: from the fullest hosts above target, their highest shards first.
        let mut budget = self.round_limit(map.num_shards() as usize);
        let mut givers: Vec<usize> = (0..n).filter(|&i| counts[i] > targets[i]).collect();
        givers.sort_by_key(|&i| (Reverse(counts[i]), i));
        'give: for g in givers {
            let excess = counts[g] - targets[g];
            for &shard in loads.shards[g].iter().rev().take(excess) {
                if budget == 0 {
                    break 'give;
                }
                let Some(i) = take(&mut now, &mut takers) else { break 'give };
                budget -= 1;
                moves.push(Move { shard, from: Some(loads.hosts[g].clone()), to: loads.hosts[i].clone() });
            }
        }
        Plan { moves, rejected: Vec::new() }
    }
}
