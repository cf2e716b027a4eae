//! The region's side of a hand-off: pause, drain, acknowledge, stop, resume at the new home —
//! and the stream rule that keeps per-sender order through bounces.

mod common;

use common::*;
use shardline_core::Engine;
use shardline_core::{BounceReason, Epoch, RegionCommand, RegionMessage, ShardHome, ShardId, ToCoordinator, ToRegion};

const S: ShardId = ShardId(0);

fn e(seq: u64) -> Epoch {
    Epoch { term: 1, seq }
}

fn home(r: &mut shardline_core::RegionEngine<u32>, owner: &str, epoch: u64) {
    r.handle_coordinator_message(
        0,
        &node("c"),
        ToRegion::ShardHomes { term: 1, homes: vec![(S, ShardHome { owner: node(owner), epoch: e(epoch) })] },
    );
}

fn forwards(cmds: &[RegionCommand<u32>]) -> Vec<(String, u32)> {
    cmds.iter()
        .filter_map(|c| match c {
            RegionCommand::SendToRegion { to, msg: RegionMessage::Forward { msg, .. } } => {
                Some((to.name.to_string(), *msg))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn pauses_drains_then_acknowledges() {
    let mut r = region("x", 1);
    r.handle_coordinator_changed(0, node("c"), 1);
    home(&mut r, "a", 1);
    r.handle_send(1, S, 1);
    rdrain(&mut r);
    r.handle_coordinator_message(2, &node("c"), ToRegion::BeginHandOff { term: 1, shard: S });
    // Something went to a: drain it before acknowledging.
    let cmds = rdrain(&mut r);
    assert_eq!(
        cmds,
        vec![RegionCommand::SendToRegion { to: node("a"), msg: RegionMessage::Flush { shard: S, token: 0 } }]
    );
    r.handle_send(3, S, 2);
    assert!(rdrain(&mut r).is_empty(), "paused: buffered");
    r.handle_region_message(4, &node("a"), RegionMessage::FlushAck { shard: S, token: 0 });
    assert_eq!(
        rdrain(&mut r),
        vec![RegionCommand::SendToCoordinator {
            to: node("c"),
            msg: ToCoordinator::BeginHandOffAck { term: 1, shard: S }
        }]
    );
    home(&mut r, "b", 2);
    assert_eq!(forwards(&rdrain(&mut r)), vec![("b".into(), 2)]);
}

#[test]
fn nothing_sent_means_immediate_ack() {
    let mut r = region("x", 1);
    r.handle_coordinator_changed(0, node("c"), 1);
    rdrain(&mut r);
    home(&mut r, "a", 1);
    r.handle_coordinator_message(2, &node("c"), ToRegion::BeginHandOff { term: 1, shard: S });
    assert_eq!(
        rdrain(&mut r),
        vec![RegionCommand::SendToCoordinator {
            to: node("c"),
            msg: ToCoordinator::BeginHandOffAck { term: 1, shard: S }
        }]
    );
}

#[test]
fn owner_stops_then_reports_and_never_rehosts_that_epoch() {
    let mut r = region("a", 1);
    r.handle_coordinator_changed(0, node("c"), 1);
    home(&mut r, "a", 1);
    rdrain(&mut r);
    r.handle_coordinator_message(1, &node("c"), ToRegion::BeginHandOff { term: 1, shard: S });
    rdrain(&mut r);
    // A forward in flight before other regions acknowledged is still served.
    r.handle_region_message(
        2,
        &node("y"),
        RegionMessage::Forward { shard: S, epoch: e(1), seq: 0, stream: 1, position: 1, msg: 9 },
    );
    assert_eq!(rdrain(&mut r), vec![RegionCommand::Deliver { shard: S, epoch: e(1), msg: 9 }]);
    r.handle_coordinator_message(3, &node("c"), ToRegion::HandOff { term: 1, shard: S, epoch: e(1) });
    assert_eq!(rdrain(&mut r), vec![RegionCommand::StopShard { shard: S, epoch: e(1), fenced: false }]);
    // While stopping, new forwards bounce.
    r.handle_region_message(
        4,
        &node("y"),
        RegionMessage::Forward { shard: S, epoch: e(1), seq: 1, stream: 1, position: 2, msg: 10 },
    );
    assert!(matches!(
        &rdrain(&mut r)[..],
        [RegionCommand::SendToRegion {
            msg: RegionMessage::Bounce { reason: BounceReason::RebalanceInProgress, msg: 10, .. },
            ..
        }]
    ));
    r.handle_shard_stopped(5, S, Some(vec![7]));
    assert_eq!(
        rdrain(&mut r),
        vec![RegionCommand::SendToCoordinator {
            to: node("c"),
            msg: ToCoordinator::ShardStopped { term: 1, shard: S, epoch: e(1), handover: Some(vec![7]) }
        }]
    );
    // A repeated HandOff is answered again (with the state); an old announcement of epoch 1
    // does not restart it.
    r.handle_coordinator_message(6, &node("c"), ToRegion::HandOff { term: 1, shard: S, epoch: e(1) });
    home(&mut r, "a", 1);
    let cmds = rdrain(&mut r);
    assert!(!cmds.iter().any(|c| matches!(c, RegionCommand::StartShard { .. })));
    assert!(r.hosted().is_empty());
}

#[test]
fn a_bounce_breaks_the_stream_so_later_messages_cannot_overtake() {
    // Receiver side: message 1 bounces (shard not active yet), message 2 arrives after the shard
    // became active: it must bounce too, or it would be processed before 1.
    let mut b = region("b", 1);
    let fwd = |pos, msg| RegionMessage::Forward { shard: S, epoch: e(2), seq: pos, stream: 1, position: pos, msg };
    b.handle_region_message(0, &node("x"), fwd(1, 1));
    rdrain(&mut b);
    home(&mut b, "b", 2);
    rdrain(&mut b);
    b.handle_region_message(1, &node("x"), fwd(2, 2));
    assert!(matches!(
        &rdrain(&mut b)[..],
        [RegionCommand::SendToRegion { msg: RegionMessage::Bounce { msg: 2, .. }, .. }]
    ));
    // The sender starts a new stream after draining: accepted from position 1.
    b.handle_region_message(
        2,
        &node("x"),
        RegionMessage::Forward { shard: S, epoch: e(2), seq: 0, stream: 2, position: 1, msg: 1 },
    );
    b.handle_region_message(
        2,
        &node("x"),
        RegionMessage::Forward { shard: S, epoch: e(2), seq: 1, stream: 2, position: 2, msg: 2 },
    );
    assert_eq!(
        rdrain(&mut b),
        vec![
            RegionCommand::Deliver { shard: S, epoch: e(2), msg: 1 },
            RegionCommand::Deliver { shard: S, epoch: e(2), msg: 2 }
        ]
    );
}

#[test]
fn bounced_messages_return_to_their_place_and_resend_in_order() {
    let mut x = region("x", 1);
    x.handle_coordinator_changed(0, node("c"), 1);
    home(&mut x, "b", 2);
    rdrain(&mut x);
    x.handle_send(1, S, 1);
    x.handle_send(1, S, 2);
    rdrain(&mut x);
    x.handle_region_message(
        2,
        &node("b"),
        RegionMessage::Bounce { shard: S, seq: 0, reason: BounceReason::NotOwner, msg: 1 },
    );
    x.handle_send(3, S, 3);
    x.handle_region_message(
        4,
        &node("b"),
        RegionMessage::Bounce { shard: S, seq: 1, reason: BounceReason::NotOwner, msg: 2 },
    );
    let cmds = rdrain(&mut x);
    assert!(
        cmds.contains(&RegionCommand::SendToRegion { to: node("b"), msg: RegionMessage::Flush { shard: S, token: 0 } })
    );
    assert!(forwards(&cmds).is_empty(), "nothing is resent before the drain completes");
    x.handle_region_message(5, &node("b"), RegionMessage::FlushAck { shard: S, token: 0 });
    rdrain(&mut x);
    // The coordinator confirms the same home: 1, 2, 3 go out in order on a new stream.
    let t = x.poll_timeout().unwrap();
    x.handle_timeout(t);
    rdrain(&mut x);
    home(&mut x, "b", 2);
    let cmds = rdrain(&mut x);
    assert_eq!(forwards(&cmds), vec![("b".into(), 1), ("b".into(), 2), ("b".into(), 3)]);
    assert!(matches!(
        &cmds[0],
        RegionCommand::SendToRegion { msg: RegionMessage::Forward { stream: 2, position: 1, .. }, .. }
    ));
}

#[test]
fn undeliverable_is_taken_back_like_a_bounce() {
    let mut x = region("x", 1);
    x.handle_coordinator_changed(0, node("c"), 1);
    home(&mut x, "b", 2);
    rdrain(&mut x);
    x.handle_send(1, S, 1);
    let Some(RegionCommand::SendToRegion { msg, .. }) = rdrain(&mut x).pop() else { panic!("forward expected") };
    x.handle_undeliverable(2, &node("b"), msg);
    assert_eq!(x.buffered(), 1);
    assert!(x.home(S).is_none(), "the home is asked again");
}

#[test]
fn fenced_region_stops_everything_and_refuses() {
    let mut r = region("a", 2);
    r.handle_coordinator_changed(0, node("c"), 1);
    home(&mut r, "a", 1);
    r.handle_send(0, ShardId(1), 4);
    rdrain(&mut r);
    r.handle_fenced(1);
    let cmds = rdrain(&mut r);
    assert!(cmds.contains(&RegionCommand::StopShard { shard: S, epoch: e(1), fenced: true }));
    assert!(cmds.iter().any(|c| matches!(c, RegionCommand::Reject { msg: 4, .. })));
    r.handle_send(2, S, 5);
    assert!(matches!(&rdrain(&mut r)[..], [RegionCommand::Reject { msg: 5, .. }]));
    assert!(r.hosted().is_empty());
}

#[test]
fn the_lock_free_route_is_offered_only_while_a_send_would_be_delivered_here() {
    let mut r = region("a", 1);
    assert_eq!(r.local_epoch(S), None, "no home yet");
    r.handle_coordinator_changed(0, node("c"), 1);
    home(&mut r, "a", 1);
    rdrain(&mut r);
    assert_eq!(r.local_epoch(S), Some(e(1)));
    // What the route promises: a send changes nothing and is delivered at that epoch.
    r.handle_send(1, S, 3);
    assert_eq!(rdrain(&mut r), vec![RegionCommand::Deliver { shard: S, epoch: e(1), msg: 3 }]);
    assert_eq!(r.local_epoch(S), Some(e(1)));
    // Paused for a hand-off: sends are buffered, so the route is withdrawn.
    r.handle_coordinator_message(2, &node("c"), ToRegion::BeginHandOff { term: 1, shard: S });
    rdrain(&mut r);
    assert_eq!(r.local_epoch(S), None);
    r.handle_coordinator_message(3, &node("c"), ToRegion::HandOff { term: 1, shard: S, epoch: e(1) });
    rdrain(&mut r);
    assert_eq!(r.local_epoch(S), None, "stopping");
    r.handle_shard_stopped(4, S, None);
    rdrain(&mut r);
    home(&mut r, "b", 2);
    rdrain(&mut r);
    assert_eq!(r.local_epoch(S), None, "hosted elsewhere");
    // Back here at a newer epoch, then fenced: never offered while fenced.
    home(&mut r, "a", 3);
    rdrain(&mut r);
    assert_eq!(r.local_epoch(S), Some(e(3)));
    r.handle_fenced(5);
    rdrain(&mut r);
    assert_eq!(r.local_epoch(S), None);
}
