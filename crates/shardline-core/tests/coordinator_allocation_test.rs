//! Allocation after recovery, GetShardHome answers, and fenced owners.

mod common;

use common::*;
use shardline_core::Engine;
use shardline_core::{CoordinatorCommand, DomainEvent, MemberStatus, ShardId};

#[test]
fn allocates_every_shard_once_all_members_reported() {
    let mut c = recovering(4, &["a", "b"], 1, None);
    let cmds = drain(&mut c);
    assert!(cmds.contains(&CoordinatorCommand::RequestRegistration { to: vec![node("a"), node("b")] }));
    c.handle_register(0, &node("a"), 1, &[], true);
    assert!(c.is_recovering(), "b has not reported");
    assert_eq!(c.shard_map().unallocated().count(), 4);
    drain(&mut c);
    c.handle_register(1, &node("b"), 1, &[], true);
    assert!(!c.is_recovering());
    let cmds = drain(&mut c);
    let announced: Vec<_> = cmds
        .iter()
        .filter_map(|c| match c {
            CoordinatorCommand::AnnounceShardHomes { to, homes } => Some((to.clone(), homes.len())),
            _ => None,
        })
        .collect();
    assert_eq!(announced, vec![(vec![node("a"), node("b")], 4)]);
    assert!(cmds
        .iter()
        .any(|c| matches!(c, CoordinatorCommand::PersistShardMap { changes, .. } if changes.len() == 4)));
    let persist = cmds.iter().position(|c| matches!(c, CoordinatorCommand::PersistShardMap { .. })).unwrap();
    let announce = cmds.iter().position(|c| matches!(c, CoordinatorCommand::AnnounceShardHomes { .. })).unwrap();
    assert!(persist < announce, "persist before announcing");
    let counts = c.shard_map().counts();
    assert_eq!(counts.get(&node("a")), Some(&2));
    assert_eq!(counts.get(&node("b")), Some(&2));
}

#[test]
fn get_shard_home_answers_known_homes_only() {
    let mut c = coordinator(2, &["a"]);
    drain(&mut c);
    c.handle_get_shard_home(5, &node("a"), ShardId(1));
    let home = c.shard_map().home(ShardId(1)).unwrap();
    assert_eq!(drain(&mut c), vec![CoordinatorCommand::SendShardHome { to: node("a"), shard: ShardId(1), home }]);
    c.handle_get_shard_home(5, &node("a"), ShardId(99));
    assert!(drain(&mut c).is_empty(), "out of range: no answer, no panic");
}

#[test]
fn fenced_owner_loses_shards_at_once() {
    let mut c = coordinator(6, &["a", "b", "c"]);
    drain(&mut c);
    let of_b: Vec<ShardId> = c.shard_map().shards_of(&node("b")).collect();
    assert_eq!(of_b.len(), 2);
    let mut v = view(&["a", "b", "c"]);
    v.set_status(&node("b"), MemberStatus::Down).unwrap();
    c.handle_membership(10, &v);
    let cmds = drain(&mut c);
    assert!(cmds.contains(&CoordinatorCommand::Emit(DomainEvent::NodeFailed { node: node("b") })));
    for s in of_b {
        let home = c.shard_map().home(s).unwrap();
        assert_ne!(home.owner, node("b"));
        assert!(home.epoch.seq >= 2, "reallocation bumps the epoch");
    }
    assert!(c.hand_offs_in_progress().next().is_none(), "no hand-off from a fenced node");
}

#[test]
fn leadership_lost_stops_everything() {
    let mut c = coordinator(2, &["a", "b"]);
    drain(&mut c);
    c.handle_leadership_lost(3);
    assert_eq!(drain(&mut c), vec![CoordinatorCommand::Emit(DomainEvent::LeadershipLost { node: node("a"), term: 1 })]);
    c.handle_register(4, &node("c"), 1, &[], true);
    c.handle_timeout(1_000_000);
    assert!(drain(&mut c).is_empty());
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn a_rebalance_request_on_a_balanced_map_moves_nothing() {
    let mut c = coordinator(4, &["a", "b"]);
    drain(&mut c);
    let before = c.shard_map().clone();
    c.handle_rebalance_request(5);
    assert!(drain(&mut c).is_empty(), "nothing to move, nothing announced");
    assert_eq!(c.shard_map(), &before);
    c.handle_leadership_lost(6);
    drain(&mut c);
    c.handle_rebalance_request(7);
    assert!(drain(&mut c).is_empty(), "a stopped coordinator ignores requests");
}

#[test]
fn assignments_are_checked_against_the_map_and_the_hosts() {
    use shardline_core::PlanProblem;
    let mut c = coordinator(4, &["a", "b"]);
    drain(&mut c);
    assert_eq!(c.check_assignments(&[(ShardId(0), "a".into()), (ShardId(3), "b".into())]), Ok(()));
    assert_eq!(
        c.check_assignments(&[(ShardId(0), "a".into()), (ShardId(4), "a".into())]),
        Err((ShardId(4), PlanProblem::OutOfRange))
    );
    assert_eq!(
        c.check_assignments(&[(ShardId(1), "ghost".into())]),
        Err((ShardId(1), PlanProblem::NotAHost { node: "ghost".into() }))
    );
    // A member that is leaving may not be given shards.
    let mut v = view(&["a", "b"]);
    v.set_status(&node("b"), MemberStatus::Leaving).unwrap();
    c.handle_membership(5, &v);
    drain(&mut c);
    assert_eq!(
        c.check_assignments(&[(ShardId(1), "b".into())]),
        Err((ShardId(1), PlanProblem::NotAHost { node: "b".into() }))
    );
}
