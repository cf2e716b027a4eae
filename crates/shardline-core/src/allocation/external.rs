//! `External`: placement decided outside Shardline (e.g. aligned with Kafka consumer partition
//! assignments). The strategy only checks the assignments and turns them into moves.

use std::collections::{BTreeMap, HashMap};

use super::{AllocationStrategy, Move, Plan, PlanProblem};
use crate::id::ShardId;
use crate::membership::Member;
use crate::shard_map::ShardMap;

/// Assignments given from outside: shard → node name. Shards it does not name are left alone.
///
/// ```
/// use shardline_core::{AllocationStrategy, External, Member, MemberStatus, NodeId, ShardId, ShardMap};
/// let hosts = vec![Member::new(NodeId::new("a", 1), 0).with_status(MemberStatus::Up)];
/// let ext = External::new([(ShardId(0), "a"), (ShardId(1), "ghost")]);
/// let plan = ext.plan(&hosts, &ShardMap::new(2).unwrap());
/// assert_eq!(plan.moves.len(), 1);
/// assert_eq!(plan.rejected.len(), 1);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct External {
    assignments: BTreeMap<ShardId, String>,
}

impl External {
    /// Creates the strategy from (shard, node name) pairs.
    pub fn new<N: Into<String>>(assignments: impl IntoIterator<Item = (ShardId, N)>) -> Self {
        External { assignments: assignments.into_iter().map(|(s, n)| (s, n.into())).collect() }
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
        plan
    }
}
