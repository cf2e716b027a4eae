//! The hand-off protocol, command by command.

mod common;

use common::*;
use shardline_core::Engine;
use shardline_core::{CoordinatorCommand, DomainEvent, Epoch, ShardHome, ShardId};

/// Two shards on "a" alone, then "b" joins: one shard must move a → b by hand-off.
fn scale_out() -> (shardline_core::CoordinatorEngine, ShardId) {
    let mut c = coordinator(2, &["a"]);
    drain(&mut c);
    c.handle_membership(10, &view(&["a", "b"]));
    c.handle_register(10, &node("b"), 1, &[], true);
    let shard = c.hand_offs_in_progress().next().expect("a hand-off started");
    (c, shard)
}

#[test]
fn begin_hand_off_then_hand_off_then_announce() {
    let (mut c, s) = scale_out();
    let cmds = drain(&mut c);
    // Every registered region is asked, the owner and the new owner included.
    assert!(cmds.contains(&CoordinatorCommand::SendBeginHandOff { to: vec![node("a"), node("b")], shard: s }));
    assert!(cmds
        .iter()
        .any(|c| matches!(c, CoordinatorCommand::Emit(DomainEvent::RebalancingTriggered { planned: 1, .. }))));
    c.handle_begin_hand_off_ack(11, &node("a"), 1, s);
    let cmds = drain(&mut c);
    assert!(!cmds.iter().any(|c| matches!(c, CoordinatorCommand::SendHandOff { .. })), "b has not acknowledged");
    c.handle_begin_hand_off_ack(12, &node("b"), 1, s);
    let epoch = c.shard_map().slot(s).unwrap().epoch;
    assert_eq!(drain(&mut c), vec![CoordinatorCommand::SendHandOff { to: node("a"), shard: s, epoch }]);
    // Until ShardStopped, the map does not change.
    assert_eq!(c.shard_map().owner(s), Some(&node("a")));
    c.handle_shard_stopped(13, &node("a"), s, epoch, Some(b"state".to_vec()));
    let home = ShardHome { owner: node("b"), epoch: Epoch { term: 1, seq: epoch.seq + 1 } };
    let cmds = drain(&mut c);
    let handover =
        CoordinatorCommand::SendHandedState { to: node("b"), shard: s, epoch: home.epoch, data: b"state".to_vec() };
    let announce =
        CoordinatorCommand::AnnounceShardHomes { to: vec![node("a"), node("b")], homes: vec![(s, home.clone())] };
    let pos = |c: &CoordinatorCommand| cmds.iter().position(|x| x == c);
    assert!(
        pos(&handover).unwrap() < pos(&announce).unwrap(),
        "the state reaches the new owner before its home is announced"
    );
    assert!(cmds.contains(&CoordinatorCommand::Emit(DomainEvent::ShardMigrated {
        shard: s,
        from: node("a"),
        to: home
    })));
    assert!(cmds.contains(&CoordinatorCommand::Emit(DomainEvent::RebalancingCompleted { term: 1, moved: 1 })));
}

#[test]
fn acks_of_another_term_are_ignored() {
    let (mut c, s) = scale_out();
    drain(&mut c);
    c.handle_begin_hand_off_ack(11, &node("a"), 0, s);
    c.handle_begin_hand_off_ack(11, &node("b"), 2, s);
    assert!(drain(&mut c).is_empty());
}

#[test]
fn unacknowledged_begin_is_resent_then_abandoned_safely() {
    let (mut c, s) = scale_out();
    drain(&mut c);
    c.handle_begin_hand_off_ack(11, &node("a"), 1, s);
    drain(&mut c);
    c.handle_timeout(110);
    assert_eq!(drain(&mut c), vec![CoordinatorCommand::SendBeginHandOff { to: vec![node("b")], shard: s }]);
    c.handle_timeout(1_010);
    let cmds = drain(&mut c);
    let home = c.shard_map().home(s).unwrap();
    assert_eq!(home.owner, node("a"), "abandoned: the shard stays where it was");
    assert!(cmds.contains(&CoordinatorCommand::Emit(DomainEvent::HandOffTimedOut {
        shard: s,
        owner: node("a"),
        abandoned: true
    })));
    assert!(cmds.iter().any(
        |c| matches!(c, CoordinatorCommand::AnnounceShardHomes { homes, .. } if homes == &vec![(s, home.clone())])
    ));
}

#[test]
fn silent_owner_keeps_the_shard_until_fenced() {
    let (mut c, s) = scale_out();
    drain(&mut c);
    c.handle_begin_hand_off_ack(11, &node("a"), 1, s);
    c.handle_begin_hand_off_ack(11, &node("b"), 1, s);
    let epoch = c.shard_map().slot(s).unwrap().epoch;
    drain(&mut c);
    // Past the hand-off timeout: HandOff is re-sent, the owner reported slow, nothing moves.
    c.handle_timeout(2_000);
    let cmds = drain(&mut c);
    assert!(cmds.contains(&CoordinatorCommand::SendHandOff { to: node("a"), shard: s, epoch }));
    assert!(cmds.contains(&CoordinatorCommand::Emit(DomainEvent::HandOffTimedOut {
        shard: s,
        owner: node("a"),
        abandoned: false
    })));
    assert_eq!(c.shard_map().owner(s), Some(&node("a")));
    c.handle_timeout(60_000);
    assert_eq!(c.shard_map().owner(s), Some(&node("a")), "never moves a live owner's shard without ShardStopped");
    // Once a is fenced, the move completes.
    c.handle_node_fenced(60_001, &node("a"));
    assert_eq!(c.shard_map().owner(s), Some(&node("b")));
    assert!(c.shard_map().slot(s).unwrap().epoch > epoch);
}

