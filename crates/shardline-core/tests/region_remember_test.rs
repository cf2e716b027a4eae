//! A journaled shard started here is claimed, and its remembered entities are read and woken at
//! the type's pace, with a bounded number recovering at once across the region
//! (`handle_claimed`, `handle_remembered`, `handle_woken`).

mod common;

use common::*;
use shardline_core::{
    ClaimOutcome, Engine, EntityId, Epoch, RegionCommand, RegionConfig, RegionEngine, RememberPace, ShardHome, ShardId,
    ToRegion,
};

const E1: Epoch = Epoch { term: 1, seq: 1 };

fn remembering(pace: Option<RememberPace>) -> RegionEngine<u32> {
    let mut cfg = RegionConfig::new(4);
    cfg.journaled = true;
    cfg.claim_retry_ms = 100;
    cfg.remember = pace;
    let mut r = RegionEngine::new(cfg, node("a"));
    r.handle_coordinator_changed(0, node("c"), 1);
    rdrain(&mut r);
    r
}

fn start(r: &mut RegionEngine<u32>, shards: &[u32], epoch: Epoch) -> Vec<RegionCommand<u32>> {
    let homes = shards.iter().map(|s| (ShardId(*s), ShardHome { owner: node("a"), epoch })).collect();
    r.handle_coordinator_message(0, &node("c"), ToRegion::ShardHomes { term: epoch.term, homes });
    journal(r)
}

/// The commands that concern the journal and the entities, in order.
fn journal(r: &mut RegionEngine<u32>) -> Vec<RegionCommand<u32>> {
    rdrain(r)
        .into_iter()
        .filter(|c| {
            matches!(
                c,
                RegionCommand::ClaimShard { .. }
                    | RegionCommand::ReadRemembered { .. }
                    | RegionCommand::WakeEntity { .. }
                    | RegionCommand::StopShard { .. }
            )
        })
        .collect()
}

fn ids(names: &[&str]) -> Vec<EntityId> {
    names.iter().map(EntityId::new).collect()
}

