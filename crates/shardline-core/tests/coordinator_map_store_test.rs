//! The coordinator and its map store: nothing decided before the stored map is read, what a
//! read's and a write's outcome mean, and assignments from outside.

mod common;

use common::*;
use shardline_core::coordinator::STORE_RETRY_MS;
use shardline_core::Engine;
use shardline_core::{
    AssignError, CoordinatorCommand, CoordinatorEngine, DomainEvent, External, LeastShards, MapLoadError,
    MapWriteError, PlanProblem, ShardId, ShardMap,
};

fn loading(names: &[&str]) -> CoordinatorEngine {
    CoordinatorEngine::loading(config(4), node("a"), 2, Box::new(LeastShards::unlimited()), view(names)).unwrap()
}

fn external(names: &[&str]) -> CoordinatorEngine {
    let strategy = External::new(std::iter::empty::<(ShardId, String)>()).otherwise(LeastShards::unlimited());
    let mut c = CoordinatorEngine::new(config(4), node("a"), 1, Box::new(strategy), view(names), None, 0).unwrap();
    for n in names {
        c.handle_register(0, &node(n), 1, &[], true);
    }
    drain(&mut c);
    c
}

fn persists(cmds: &[CoordinatorCommand]) -> Vec<u64> {
    cmds.iter()
        .filter_map(|c| match c {
            CoordinatorCommand::PersistShardMap { version, .. } => Some(*version),
            _ => None,
        })
        .collect()
}

#[test]
fn a_loading_coordinator_asks_for_the_map_and_decides_nothing_until_it_has_it() {
    let mut c = loading(&["a", "b"]);
    assert_eq!(drain(&mut c), vec![CoordinatorCommand::LoadShardMap]);
    assert!(c.is_loading());
    // Inputs are ignored meanwhile; the newest view is kept.
    c.handle_register(1, &node("b"), 2, &[], true);
    c.handle_get_shard_home(1, &node("b"), ShardId(0));
    c.handle_membership(1, &view(&["a", "b", "c"]));
    c.handle_timeout(1_000);
    assert!(drain(&mut c).is_empty());
    assert_eq!(c.poll_timeout(), None, "nothing to wait for but the map");
    c.handle_map_loaded(2, Ok(None));
    assert!(!c.is_loading());
    let cmds = drain(&mut c);
    assert_eq!(cmds[0], CoordinatorCommand::Emit(DomainEvent::LeaderElected { node: node("a"), term: 2 }));
    // Recovery asks the members of the newest view to register, c among them.
    let asked: Vec<String> = cmds
        .iter()
        .filter_map(|c| match c {
            CoordinatorCommand::RequestRegistration { to } => Some(to.iter().map(|n| n.name.to_string()).collect()),
            _ => None,
        })
        .flat_map(|v: Vec<String>| v)
        .collect();
    assert!(asked.contains(&"c".to_string()), "asked {asked:?}");
}

#[test]
fn a_loaded_map_is_resumed() {
    let mut stored = ShardMap::new(4).unwrap();
    stored.assign(ShardId(1), node("b"), 1).unwrap();
    let mut c = loading(&["a", "b"]);
    drain(&mut c);
    c.handle_map_loaded(1, Ok(Some(stored)));
    assert_eq!(c.shard_map().home(ShardId(1)).map(|h| h.owner), Some(node("b")));
}

#[test]
fn an_unreadable_map_is_started_over_and_a_failed_read_asked_again() {
    let mut c = loading(&["a"]);
    drain(&mut c);
    c.handle_map_loaded(5, Err(MapLoadError::Unavailable { reason: "down".into() }));
    assert!(c.is_loading());
    assert_eq!(c.poll_timeout(), Some(5 + STORE_RETRY_MS));
    c.handle_timeout(5 + STORE_RETRY_MS - 1);
    assert!(drain(&mut c).is_empty(), "not yet");
    c.handle_timeout(5 + STORE_RETRY_MS);
    assert_eq!(drain(&mut c), vec![CoordinatorCommand::LoadShardMap]);
    c.handle_map_loaded(600, Err(MapLoadError::Unreadable { reason: "garbage".into() }));
    assert!(!c.is_loading(), "started over");
    assert!(c.shard_map().iter().all(|(_, slot)| slot.home().is_none()));
}

