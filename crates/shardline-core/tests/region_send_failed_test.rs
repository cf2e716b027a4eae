//! What the region decides when a send to another region fails, and when its node stops or
//! leaves: `handle_send_failed`, `handle_stop_all`, `flush_all`, `handle_left`.

mod common;

use common::*;
use shardline_core::Engine;
use shardline_core::{
    Epoch, RegionCommand, RegionEngine, RegionMessage, RejectReason, SendFailure, ShardHome, ShardId, ToRegion,
};

fn e(seq: u64) -> Epoch {
    Epoch { term: 1, seq }
}

/// A region on "x" whose coordinator placed each `(shard, owner)`.
fn routed(shards: u32, homes: &[(u32, &str)]) -> RegionEngine<u32> {
    let mut r = region("x", shards);
    r.handle_coordinator_changed(0, node("c"), 1);
    let homes = homes.iter().map(|(s, o)| (ShardId(*s), ShardHome { owner: node(o), epoch: e(1) })).collect();
    r.handle_coordinator_message(0, &node("c"), ToRegion::ShardHomes { term: 1, homes });
    rdrain(&mut r);
    r
}

/// What a command sends to a region, as `to: message`.
fn sent(c: &RegionCommand<u32>) -> String {
    match c {
        RegionCommand::SendToRegion { to, msg } => format!("{}: {}", to.name, show(msg)),
        RegionCommand::SendToRegionWhenReady { to, msg } => format!("{} when ready: {}", to.name, show(msg)),
        other => format!("{other:?}"),
    }
}

fn show(m: &RegionMessage<u32>) -> String {
    match m {
        RegionMessage::Forward { shard, msg, .. } => format!("forward {msg} of {}", shard.0),
        RegionMessage::Flush { shard, token } => format!("flush {} #{token}", shard.0),
        RegionMessage::FlushAck { shard, token } => format!("flush ack {} #{token}", shard.0),
        RegionMessage::Bounce { shard, msg, .. } => format!("bounce {msg} of {}", shard.0),
    }
}

/// Plays the driver: carries the commands out in order, and reports the first send to `jam`
/// as failing with `why`, at once.
fn carry_out(r: &mut RegionEngine<u32>, jam: &str, why: SendFailure) -> Vec<String> {
    let mut done = Vec::new();
    let mut failed = false;
    while let Some(c) = r.poll_command() {
        match c {
            RegionCommand::SendToRegion { to, msg } if to.name.as_ref() == jam && !failed => {
                failed = true;
                done.push(format!("failed: {}", show(&msg)));
                r.handle_send_failed(1, &to, msg, why);
            }
            c => done.push(sent(&c)),
        }
    }
    done
}

#[test]
fn a_forward_that_meets_a_full_queue_comes_back_with_every_forward_queued_behind_it() {
    let mut r = routed(2, &[(0, "a"), (1, "b")]);
    r.handle_send(1, ShardId(0), 1);
    r.handle_send(1, ShardId(1), 2);
    r.handle_send(1, ShardId(0), 3);
    r.handle_send(1, ShardId(0), 4);
    let done = carry_out(&mut r, "a", SendFailure::QueueFull);
    // 3 and 4 were queued behind 1: sent, they would overtake it. They wait with it while `a`
    // drains; the forward to `b` goes.
    assert_eq!(done, ["failed: forward 1 of 0", "b: forward 2 of 1", "a: flush 0 #0"]);
    assert_eq!(r.buffered(), 3);
    // `a` caught up: everything goes again, in order, on a new stream.
    r.handle_region_message(2, &node("a"), RegionMessage::FlushAck { shard: ShardId(0), token: 0 });
    let again: Vec<String> = rdrain(&mut r).iter().map(sent).collect();
    assert_eq!(again, ["a: forward 1 of 0", "a: forward 3 of 0", "a: forward 4 of 0"]);
    assert_eq!(r.buffered(), 0);
}

#[test]
fn a_drain_marker_that_meets_a_full_queue_waits_for_room() {
    let mut r = routed(1, &[(0, "a")]);
    r.handle_send(1, ShardId(0), 1);
    rdrain(&mut r);
    r.flush_all(2);
    let done = carry_out(&mut r, "a", SendFailure::QueueFull);
    assert_eq!(done, ["failed: flush 0 #0", "a when ready: flush 0 #0"]);
    assert!(!r.is_settled(), "the marker is still out");
}