fn woken(cmds: &[RegionCommand<u32>]) -> Vec<(u32, String)> {
    cmds.iter()
        .filter_map(|c| match c {
            RegionCommand::WakeEntity { shard, id, .. } => Some((shard.0, id.as_str().to_string())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_shard_of_a_journaled_type_is_claimed_when_it_starts() {
    let mut r = remembering(None);
    assert_eq!(start(&mut r, &[1], E1), vec![RegionCommand::ClaimShard { shard: ShardId(1), epoch: E1 }]);
    // Claimed, and nothing remembered: nothing more.
    r.handle_claimed(1, ShardId(1), E1, ClaimOutcome::Claimed);
    assert!(journal(&mut r).is_empty());
}

#[test]
fn a_shard_of_a_type_without_a_journal_is_not_claimed() {
    let mut r = region("a", 4);
    r.handle_coordinator_changed(0, node("c"), 1);
    let homes = vec![(ShardId(1), ShardHome { owner: node("a"), epoch: E1 })];
    r.handle_coordinator_message(0, &node("c"), ToRegion::ShardHomes { term: 1, homes });
    assert!(!rdrain(&mut r).iter().any(|c| matches!(c, RegionCommand::ClaimShard { .. })));
}

#[test]
fn a_claim_the_journal_could_not_answer_is_asked_again_while_the_shard_is_here() {
    let mut r = remembering(None);
    start(&mut r, &[1], E1);
    r.handle_claimed(10, ShardId(1), E1, ClaimOutcome::Unavailable);
    assert!(journal(&mut r).is_empty());
    assert_eq!(r.poll_timeout(), Some(110));
    r.handle_timeout(109);
    assert!(journal(&mut r).is_empty(), "not before the retry is due");
    r.handle_timeout(110);
    assert_eq!(journal(&mut r), vec![RegionCommand::ClaimShard { shard: ShardId(1), epoch: E1 }]);
    // Unanswered again, then the shard leaves: no more claims of an epoch no longer hosted.
    r.handle_claimed(120, ShardId(1), E1, ClaimOutcome::Unavailable);
    r.handle_fenced(121);
    rdrain(&mut r);
    r.handle_timeout(500);
    assert!(journal(&mut r).is_empty());
}

#[test]
fn a_refused_claim_stops_the_shard_after_the_pause() {
    let mut r = remembering(Some(RememberPace { per_second: 10, at_once: 1 }));
    start(&mut r, &[1], E1);
    r.handle_claimed(10, ShardId(1), E1, ClaimOutcome::Refused);
    assert!(journal(&mut r).is_empty(), "no read of a shard it may not write");
    let pause = RegionConfig::new(4).claim_refused_pause_ms;
    r.handle_timeout(10 + pause);
    assert_eq!(journal(&mut r), vec![RegionCommand::StopShard { shard: ShardId(1), epoch: E1, fenced: false }]);
}

#[test]
fn a_claimed_shard_reads_its_remembered_entities_and_a_failed_read_is_asked_again() {
    let mut r = remembering(Some(RememberPace { per_second: 1000, at_once: 8 }));
    start(&mut r, &[2], E1);
    r.handle_claimed(5, ShardId(2), E1, ClaimOutcome::Claimed);
    assert_eq!(journal(&mut r), vec![RegionCommand::ReadRemembered { shard: ShardId(2), epoch: E1 }]);
    r.handle_remembered(6, ShardId(2), E1, None);
    assert!(journal(&mut r).is_empty());
    r.handle_timeout(106);
    assert_eq!(journal(&mut r), vec![RegionCommand::ReadRemembered { shard: ShardId(2), epoch: E1 }]);
    r.handle_remembered(107, ShardId(2), E1, Some(ids(&["x"])));
    assert_eq!(
        journal(&mut r),
        vec![RegionCommand::WakeEntity { shard: ShardId(2), epoch: E1, id: EntityId::new("x") }]
    );
}

#[test]
fn wakes_keep_the_pace_of_each_shard() {
    // 10 a second: one every 100 ms in each shard, the first at once.
    let mut r = remembering(Some(RememberPace { per_second: 10, at_once: 100 }));
    start(&mut r, &[0, 1], E1);
    r.handle_remembered(0, ShardId(0), E1, Some(ids(&["a0", "a1", "a2"])));
    r.handle_remembered(0, ShardId(1), E1, Some(ids(&["b0", "b1"])));
    assert_eq!(woken(&journal(&mut r)), vec![(0, "a0".into()), (1, "b0".into())]);
    assert_eq!(r.poll_timeout(), Some(100));
    r.handle_timeout(99);
    assert!(woken(&journal(&mut r)).is_empty(), "not before the pace allows");
    r.handle_timeout(100);
    assert_eq!(woken(&journal(&mut r)), vec![(0, "a1".into()), (1, "b1".into())]);
    r.handle_timeout(200);
    assert_eq!(woken(&journal(&mut r)), vec![(0, "a2".into())]);
    assert_eq!(r.remembered_waiting(), 0);
}

#[test]
fn no_more_entities_recover_at_once_than_the_places_and_each_recovery_frees_one() {
    let mut r = remembering(Some(RememberPace { per_second: 1_000_000, at_once: 2 }));
    start(&mut r, &[0, 3], E1);
    r.handle_remembered(0, ShardId(0), E1, Some(ids(&["a0", "a1", "a2"])));
    r.handle_remembered(0, ShardId(3), E1, Some(ids(&["b0"])));
    let first = woken(&journal(&mut r));
    assert_eq!(first.len(), 2, "two places: {first:?}");
    assert_eq!(r.waking(), 2);
    let register = RegionConfig::new(4).register_retry_ms;
    assert_eq!(r.poll_timeout(), Some(register), "no wake-up of its own while every place is taken");
    r.handle_timeout(50);
    assert!(woken(&journal(&mut r)).is_empty());
    // A report for an entity that holds no place frees none.
    r.handle_woken(51, ShardId(0), E1, &EntityId::new("nobody"));
    assert!(woken(&journal(&mut r)).is_empty());
    let (shard, id) = first[0].clone();
    r.handle_woken(52, ShardId(shard), E1, &EntityId::new(id));
    assert_eq!(woken(&journal(&mut r)).len(), 1);
    assert_eq!(r.waking(), 2);
}

#[test]
fn a_shard_that_stops_or_moves_on_wakes_nothing_more() {
    let mut r = remembering(Some(RememberPace { per_second: 10, at_once: 100 }));
    start(&mut r, &[0], E1);
    r.handle_remembered(0, ShardId(0), E1, Some(ids(&["a0", "a1"])));
    assert_eq!(woken(&journal(&mut r)).len(), 1);
    // The coordinator hands it elsewhere: it stops at once, and its queue goes with it.
    let homes = vec![(ShardId(0), ShardHome { owner: node("b"), epoch: Epoch { term: 1, seq: 2 } })];
    r.handle_coordinator_message(10, &node("c"), ToRegion::ShardHomes { term: 1, homes });
    rdrain(&mut r);
    r.handle_timeout(1_000);
    assert!(woken(&journal(&mut r)).is_empty());
    assert_eq!(r.remembered_waiting(), 0);
    // A list read for an epoch no longer hosted is not taken.
    r.handle_remembered(1_001, ShardId(0), E1, Some(ids(&["a0"])));
    assert!(woken(&journal(&mut r)).is_empty());
}

#[test]
fn a_shard_that_stays_at_a_newer_epoch_wakes_the_rest_at_that_epoch() {
    let mut r = remembering(Some(RememberPace { per_second: 10, at_once: 100 }));
    start(&mut r, &[0], E1);
    r.handle_remembered(0, ShardId(0), E1, Some(ids(&["a0", "a1"])));
    journal(&mut r);
    let e2 = Epoch { term: 2, seq: 1 };
    r.handle_coordinator_changed(1, node("c"), 2);
    let homes = vec![(ShardId(0), ShardHome { owner: node("a"), epoch: e2 })];
    r.handle_coordinator_message(2, &node("c"), ToRegion::ShardHomes { term: 2, homes });
    journal(&mut r);
    r.handle_timeout(100);
    assert_eq!(
        journal(&mut r),
        vec![RegionCommand::WakeEntity { shard: ShardId(0), epoch: e2, id: EntityId::new("a1") }]
    );
}
