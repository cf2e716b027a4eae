//! A coordinator whose shard map write is refused for a newer term steps down.

mod common;

use common::*;
use shardline_core::Engine;
use shardline_core::{CoordinatorCommand, DomainEvent, MemberStatus};

#[test]
fn a_map_write_refused_for_a_newer_term_stops_the_coordinator() {
    let mut c = coordinator(4, &["a", "b"]);
    drain(&mut c);
    // Its own term, or an older one, wrote the map: not a deposition.
    c.handle_map_write_refused(1, 1);
    c.handle_map_write_refused(1, 0);
    assert!(!c.is_stopped());
    c.handle_map_write_refused(2, 5);
    assert!(c.is_stopped());
    assert_eq!(drain(&mut c), vec![CoordinatorCommand::Emit(DomainEvent::Deposed { node: node("a"), term: 1, by: 5 })]);
    // Deaf from then on: a failed member's shards are not reallocated, nothing is re-sent.
    let mut v = view(&["a", "b"]);
    v.set_status(&node("b"), MemberStatus::Down).unwrap();
    c.handle_membership(3, &v);
    c.handle_timeout(1_000_000);
    assert!(drain(&mut c).is_empty());
    assert_eq!(c.poll_timeout(), None);
    // Losing the leadership afterwards says nothing more.
    c.handle_leadership_lost(4);
    assert!(drain(&mut c).is_empty());
}
