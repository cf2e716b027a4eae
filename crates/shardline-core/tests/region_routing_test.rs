//! Routing, buffering limits, questions to the coordinator, stale terms and epochs.

mod common;

use common::*;
use shardline_core::Engine;
use shardline_core::{
    Epoch, RegionCommand, RegionMessage, RejectReason, Route, ShardHome, ShardId, ToCoordinator, ToRegion,
};

fn e(seq: u64) -> Epoch {
    Epoch { term: 1, seq }
}

fn homes(list: &[(u32, &str, u64)]) -> ToRegion {
    ToRegion::ShardHomes {
        term: 1,
        homes: list.iter().map(|&(s, n, ep)| (ShardId(s), ShardHome { owner: node(n), epoch: e(ep) })).collect(),
    }
}

#[test]
fn registers_asks_then_routes() {
    let mut r = region("a", 4);
    r.handle_send(0, ShardId(2), 7);
    assert!(rdrain(&mut r).is_empty(), "no coordinator yet: buffered");
    assert_eq!(r.buffered(), 1);
    r.handle_coordinator_changed(1, node("c"), 1);
    let cmds = rdrain(&mut r);
    assert_eq!(
        cmds,
        vec![RegionCommand::SendToCoordinator {
            to: node("c"),
            msg: ToCoordinator::Register { term: 1, hosted: vec![], hosting: true }
        }]
    );
    r.handle_coordinator_message(2, &node("c"), ToRegion::Welcome { term: 1, homes: vec![] });
    assert_eq!(
        rdrain(&mut r),
        vec![RegionCommand::SendToCoordinator {
            to: node("c"),
            msg: ToCoordinator::GetShardHome { shard: ShardId(2) }
        }]
    );
    r.handle_coordinator_message(3, &node("c"), homes(&[(2, "b", 1)]));
    assert_eq!(
        rdrain(&mut r),
        vec![RegionCommand::SendToRegion {
            to: node("b"),
            msg: RegionMessage::Forward { shard: ShardId(2), epoch: e(1), seq: 0, stream: 1, position: 1, msg: 7 }
        }]
    );
    assert_eq!(r.route(ShardId(2)), Route::Remote(node("b"), e(1)));
    r.handle_send(4, ShardId(2), 8);
    assert!(matches!(
        &rdrain(&mut r)[..],
        [RegionCommand::SendToRegion { msg: RegionMessage::Forward { position: 2, msg: 8, .. }, .. }]
    ));
}

#[test]
fn own_shard_starts_and_delivers_locally() {
    let mut r = region("a", 4);
    r.handle_coordinator_message(0, &node("c"), homes(&[(1, "a", 3)]));
    let cmds = rdrain(&mut r);
    assert!(cmds.contains(&RegionCommand::StartShard { shard: ShardId(1), epoch: e(3), handover: None }));
    r.handle_send(1, ShardId(1), 5);
    assert_eq!(rdrain(&mut r), vec![RegionCommand::Deliver { shard: ShardId(1), epoch: e(3), msg: 5 }]);
    assert_eq!(r.hosted(), vec![(ShardId(1), e(3))]);
}

/// A newer allocation of a shard to the node that hosts it raises the hosted epoch, and says so:
/// the driver's entities must carry the new epoch as their fencing token.
#[test]
fn a_newer_epoch_for_a_hosted_shard_is_announced_to_the_driver() {
    let mut r = region("a", 4);
    r.handle_coordinator_message(0, &node("c"), homes(&[(1, "a", 3)]));
    rdrain(&mut r);
    r.handle_coordinator_message(1, &node("c"), homes(&[(1, "a", 5)]));
    assert_eq!(rdrain(&mut r), vec![RegionCommand::RaiseEpoch { shard: ShardId(1), from: e(3), to: e(5) }]);
    assert_eq!(r.hosted(), vec![(ShardId(1), e(5))]);
    r.handle_send(2, ShardId(1), 9);
    assert_eq!(rdrain(&mut r), vec![RegionCommand::Deliver { shard: ShardId(1), epoch: e(5), msg: 9 }]);
    // The same epoch again, or an older one, changes nothing.
    r.handle_coordinator_message(3, &node("c"), homes(&[(1, "a", 5)]));
    r.handle_coordinator_message(3, &node("c"), homes(&[(1, "a", 4)]));
    assert!(rdrain(&mut r).is_empty());
}

#[test]
fn buffers_are_bounded() {
    let mut r = region("a", 4);
    for i in 0..4 {
        r.handle_send(0, ShardId(i % 2), i);
    }
    assert!(rdrain(&mut r).is_empty());
    r.handle_send(0, ShardId(3), 99);
    assert_eq!(
        rdrain(&mut r),
        vec![RegionCommand::Reject { shard: ShardId(3), msg: 99, reason: RejectReason::Overloaded }]
    );
    assert_eq!(r.buffered(), 4);
}

#[test]
fn out_of_range_shard_is_refused_not_a_panic() {
    let mut r = region("a", 4);
    r.handle_send(0, ShardId(40), 1);
    assert_eq!(
        rdrain(&mut r),
        vec![RegionCommand::Reject { shard: ShardId(40), msg: 1, reason: RejectReason::Unavailable }]
    );
    r.handle_region_message(
        0,
        &node("b"),
        RegionMessage::Forward { shard: ShardId(40), epoch: e(1), seq: 0, stream: 1, position: 1, msg: 2 },
    );
    assert!(matches!(&rdrain(&mut r)[..], [RegionCommand::SendToRegion { msg: RegionMessage::Bounce { .. }, .. }]));
}

