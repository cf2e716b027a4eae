//! Allocation strategies: pure functions from (hosts, shard map) to moves.
//!
//! The coordinator asks its strategy for a [`Plan`] whenever membership changes and on a
//! periodic tick; it carries the moves out itself (a shard whose owner is alive moves by
//! hand-off, an unowned shard or one on a fenced node is allocated at once). A strategy never
//! sees time, never does I/O and never draws random numbers, so the same input always gives the
//! same plan.
//!
//! | strategy | from | use it when |
//! |---|---|---|
//! | [`LeastShards`] | Akka, Casty | the general default: fewest shards first, rebalance in bounded rounds |
//! | [`VersionAware`] | Shardcake | rolling updates: shards go to the newest version only |
//! | [`ConsistentHash`] | controller-sharding, Aether | stable placement, weights, minimal movement |
//! | [`Ranges`] | Endless | contiguous ranges over an ordered member list |
//! | [`External`] | Endless | placement decided elsewhere (e.g. Kafka partitions) |
//!
//! ```
//! use shardline_core::{AllocationStrategy, LeastShards, Member, MemberStatus, NodeId, ShardMap};
//! let hosts: Vec<Member> = (0..3)
//!     .map(|i| Member::new(NodeId::new(format!("n{i}"), 1), i).with_status(MemberStatus::Up))
//!     .collect();
//! let map = ShardMap::new(10).unwrap();
//! let plan = LeastShards::default().plan(&hosts, &map);
//! assert_eq!(plan.moves.len(), 10); // every shard allocated
//! ```

mod consistent_hash;
mod external;
mod least_shards;
mod ranges;
mod version_aware;

use std::collections::HashMap;
use std::fmt;

use crate::id::{NodeId, ShardId};
use crate::membership::Member;
use crate::shard_map::ShardMap;

pub use consistent_hash::ConsistentHash;
pub use external::External;
pub use least_shards::LeastShards;
pub use ranges::Ranges;
pub use version_aware::VersionAware;

/// One decision of a plan: put `shard` on `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    /// The shard.
    pub shard: ShardId,
    /// Its owner now (None: unallocated). It may be a node that can no longer host.
    pub from: Option<NodeId>,
    /// Its new owner, always one of the hosts given to the strategy.
    pub to: NodeId,
}

/// Why a strategy could not place a shard it was asked to place.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanProblem {
    /// The assignment names a node that may not host.
    #[error("{node} is not a member that may host")]
    NotAHost {
        /// The node name.
        node: String,
    },
    /// The assignment names a shard outside the map.
    #[error("shard is out of range")]
    OutOfRange,
}

/// The outcome of planning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Moves, in the order the strategy wants them carried out.
    pub moves: Vec<Move>,
    /// Shards the strategy was told to place but could not.
    pub rejected: Vec<(ShardId, PlanProblem)>,
}

impl Plan {
    /// True when nothing should change.
    pub fn is_empty(&self) -> bool {
        self.moves.is_empty()
    }
}

/// How many allocated shards one plan may move, as Akka's `rebalance-absolute-limit` and
/// `rebalance-relative-limit` (Shardcake's `rebalanceRate`): a big membership change (scaling
/// 20 → 25 pods) spreads over rounds instead of starting every hand-off at once. Shards without a
/// live owner are always all placed: the limit bounds rebalancing, never availability.
///
/// ```
/// use shardline_core::RoundLimit;
///
/// let limit = RoundLimit { absolute: 20, relative: 0.1 };
/// assert_eq!(limit.per_round(1_000), 20); // 10 % would be 100
/// assert_eq!(limit.per_round(50), 5);
/// assert_eq!(limit.per_round(3), 1); // at least one, or nothing would ever move
/// assert_eq!(RoundLimit::UNLIMITED.per_round(1_000), 1_000);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundLimit {
    /// Most allocated shards moved per round (0: no absolute limit).
    pub absolute: usize,
    /// Most allocated shards moved per round, as a fraction of all shards.
    pub relative: f64,
}