#[test]
fn persisting_carries_the_whole_map() {
    let mut c = coordinator(4, &["a", "b"]);
    let cmds = drain(&mut c);
    let Some(CoordinatorCommand::PersistShardMap { version, map, .. }) =
        cmds.iter().find(|c| matches!(c, CoordinatorCommand::PersistShardMap { .. }))
    else {
        panic!("the first allocation persists: {cmds:?}")
    };
    assert_eq!((*version, map), (c.shard_map().version(), c.shard_map()));
}

#[test]
fn a_write_refused_for_a_newer_term_deposes_the_coordinator() {
    let mut c = coordinator(4, &["a", "b"]);
    drain(&mut c);
    let v = c.shard_map().version();
    c.handle_map_stored(1, v, Err(MapWriteError::Conflict { term: Some(1) }));
    assert!(!c.is_stopped(), "its own term: not a deposition");
    assert_eq!(persists(&drain(&mut c)), [v], "written again over the conflict");
    c.handle_map_stored(2, v, Err(MapWriteError::Conflict { term: None }));
    assert_eq!(persists(&drain(&mut c)), [v], "an unreadable or missing map is overwritten");
    c.handle_map_stored(3, v, Err(MapWriteError::Conflict { term: Some(7) }));
    assert!(c.is_stopped());
    assert_eq!(drain(&mut c), vec![CoordinatorCommand::Emit(DomainEvent::Deposed { node: node("a"), term: 1, by: 7 })]);
}

#[test]
fn a_failed_write_of_the_newest_map_is_tried_again_later() {
    let mut c = coordinator(4, &["a", "b"]);
    drain(&mut c);
    let v = c.shard_map().version();
    c.handle_map_stored(10, v - 1, Err(MapWriteError::Unavailable { reason: "down".into() }));
    assert!(c.poll_timeout().is_none_or(|t| t != 10 + STORE_RETRY_MS), "a superseded write is not retried");
    c.handle_map_stored(10, v, Err(MapWriteError::Unavailable { reason: "down".into() }));
    assert!(c.poll_timeout().is_some_and(|t| t <= 10 + STORE_RETRY_MS));
    c.handle_timeout(10 + STORE_RETRY_MS);
    assert_eq!(persists(&drain(&mut c)), [v]);
    c.handle_map_stored(20, v, Ok(()));
    assert!(drain(&mut c).is_empty());
}

#[test]
fn assignments_are_all_checked_before_any_is_taken() {
    let mut c = external(&["a", "b"]);
    let wrong = c.handle_assignments(1, &[(ShardId(0), "b".into()), (ShardId(9), "b".into())]);
    assert_eq!(wrong, Err(AssignError::Wrong { shard: ShardId(9), problem: PlanProblem::OutOfRange }));
    let wrong = c.handle_assignments(1, &[(ShardId(0), "z".into())]);
    assert!(matches!(wrong, Err(AssignError::Wrong { problem: PlanProblem::NotAHost { .. }, .. })));
    assert!(drain(&mut c).is_empty(), "none taken, nothing planned");
    let owner = c.shard_map().home(ShardId(0)).map(|h| h.owner);
    let to = if owner == Some(node("a")) { "b" } else { "a" };
    c.handle_assignments(2, &[(ShardId(0), to.into())]).unwrap();
    let cmds = drain(&mut c);
    assert!(
        cmds.iter().any(|c| matches!(c, CoordinatorCommand::SendBeginHandOff { shard: ShardId(0), .. })),
        "planned at once: {cmds:?}"
    );
}

#[test]
fn assignments_need_a_strategy_that_takes_them() {
    let mut c = coordinator(4, &["a", "b"]);
    drain(&mut c);
    assert_eq!(
        c.handle_assignments(1, &[(ShardId(0), "b".into())]),
        Err(AssignError::NotExternal { strategy: "least-shards" })
    );
    let mut l = loading(&["a"]);
    assert_eq!(l.handle_assignments(1, &[]), Err(AssignError::Loading));
}

#[test]
fn replace_strategy_plans_at_once_with_the_new_one() {
    let mut c = coordinator(4, &["a", "b"]);
    drain(&mut c);
    let owner = c.shard_map().home(ShardId(2)).map(|h| h.owner);
    let to = if owner == Some(node("a")) { "b" } else { "a" };
    let strategy = External::new([(ShardId(2), to)]).otherwise(LeastShards::unlimited());
    c.replace_strategy(1, Box::new(strategy));
    let cmds = drain(&mut c);
    assert!(
        cmds.iter().any(|c| matches!(c, CoordinatorCommand::SendBeginHandOff { shard: ShardId(2), .. })),
        "the new strategy's move starts at once: {cmds:?}"
    );
}
