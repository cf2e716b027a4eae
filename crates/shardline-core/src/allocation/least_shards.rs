//! `LeastShards`: new shards go to the host with the fewest; rebalancing moves shards from the
//! fullest hosts to the emptiest, a bounded number per round (Akka's strategy). Like Akka's, it
//! prefers the newest application version: while hosts run different versions (a rolling
//! update), new shards go only to newest-version hosts and nothing is rebalanced, so no shard is
//! handed to a pod that is about to stop.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{AllocationStrategy, Loads, Move, Plan, RoundLimit};
use crate::membership::{AppVersion, Member};
use crate::shard_map::ShardMap;

/// Balances the number of shards per host.
///
/// Unallocated shards are always all placed. Rebalancing moves at most
/// [`limit.per_round`](RoundLimit::per_round) allocated shards per plan, so a big change
/// spreads over several rounds; applied round after round, the plans reach `max − min ≤ 1`
/// with the least number of moves that can get there. While versions are mixed, unallocated
/// shards go to the least loaded newest-version hosts and nothing is rebalanced.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct LeastShards {
    /// Most allocated shards moved per round.
    pub limit: RoundLimit,
}

impl LeastShards {
    /// No per-round limit: one plan reaches balance.
    pub fn unlimited() -> Self {
        LeastShards { limit: RoundLimit::UNLIMITED }
    }

    /// With a per-round limit.
    pub fn with_limit(limit: RoundLimit) -> Self {
        LeastShards { limit }
    }
}

/// During a rolling update: each unallocated shard goes to the newest-version host with the
/// fewest shards; allocated shards stay where they are.
fn place_on_newest(hosts: &[Member], map: &ShardMap, newest: &AppVersion) -> Plan {
    let loads = Loads::new(hosts, map);
    let mut least: BinaryHeap<Reverse<(usize, usize)>> =
        (0..hosts.len()).filter(|&i| &hosts[i].app_version == newest).map(|i| Reverse((loads.count(i), i))).collect();
    let mut moves = Vec::new();
    for &shard in &loads.orphans {
        let Some(Reverse((count, i))) = least.pop() else { break };
        moves.push(Move { shard, from: map.owner(shard).cloned(), to: loads.hosts[i].clone() });
        least.push(Reverse((count + 1, i)));
    }
    Plan { moves, rejected: Vec::new() }
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
        let Some(newest) = hosts.iter().map(|m| &m.app_version).max() else {
            return Plan::default();
        };
        if hosts.iter().any(|m| &m.app_version != newest) {
            return place_on_newest(hosts, map, newest);
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
        let mut budget = self.limit.per_round(map.num_shards() as usize);
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