impl RoundLimit {
    /// No limit: one plan reaches the strategy's target.
    pub const UNLIMITED: RoundLimit = RoundLimit { absolute: 0, relative: 1.0 };

    /// Moves allowed per round for `num_shards` shards (at least 1).
    pub fn per_round(&self, num_shards: usize) -> usize {
        let relative = ((self.relative.max(0.0) * num_shards as f64).ceil() as usize).max(1);
        if self.absolute == 0 {
            relative
        } else {
            relative.min(self.absolute)
        }
    }

    /// Keeps every move of a shard without a live owner (not on one of `hosts`) and, in order,
    /// at most [`per_round`](Self::per_round) of the others.
    pub(crate) fn apply(&self, moves: Vec<Move>, hosts: &[Member], num_shards: usize) -> Vec<Move> {
        let mut budget = self.per_round(num_shards);
        moves
            .into_iter()
            .filter(|m| {
                let orphan = m.from.as_ref().is_none_or(|f| !hosts.iter().any(|h| &h.node == f));
                if orphan {
                    return true;
                }
                let keep = budget > 0;
                budget = budget.saturating_sub(1);
                keep
            })
            .collect()
    }
}

impl Default for RoundLimit {
    /// 100 shards or a tenth of them, whichever is fewer.
    fn default() -> Self {
        RoundLimit { absolute: 100, relative: 0.1 }
    }
}

/// Decides where shards go. Implementations are pure and deterministic.
pub trait AllocationStrategy: fmt::Debug + Send + Sync {
    /// A short name for logs and metrics.
    fn name(&self) -> &'static str;

    /// Plans moves for `map` over `hosts`: the members that may host (status `Up`, right role),
    /// in any order. Shards owned by a node outside `hosts` must be placed (when any host exists).
    fn plan(&self, hosts: &[Member], map: &ShardMap) -> Plan;

    /// Takes an assignment given from outside (shard → node name), for a strategy that follows
    /// such assignments ([`External`]); false for any other, which takes none.
    fn assign(&mut self, _shard: ShardId, _node: &str) -> bool {
        false
    }
}

/// Shards per host, and shards that sit on no host: the shared first step of most strategies.
pub(crate) struct Loads<'a> {
    /// Host ids, in the order given.
    pub hosts: Vec<&'a NodeId>,
    /// Shards of each host, ascending.
    pub shards: Vec<Vec<ShardId>>,
    /// Shards on no host (unallocated or on a node that may not host), ascending.
    pub orphans: Vec<ShardId>,
}

impl<'a> Loads<'a> {
    pub fn new(hosts: &'a [Member], map: &ShardMap) -> Self {
        let index: HashMap<&NodeId, usize> = hosts.iter().enumerate().map(|(i, m)| (&m.node, i)).collect();
        let mut shards = vec![Vec::new(); hosts.len()];
        let mut orphans = Vec::new();
        for (shard, slot) in map.iter() {
            match slot.owner.as_ref().and_then(|o| index.get(o)) {
                Some(&i) => shards[i].push(shard),
                None => orphans.push(shard),
            }
        }
        Loads { hosts: hosts.iter().map(|m| &m.node).collect(), shards, orphans }
    }

    pub fn count(&self, host: usize) -> usize {
        self.shards[host].len()
    }
}

/// Moves every shard whose owner differs from `desired(shard)`.
pub(crate) fn moves_to(map: &ShardMap, mut desired: impl FnMut(ShardId) -> Option<NodeId>) -> Vec<Move> {
    let mut moves = Vec::new();
    for (shard, slot) in map.iter() {
        if let Some(to) = desired(shard) {
            if slot.owner.as_ref() != Some(&to) {
                moves.push(Move { shard, from: slot.owner.clone(), to });
            }
        }
    }
    moves
}
