//! `External`: placement decided outside Shardline (e.g. aligned with Kafka consumer partition
//! assignments). The strategy only checks the assignments and turns them into moves.

use std::collections::{BTreeMap, HashMap};

use super::{AllocationStrategy, LeastShards, Move, Plan, PlanProblem};
use crate::id::ShardId;
use crate::membership::Member;
use crate::shard_map::ShardMap;

/// Assignments given from outside: shard → node name. Shards it does not name, and named shards
/// whose node cannot host them now, are left alone, or placed by the strategy given with
/// [`otherwise`](External::otherwise) (without one, a shard whose owner died stays homeless until
/// it is assigned again).
///
/// ```
/// use shardline_core::{AllocationStrategy, External, Member, MemberStatus, NodeId, ShardId, ShardMap};
/// let hosts = vec![Member::new(NodeId::new("a", 1), 0).with_status(MemberStatus::Up)];
/// let ext = External::new([(ShardId(0), "a"), (ShardId(1), "ghost")]);
/// let plan = ext.plan(&hosts, &ShardMap::new(2).unwrap());
/// assert_eq!(plan.moves.len(), 1);
/// assert_eq!(plan.rejected.len(), 1);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct External {
    assignments: BTreeMap<ShardId, String>,
    otherwise: Option<LeastShards>,
}

impl External {
    /// Creates the strategy from (shard, node name) pairs.
    pub fn new<N: Into<String>>(assignments: impl IntoIterator<Item = (ShardId, N)>) -> Self {
        External { assignments: assignments.into_iter().map(|(s, n)| (s, n.into())).collect(), otherwise: None }
    }

    /// Places what the assignments do not (unnamed shards, and named ones whose node cannot host
    /// now) with `fallback`.
    ///
    /// ```
    /// use shardline_core::{AllocationStrategy, External, LeastShards, Member, MemberStatus, NodeId, ShardId, ShardMap};
    /// let hosts = vec![Member::new(NodeId::new("a", 1), 0).with_status(MemberStatus::Up)];
    /// let ext = External::new([(ShardId(0), "ghost")]).otherwise(LeastShards::default());
    /// let plan = ext.plan(&hosts, &ShardMap::new(2).unwrap());
    /// assert_eq!(plan.moves.len(), 2, "both shards placed on a");
    /// ```
    pub fn otherwise(mut self, fallback: LeastShards) -> Self {
        self.otherwise = Some(fallback);
        self
    }

    /// Sets where `shard` goes (replacing what it was assigned before).
    pub fn assign(&mut self, shard: ShardId, node: impl Into<String>) {
        self.assignments.insert(shard, node.into());
    }

    /// The assignments.
    pub fn assignments(&self) -> &BTreeMap<ShardId, String> {
        &self.assignments
    }
}

impl AllocationStrategy for External {
    fn name(&self) -> &'static str {
        "external"
    }

    fn plan(&self, hosts: &[Member], map: &ShardMap) -> Plan {
        let mut plan = Plan::default();
        let by_name: HashMap<&str, &Member> = hosts.iter().map(|m| (&*m.node.name, m)).collect();
        for (&shard, name) in &self.assignments {
            let Some(slot) = map.slot(shard) else {
                plan.rejected.push((shard, PlanProblem::OutOfRange));
                continue;
            };
            match by_name.get(name.as_str()) {
                None => plan.rejected.push((shard, PlanProblem::NotAHost { node: name.clone() })),
                Some(m) if slot.owner.as_ref() != Some(&m.node) => {
                    plan.moves.push(Move { shard, from: slot.owner.clone(), to: m.node.clone() })
                }
                Some(_) => {}
            }
        }
        if let Some(fallback) = &self.otherwise {
            // A named shard is the assignments' to move only while its node can take it.
            let ruled = |shard: &ShardId| {
                self.assignments.get(shard).is_some_and(|n| by_name.contains_key(n.as_str()))
                    && map.slot(*shard).is_some()
            };
            plan.moves.extend(fallback.plan(hosts, map).moves.into_iter().filter(|m| !ruled(&m.shard)));
        }
        plan
    }

    fn assign(&mut self, shard: ShardId, node: &str) -> bool {
        External::assign(self, shard, node);
        true
    }
}
