//! Views that arrive while the coordinator's node may not act (its hosting lease ran out or is
//! not granted yet): the engine keeps the newest, decides nothing on it, and handles it before the
//! next input once the node may act.

mod common;

use common::*;
use shardline_core::{MemberStatus, ShardId};

#[test]
fn a_held_view_decides_nothing_until_it_is_applied_then_comes_first() {
    let mut c = coordinator(6, &["a", "b", "c"]);
    drain(&mut c);
    let of_b: Vec<ShardId> = c.shard_map().shards_of(&node("b")).collect();
    assert!(!of_b.is_empty());
    let mut v = view(&["a", "b", "c"]);
    v.set_status(&node("b"), MemberStatus::Down).unwrap();
    c.hold_view(&v);
    assert!(drain(&mut c).is_empty(), "held: nothing decided");
    assert_eq!(c.shard_map().shards_of(&node("b")).count(), of_b.len());
    // The node may act again: the held view first, then the input.
    c.apply_held_view(10);
    assert_eq!(c.shard_map().shards_of(&node("b")).count(), 0, "b's shards freed on the held view");
    assert!(!drain(&mut c).is_empty());
    // Applied once only.
    c.apply_held_view(11);
    assert!(drain(&mut c).is_empty());
}

#[test]
fn only_the_newest_held_view_counts_and_a_newer_input_replaces_it() {
    let mut c = coordinator(6, &["a", "b", "c"]);
    drain(&mut c);
    let mut b_down = view(&["a", "b", "c"]);
    b_down.set_status(&node("b"), MemberStatus::Down).unwrap();
    let mut c_down = view(&["a", "b", "c"]);
    c_down.set_status(&node("c"), MemberStatus::Down).unwrap();
    c.hold_view(&b_down);
    c.hold_view(&c_down);
    c.apply_held_view(10);
    assert!(c.shard_map().shards_of(&node("b")).count() > 0, "the older held view was replaced");
    assert_eq!(c.shard_map().shards_of(&node("c")).count(), 0);
    drain(&mut c);
    // A view handed to the engine as an input is newer than one held before it.
    let mut d = coordinator(6, &["a", "b", "c"]);
    drain(&mut d);
    d.hold_view(&b_down);
    d.handle_membership(10, &view(&["a", "b", "c"]));
    d.apply_held_view(11);
    assert!(d.shard_map().shards_of(&node("b")).count() > 0, "the held view did not come after the newer one");
}
