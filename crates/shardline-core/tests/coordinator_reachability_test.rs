//! The coordinator and a view that is not settled: a member joining or one it cannot reach holds
//! rebalancing (unowned shards are still placed, leaving members still hand over), and no
//! hand-off ever begins towards or from an unreachable member.

mod common;

use common::*;
use shardline_core::{CoordinatorEngine, Member, MemberStatus, MembershipView, NodeId, ShardId};

/// The hand-offs in progress, as (shard, from, to).
fn moves(c: &CoordinatorEngine) -> Vec<(ShardId, NodeId, NodeId)> {
    c.hand_off_moves().map(|(s, from, to)| (s, from.clone(), to.clone())).collect()
}

fn with(view: &MembershipView, name: &str, up_number: u64, status: MemberStatus) -> MembershipView {
    let mut v = view.clone();
    v.add(Member::new(node(name), up_number).with_status(status)).unwrap();
    v
}

#[test]
fn an_unreachable_member_gets_no_shard_and_holds_rebalancing_until_it_is_reachable() {
    let mut c = coordinator(6, &["a", "b"]);
    drain(&mut c);
    let mut v = with(&view(&["a", "b"]), "c", 3, MemberStatus::Up);
    v.set_reachable(&node("c"), false).unwrap();
    c.handle_membership(10, &v);
    c.handle_register(11, &node("c"), 1, &[], true);
    drain(&mut c);
    assert!(moves(&c).is_empty(), "no hand-off towards an unreachable member");
    assert_eq!(c.shard_map().shards_of(&node("c")).count(), 0);
    // b is unreachable too now, and a third host d arrives: nothing moves while anyone is unreachable.
    let mut v2 = with(&v, "d", 4, MemberStatus::Up);
    v2.set_reachable(&node("b"), false).unwrap();
    c.handle_membership(20, &v2);
    c.handle_register(21, &node("d"), 1, &[], true);
    drain(&mut c);
    assert!(c.hand_offs_in_progress().next().is_none(), "rebalancing held while members are unreachable");
    // Everyone reachable again: the rebalance starts at once, towards c and d.
    let mut v3 = v2.clone();
    v3.set_reachable(&node("b"), true).unwrap();
    v3.set_reachable(&node("c"), true).unwrap();
    c.handle_membership(30, &v3);
    drain(&mut c);
    let started = moves(&c);
    assert!(!started.is_empty(), "the held rebalance starts once the view settles");
    assert!(started.iter().all(|(_, _, to)| *to == node("c") || *to == node("d")), "{started:?}");
}

#[test]
fn shards_of_a_downed_member_go_to_reachable_members_while_rebalancing_is_held() {
    let mut c = coordinator(6, &["a", "b", "c"]);
    drain(&mut c);
    let of_b: Vec<ShardId> = c.shard_map().shards_of(&node("b")).collect();
    let mut v = view(&["a", "b", "c"]);
    v.set_status(&node("b"), MemberStatus::Down).unwrap();
    v.set_reachable(&node("c"), false).unwrap();
    c.handle_membership(10, &v);
    drain(&mut c);
    for s in of_b {
        assert_eq!(c.shard_map().home(s).map(|h| h.owner), Some(node("a")), "placed on the reachable member");
    }
    assert!(c.hand_offs_in_progress().next().is_none(), "and nothing else moves");
}

#[test]
fn a_joining_member_holds_rebalancing_but_not_a_leave() {
    let mut c = coordinator(6, &["a", "b"]);
    drain(&mut c);
    // d is Up and registered (a rebalance would move shards to it); e, which may host, is joining.
    let v = with(&with(&view(&["a", "b"]), "d", 3, MemberStatus::Up), "e", 4, MemberStatus::Joining);
    c.handle_membership(10, &v);
    c.handle_register(11, &node("d"), 1, &[], true);
    c.handle_register(11, &node("e"), 1, &[], true);
    drain(&mut c);
    assert!(c.hand_offs_in_progress().next().is_none(), "no rebalance while a member joins");
    // b leaves: its shards are handed over all the same, to members that are Up.
    let mut leaving = v.clone();
    leaving.set_status(&node("b"), MemberStatus::Leaving).unwrap();
    c.handle_membership(20, &leaving);
    drain(&mut c);
    let started = moves(&c);
    assert!(!started.is_empty(), "a leave is not held");
    assert!(started.iter().all(|(_, from, to)| *from == node("b") && *to != node("e")), "{started:?}");
}

#[test]
fn a_joining_proxy_or_a_member_without_the_role_holds_nothing() {
    let mut v = view(&["a"]);
    v.add(Member::new(node("p"), 2).with_role(shardline_core::PROXY_ROLE)).unwrap();
    assert_eq!(v.rebalance_hold(None), None, "a proxy never hosts");
    v.add(Member::new(node("w"), 3).with_role("web")).unwrap();
    assert_eq!(v.rebalance_hold(Some("db")), None, "w never hosts a db type");
    assert!(v.rebalance_hold(Some("web")).is_some());
    // A fenced member's reachability no longer matters.
    let mut v = view(&["a", "b"]);
    v.set_reachable(&node("b"), false).unwrap();
    v.set_status(&node("b"), MemberStatus::Down).unwrap();
    assert_eq!(v.rebalance_hold(None), None);
    assert!(v.set_reachable(&node("zz"), false).is_err(), "an unknown member is an error");
}