#[test]
fn older_term_and_older_epoch_are_ignored() {
    let mut r = region("a", 2);
    r.handle_coordinator_changed(0, node("c2"), 5);
    rdrain(&mut r);
    r.handle_coordinator_message(1, &node("c1"), homes(&[(0, "a", 1)]));
    assert!(rdrain(&mut r).is_empty(), "term 1 < 5");
    r.handle_coordinator_message(
        2,
        &node("c2"),
        ToRegion::ShardHomes {
            term: 5,
            homes: vec![(ShardId(0), ShardHome { owner: node("b"), epoch: Epoch { term: 5, seq: 2 } })],
        },
    );
    r.handle_coordinator_message(
        3,
        &node("c2"),
        ToRegion::ShardHomes {
            term: 5,
            homes: vec![(ShardId(0), ShardHome { owner: node("a"), epoch: Epoch { term: 5, seq: 1 } })],
        },
    );
    assert!(rdrain(&mut r).is_empty(), "an older epoch never wins");
    assert_eq!(r.home(ShardId(0)).unwrap().owner, node("b"));
}

#[test]
fn questions_back_off() {
    let mut r = region("a", 2);
    r.handle_coordinator_changed(0, node("c"), 1);
    r.handle_coordinator_message(0, &node("c"), ToRegion::Welcome { term: 1, homes: vec![] });
    rdrain(&mut r);
    r.handle_send(0, ShardId(0), 1);
    let mut asks = vec![0];
    for _ in 0..6 {
        let t = r.poll_timeout().unwrap();
        r.handle_timeout(t);
        if rdrain(&mut r)
            .iter()
            .any(|c| matches!(c, RegionCommand::SendToCoordinator { msg: ToCoordinator::GetShardHome { .. }, .. }))
        {
            asks.push(t);
        }
    }
    let gaps: Vec<u64> = asks.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps[..4], [10, 20, 40, 80], "doubling from 10 ms");
    assert!(gaps.iter().all(|&g| g <= 80), "capped at retry_max_ms");
}

/// A coordinator that forgot this region (it registered before its node was in the
/// coordinator's view, which drops regions of members it does not know) asks it to register
/// again: a registered region answers, or it would never hear of a move again.
#[test]
fn a_registered_region_registers_again_when_asked() {
    let mut r = region("a", 4);
    r.handle_coordinator_changed(0, node("c"), 1);
    rdrain(&mut r);
    r.handle_coordinator_message(1, &node("c"), ToRegion::Welcome { term: 1, homes: vec![] });
    rdrain(&mut r);
    r.handle_coordinator_message(2, &node("c"), ToRegion::CoordinatorStarted { term: 1 });
    assert_eq!(
        rdrain(&mut r),
        vec![RegionCommand::SendToCoordinator {
            to: node("c"),
            msg: ToCoordinator::Register { term: 1, hosted: vec![], hosting: true }
        }]
    );
    // Asked again while that registration is unanswered: nothing more (the retry timer repeats it).
    r.handle_coordinator_message(3, &node("c"), ToRegion::CoordinatorStarted { term: 1 });
    assert!(rdrain(&mut r).is_empty());
}

/// A fenced region does nothing on a timeout, so it asks for none, whatever is sent to it after
/// the fence: a deadline that stays due would have its driver call it forever (a real test's
/// process spun at shutdown on one).
#[test]
fn a_fenced_region_asks_for_no_timeout() {
    let mut r = region("a", 4);
    r.handle_coordinator_changed(0, node("c"), 1);
    r.handle_coordinator_message(1, &node("c"), ToRegion::Welcome { term: 1, homes: vec![] });
    r.handle_coordinator_message(1, &node("c"), homes(&[(1, "b", 1)]));
    r.handle_fenced(2);
    r.handle_send(3, ShardId(1), 7);
    r.handle_link_down(4, &node("c"));
    // Frames that were on their way when the node was fenced come back.
    let forward = RegionMessage::Forward { shard: ShardId(1), epoch: e(1), seq: 0, stream: 1, position: 1, msg: 8 };
    r.handle_undeliverable(5, &node("b"), forward.clone());
    r.handle_send_queue_full(6, &node("b"), forward);
    let rejected = rdrain(&mut r)
        .into_iter()
        .filter(|c| matches!(c, RegionCommand::Reject { reason: RejectReason::Unavailable, .. }))
        .count();
    assert_eq!(rejected, 3, "the send and both frames that came back fail as not processed");
    assert_eq!(r.buffered(), 0);
    assert_eq!(r.poll_timeout(), None);
}

/// A registration that falls due is taken, sent again or not: the region never asks for a
/// timeout that has passed.
#[test]
fn a_due_registration_does_not_stay_due() {
    let mut r = region("a", 4);
    r.handle_coordinator_changed(0, node("c"), 1);
    let due = r.poll_timeout().expect("a registration to repeat");
    r.handle_timeout(due);
    assert!(r.poll_timeout().is_none_or(|t| t > due), "{:?}", r.poll_timeout());
    r.handle_coordinator_message(due + 1, &node("c"), ToRegion::Welcome { term: 1, homes: vec![] });
    assert!(r.poll_timeout().is_none_or(|t| t > due + 1), "{:?}", r.poll_timeout());
}