#[test]
fn a_forward_without_a_connection_is_taken_back_and_its_home_asked_again() {
    let mut r = routed(1, &[(0, "a")]);
    r.handle_send(1, ShardId(0), 1);
    let done = carry_out(&mut r, "a", SendFailure::NoConnection);
    // Whatever went to `a` before is drained before the message goes anywhere else.
    assert_eq!(done, ["failed: forward 1 of 0", "a: flush 0 #0"]);
    assert_eq!(r.buffered(), 1, "taken back, not lost");
    // The home it had is forgotten, and asked for again once the drain is over: the marker
    // finds no connection either, which counts as its answer.
    r.handle_send_failed(
        2,
        &node("a"),
        RegionMessage::Flush { shard: ShardId(0), token: 0 },
        SendFailure::NoConnection,
    );
    rdrain(&mut r);
    let at = r.poll_timeout().expect("a question is due");
    r.handle_timeout(at);
    let asked = rdrain(&mut r);
    assert!(
        asked.iter().any(|c| matches!(c, RegionCommand::SendToCoordinator { .. })),
        "asks the coordinator again: {asked:?}"
    );
}

#[test]
fn a_drain_marker_without_a_connection_counts_as_answered() {
    let mut r = routed(1, &[(0, "a")]);
    r.handle_send(1, ShardId(0), 1);
    rdrain(&mut r);
    r.flush_all(2);
    carry_out(&mut r, "a", SendFailure::NoConnection);
    // Nothing sent to `a` can still arrive there: the link that carried it is gone.
    assert!(r.is_settled());
}

#[test]
fn stop_all_stops_every_hosted_shard_gracefully_and_buffers_what_comes_meanwhile() {
    let mut r = routed(3, &[(0, "x"), (1, "x"), (2, "a")]);
    rdrain(&mut r);
    r.handle_stop_all(1);
    let mut stops: Vec<(u32, bool)> = rdrain(&mut r)
        .into_iter()
        .filter_map(|c| match c {
            RegionCommand::StopShard { shard, fenced, .. } => Some((shard.0, fenced)),
            _ => None,
        })
        .collect();
    stops.sort();
    assert_eq!(stops, [(0, false), (1, false)], "only the shards hosted here, their hooks run");
    r.handle_send(2, ShardId(0), 7);
    assert_eq!(r.buffered(), 1, "a stopping shard's message waits");
    assert!(rdrain(&mut r).is_empty());
}

#[test]
fn flush_all_drains_only_destinations_with_unconfirmed_forwards() {
    let mut r = routed(2, &[(0, "a"), (1, "b")]);
    r.handle_send(1, ShardId(0), 1);
    rdrain(&mut r);
    assert!(!r.is_settled(), "a forward to `a` is unconfirmed");
    r.flush_all(2);
    let flushes: Vec<String> = rdrain(&mut r).iter().map(sent).collect();
    assert_eq!(flushes, ["a: flush 0 #0"], "nothing went to `b`: nothing to drain there");
    r.handle_region_message(3, &node("a"), RegionMessage::FlushAck { shard: ShardId(0), token: 0 });
    assert!(r.is_settled());
}

#[test]
fn left_refuses_every_buffered_message_as_not_processed() {
    let mut r = region("x", 2);
    r.handle_send(1, ShardId(0), 1);
    r.handle_send(1, ShardId(1), 2);
    rdrain(&mut r);
    assert_eq!(r.buffered(), 2, "no home yet: buffered");
    r.handle_left(2);
    let mut refused: Vec<(u32, u32, RejectReason)> = rdrain(&mut r)
        .into_iter()
        .filter_map(|c| match c {
            RegionCommand::Reject { shard, msg, reason } => Some((shard.0, msg, reason)),
            _ => None,
        })
        .collect();
    refused.sort_by_key(|x| x.0);
    assert_eq!(refused, [(0, 1, RejectReason::Left), (1, 2, RejectReason::Left)]);
    assert_eq!(r.buffered(), 0);
}

#[test]
fn take_buffered_hands_every_buffered_message_over_and_emits_nothing() {
    let mut r = region("x", 2);
    r.handle_send(1, ShardId(0), 1);
    r.handle_send(1, ShardId(1), 2);
    r.handle_send(1, ShardId(1), 3);
    rdrain(&mut r);
    let mut taken = r.take_buffered();
    taken.sort();
    assert_eq!(taken, [(ShardId(0), 1), (ShardId(1), 2), (ShardId(1), 3)], "each with its shard, in order per shard");
    assert_eq!(r.buffered(), 0);
    assert!(rdrain(&mut r).is_empty(), "a crash sends nothing: the caller decides what the messages become");
    // Nothing is left to deliver when the shard gets a home later.
    assert!(r.take_buffered().is_empty());
}