#[test]
fn shard_stopped_from_wrong_node_or_epoch_is_ignored() {
    let (mut c, s) = scale_out();
    c.handle_begin_hand_off_ack(11, &node("a"), 1, s);
    c.handle_begin_hand_off_ack(11, &node("b"), 1, s);
    let epoch = c.shard_map().slot(s).unwrap().epoch;
    drain(&mut c);
    c.handle_shard_stopped(12, &node("b"), s, epoch, None);
    c.handle_shard_stopped(12, &node("a"), s, Epoch { term: 0, seq: 9 }, None);
    assert!(drain(&mut c).is_empty());
    assert_eq!(c.shard_map().owner(s), Some(&node("a")));
}

/// A proxy registered its region, left, and was forgotten once its tombstone expired: it is
/// gone from the view, not down. Its region can never acknowledge, so it must not be asked, or
/// every later hand-off waits for it until it times out (a real partition test found every move
/// to rejoined nodes abandoned that way).
#[test]
fn a_region_whose_member_is_forgotten_holds_no_hand_off() {
    let mut c = coordinator(2, &["a"]);
    c.handle_membership(5, &view(&["a", "p"]));
    c.handle_register(5, &node("p"), 1, &[], false);
    drain(&mut c);
    // "p" is gone from the view altogether; "b" joins.
    c.handle_membership(10, &view(&["a", "b"]));
    c.handle_register(10, &node("b"), 1, &[], true);
    let s = c.hand_offs_in_progress().next().expect("a hand-off started");
    let asked: Vec<_> = drain(&mut c)
        .into_iter()
        .filter_map(|cmd| match cmd {
            CoordinatorCommand::SendBeginHandOff { to, shard } if shard == s => Some(to),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(!asked.is_empty() && !asked.contains(&node("p")), "asked {asked:?}");
    for (i, r) in asked.iter().enumerate() {
        c.handle_begin_hand_off_ack(11 + i as u64, r, 1, s);
    }
    let epoch = c.shard_map().slot(s).unwrap().epoch;
    assert_eq!(drain(&mut c), vec![CoordinatorCommand::SendHandOff { to: node("a"), shard: s, epoch }]);
}

/// A recovering coordinator confirms a leaving member's shard (a home queued for the regions
/// welcomed before), and its first plan hands that shard off at once. The home must not go out
/// after `BeginHandOff`: a region takes any home as the end of the pause, and would route to the
/// owner that is stopping again, after it acknowledged.
#[test]
fn a_home_confirmed_in_recovery_is_not_announced_once_its_hand_off_began() {
    let mut stored = shardline_core::ShardMap::new(1).unwrap();
    let e = stored.assign(ShardId(0), node("b"), 1).unwrap();
    let mut v = view(&["a", "b"]);
    v.set_status(&node("b"), shardline_core::MemberStatus::Leaving).unwrap();
    let strategy = Box::new(shardline_core::LeastShards::unlimited());
    let mut c = shardline_core::CoordinatorEngine::new(config(1), node("a"), 2, strategy, v, Some(stored), 0).unwrap();
    drain(&mut c);
    c.handle_register(1, &node("a"), 2, &[], true);
    drain(&mut c);
    // b confirms its shard: recovery ends, and b leaves, so the shard is handed off to a.
    c.handle_register(2, &node("b"), 2, &[(ShardId(0), e)], true);
    assert!(!c.is_recovering());
    let cmds = drain(&mut c);
    let begin = cmds
        .iter()
        .position(|c| matches!(c, CoordinatorCommand::SendBeginHandOff { shard: ShardId(0), .. }))
        .expect("the leaving member's shard is handed off");
    let announced = |c: &CoordinatorCommand| matches!(c, CoordinatorCommand::AnnounceShardHomes { homes, .. } if homes.iter().any(|(s, _)| *s == ShardId(0)));
    assert!(!cmds[begin..].iter().any(announced), "its home announced while it is handed off: {cmds:?}");
    // The hand-off ends with the new home, announced.
    c.handle_begin_hand_off_ack(3, &node("a"), 2, ShardId(0));
    c.handle_begin_hand_off_ack(3, &node("b"), 2, ShardId(0));
    c.handle_shard_stopped(4, &node("b"), ShardId(0), e, None);
    let cmds = drain(&mut c);
    assert!(cmds.iter().any(|c| matches!(c, CoordinatorCommand::AnnounceShardHomes { homes, .. }
        if homes.iter().any(|(s, h)| *s == ShardId(0) && h.owner == node("a") && h.epoch > e))));
}
