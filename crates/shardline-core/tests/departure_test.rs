//! A graceful leave's decisions: wait while someone can take the shards, stop them here when no
//! other member may host them or no leader has coordinated for a while.

use shardline_core::{Closing, Departure, DepartureStep, Member, MemberStatus, MembershipView, NodeId, StopReason};

fn view(leader: Option<&str>, others: &[(&str, MemberStatus)]) -> MembershipView {
    let mut v = MembershipView::new();
    v.add(Member::new(NodeId::new("me", 1), 1).with_status(MemberStatus::Leaving)).unwrap();
    for (i, (n, s)) in others.iter().enumerate() {
        v.add(Member::new(NodeId::new(*n, 1), i as u64 + 2).with_status(*s)).unwrap();
    }
    v.set_leader(leader.map(|l| NodeId::new(l, 1))).unwrap();
    v
}

#[test]
fn a_leave_waits_while_a_leader_can_hand_the_shards_over() {
    let me = NodeId::new("me", 1);
    let v = view(Some("b"), &[("b", MemberStatus::Up)]);
    let mut d = Departure::new(5_000);
    for now in [0, 1_000, 60_000] {
        assert_eq!(d.step(now, &v, &me, true), DepartureStep::Wait);
    }
    assert_eq!(d.step(60_020, &v, &me, false), DepartureStep::Done);
    assert!(!d.stopped_alone());
}

#[test]
fn without_a_leader_for_long_enough_the_shards_stop_here_once() {
    let me = NodeId::new("me", 1);
    let with = view(Some("b"), &[("b", MemberStatus::Up)]);
    let without = view(None, &[("b", MemberStatus::Up)]);
    let mut d = Departure::new(5_000);
    assert_eq!(d.step(0, &without, &me, true), DepartureStep::Wait);
    // A leader comes back before the limit: the clock starts over.
    assert_eq!(d.step(4_000, &with, &me, true), DepartureStep::Wait);
    assert_eq!(d.step(5_000, &without, &me, true), DepartureStep::Wait);
    assert_eq!(d.step(9_999, &without, &me, true), DepartureStep::Wait);
    let stop = |first| DepartureStep::StopHere { reason: StopReason::NoLeader, first };
    assert_eq!(d.step(10_000, &without, &me, true), stop(true));
    assert_eq!(d.step(10_020, &without, &me, true), stop(false), "logged once");
    assert!(d.stopped_alone());
}

#[test]
fn with_no_member_that_may_host_the_shards_stop_here_at_once() {
    let me = NodeId::new("me", 1);
    let others = [("b", MemberStatus::Leaving), ("c", MemberStatus::Down), ("d", MemberStatus::Removed)];
    let v = view(Some("b"), &others);
    let mut d = Departure::new(5_000);
    assert_eq!(d.step(0, &v, &me, true), DepartureStep::StopHere { reason: StopReason::NoSuccessor, first: true });
}

/// A member whose status has not been heard yet is `Joining`, and `Up` a moment later: the leave
/// waits for it instead of stopping the shards (the state a hand-off carries would be lost), but
/// no longer than it would wait for a leader. Gossip membership found it: a node that left right
/// after two others joined stopped its shards, and their entities restarted empty.
#[test]
fn a_joining_member_is_waited_for_as_long_as_a_leader() {
    let me = NodeId::new("me", 1);
    let joining = view(Some("me"), &[("b", MemberStatus::Joining)]);
    let up = view(Some("b"), &[("b", MemberStatus::Up)]);
    let mut d = Departure::new(5_000);
    assert_eq!(d.step(0, &joining, &me, true), DepartureStep::Wait);
    assert_eq!(d.step(300, &up, &me, true), DepartureStep::Wait, "b is up: the hand-off goes on");
    assert_eq!(d.step(400, &up, &me, false), DepartureStep::Done);
    assert!(!d.stopped_alone());
    // One that never gets there: the shards stop here after the limit.
    let mut d = Departure::new(5_000);
    assert_eq!(d.step(0, &joining, &me, true), DepartureStep::Wait);
    assert_eq!(d.step(4_999, &joining, &me, true), DepartureStep::Wait);
    let stop = DepartureStep::StopHere { reason: StopReason::NoSuccessor, first: true };
    assert_eq!(d.step(5_000, &joining, &me, true), stop);
}

/// The closing goes in order: what waited for shards stopped here is refused, the drains are
/// started and waited for, the goodbye is said and given time to spread, then the node closes.
#[test]
fn the_closing_refuses_flushes_waits_for_the_drains_says_goodbye_then_closes() {
    let me = NodeId::new("me", 1);
    let alone = view(None, &[]);
    let mut d = Departure::new(5_000).until(10_000);
    assert!(matches!(d.step(0, &alone, &me, true), DepartureStep::StopHere { .. }));
    assert_eq!(d.step(20, &alone, &me, false), DepartureStep::Done);
    assert_eq!(d.close_step(20, false), Closing::RefuseWaiting);
    assert_eq!(d.close_step(20, false), Closing::Flush);
    assert_eq!(d.close_step(40, false), Closing::Wait, "the drains are not confirmed");
    assert_eq!(d.close_step(60, true), Closing::Exit);
    assert_eq!(d.close_step(60 + d.goodbye_ms - 1, true), Closing::Wait, "the goodbye spreads");
    assert_eq!(d.close_step(60 + d.goodbye_ms, true), Closing::Close);
}

/// A leave that handed every shard over refuses nothing: its buffers went with the hand-offs.
#[test]
fn a_leave_that_handed_off_goes_straight_to_the_drains() {
    let mut d = Departure::new(5_000);
    assert_eq!(d.close_step(0, true), Closing::Flush);
    assert_eq!(d.close_step(0, true), Closing::Exit);
}

/// At the deadline, hand-offs still under way fail the leave; drains not yet confirmed are not
/// waited for any longer.
#[test]
fn the_deadline_fails_a_hand_off_and_ends_the_wait_for_drains() {
    let me = NodeId::new("me", 1);
    let v = view(Some("b"), &[("b", MemberStatus::Up)]);
    let mut d = Departure::new(5_000).until(1_000);
    assert_eq!(d.step(1_000, &v, &me, true), DepartureStep::Wait);
    assert_eq!(d.step(1_001, &v, &me, true), DepartureStep::TimedOut);
    let mut d = Departure::new(5_000).until(1_000);
    assert_eq!(d.step(0, &v, &me, false), DepartureStep::Done);
    assert_eq!(d.close_step(0, false), Closing::Flush);
    assert_eq!(d.close_step(999, false), Closing::Wait);
    assert_eq!(d.close_step(1_000, false), Closing::Exit);
}
