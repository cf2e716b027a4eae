use shardline_core::{ClusterReadModel, DomainEvent, Epoch, NodeHealth, NodeId, RebalanceReason, ShardHome, ShardId};

#[test]
fn events_feed_every_read_model() {
    let (a, b) = (NodeId::new("a", 1), NodeId::new("b", 1));
    let h = |o: &NodeId, seq| ShardHome { owner: o.clone(), epoch: Epoch { term: 1, seq } };
    let mut rm = ClusterReadModel::default();
    for e in [
        DomainEvent::NodeJoined { node: a.clone() },
        DomainEvent::NodeJoined { node: b.clone() },
        DomainEvent::LeaderElected { node: a.clone(), term: 1 },
        DomainEvent::ShardAssigned { shard: ShardId(0), home: h(&a, 1) },
        DomainEvent::ShardAssigned { shard: ShardId(1), home: h(&a, 1) },
        DomainEvent::RebalancingTriggered { term: 1, reason: RebalanceReason::Membership, planned: 1 },
        DomainEvent::ShardMigrated { shard: ShardId(1), from: a.clone(), to: h(&b, 2) },
        DomainEvent::RebalancingCompleted { term: 1, moved: 1 },
        // A late, older announcement does not roll the map back.
        DomainEvent::ShardAssigned { shard: ShardId(1), home: h(&a, 1) },
    ] {
        rm.apply(&e);
    }
    assert_eq!(rm.leader(), Some((&a, 1)));
    assert_eq!(rm.shard_map().get(&ShardId(1)).map(|h| &h.owner), Some(&b));
    assert_eq!(rm.shards_per_node().get(&a), Some(&1));
    assert_eq!(rm.rebalancing().total_moved, 1);
    assert!(!rm.rebalancing().in_progress);
    assert_eq!(rm.rebalancing().reason, Some(RebalanceReason::Membership));
    assert_eq!((rm.rebalancing().moved, rm.rebalancing().planned), (1, 1));
    rm.apply(&DomainEvent::NodeFailed { node: b.clone() });
    assert_eq!(rm.health(&b), Some(NodeHealth::Failed));
    assert!(rm.shard_map().get(&ShardId(1)).is_none(), "a failed node's shards are homeless");
    rm.apply(&DomainEvent::LeadershipLost { node: a.clone(), term: 1 });
    assert_eq!(rm.leader(), None);
    rm.apply(&DomainEvent::NodeLeft { node: a.clone() });
    assert_eq!(rm.health(&a), Some(NodeHealth::Left));
}

#[test]
fn a_new_round_counts_its_own_moves() {
    let (a, b) = (NodeId::new("a", 1), NodeId::new("b", 1));
    let h = |o: &NodeId, seq| ShardHome { owner: o.clone(), epoch: Epoch { term: 1, seq } };
    let mut rm = ClusterReadModel::default();
    rm.apply(&DomainEvent::RebalancingTriggered { term: 1, reason: RebalanceReason::Membership, planned: 1 });
    rm.apply(&DomainEvent::ShardMigrated { shard: ShardId(0), from: a.clone(), to: h(&b, 2) });
    rm.apply(&DomainEvent::RebalancingCompleted { term: 1, moved: 1 });
    rm.apply(&DomainEvent::RebalancingTriggered { term: 1, reason: RebalanceReason::Requested, planned: 2 });
    let r = rm.rebalancing();
    assert!(r.in_progress);
    assert_eq!((r.reason, r.moved, r.planned, r.total_moved), (Some(RebalanceReason::Requested), 0, 2, 1));
    rm.apply(&DomainEvent::ShardMigrated { shard: ShardId(1), from: a.clone(), to: h(&b, 3) });
    assert_eq!((rm.rebalancing().moved, rm.rebalancing().total_moved), (1, 2));
}
