//! A shard whose claim the journal refused (a newer fence stands): the region stops it and
//! reports it stopped, so that the coordinator frees it, and hosts it again at a new epoch.

mod common;

use common::*;
use shardline_core::{Engine, Epoch, RegionCommand, RegionConfig, ShardHome, ShardId, ToCoordinator, ToRegion};

const S: ShardId = ShardId(0);

fn home(r: &mut shardline_core::RegionEngine<u32>, term: u64, epoch: Epoch) {
    r.handle_coordinator_message(
        0,
        &node("c"),
        ToRegion::ShardHomes { term, homes: vec![(S, ShardHome { owner: node("a"), epoch })] },
    );
}

/// The shard stops among the commands waiting (the others: registrations repeated meanwhile).
fn stops(r: &mut shardline_core::RegionEngine<u32>) -> Vec<RegionCommand<u32>> {
    rdrain(r).into_iter().filter(|c| matches!(c, RegionCommand::StopShard { .. })).collect()
}

#[test]
fn a_refused_claim_stops_the_shard_reports_it_and_a_new_epoch_starts_it_again() {
    let mut r = region("a", 1);
    r.handle_coordinator_changed(0, node("c"), 1);
    let old = Epoch { term: 1, seq: 1 };
    home(&mut r, 1, old);
    assert!(rdrain(&mut r).contains(&RegionCommand::StartShard { shard: S, epoch: old, handover: None }));
    r.handle_claim_refused(1, S, old);
    // Kept a moment first: the membership may still lead above the refused term.
    assert!(rdrain(&mut r).is_empty());
    assert!(r.is_active(S));
    let pause = RegionConfig::new(1).claim_refused_pause_ms;
    assert!(r.poll_timeout().is_some_and(|t| t <= 1 + pause), "a timer no later than the pause's end");
    r.handle_timeout(pause);
    assert!(stops(&mut r).is_empty(), "not before the pause is over");
    r.handle_timeout(1 + pause);
    assert_eq!(stops(&mut r), vec![RegionCommand::StopShard { shard: S, epoch: old, fenced: false }]);
    assert!(!r.is_active(S), "new messages wait, as for a hand-off");
    r.handle_shard_stopped(2 + pause, S, None);
    assert!(r.hosted().is_empty(), "no longer reported as hosted");
    assert_eq!(
        rdrain(&mut r),
        vec![RegionCommand::SendToCoordinator {
            to: node("c"),
            msg: ToCoordinator::ShardStopped { term: 1, shard: S, epoch: old, handover: None }
        }]
    );
    // A coordinator of a term above the fence gives it back here at a new epoch.
    let new = Epoch { term: 3, seq: 1 };
    home(&mut r, 3, new);
    assert!(rdrain(&mut r).contains(&RegionCommand::StartShard { shard: S, epoch: new, handover: None }));
    assert_eq!(r.hosted(), vec![(S, new)]);
}

#[test]
fn a_refusal_of_an_epoch_no_longer_hosted_changes_nothing() {
    let mut r = region("a", 1);
    r.handle_coordinator_changed(0, node("c"), 1);
    let (old, new) = (Epoch { term: 1, seq: 1 }, Epoch { term: 1, seq: 2 });
    home(&mut r, 1, old);
    home(&mut r, 1, new);
    rdrain(&mut r);
    // The refusal of the claim at the older epoch arrives after the shard stayed here at a newer
    // one: the newer claim stands on its own.
    r.handle_claim_refused(1, S, old);
    r.handle_timeout(1 + RegionConfig::new(1).claim_refused_pause_ms);
    assert!(stops(&mut r).is_empty());
    assert_eq!(r.hosted(), vec![(S, new)]);
}

#[test]
fn a_shard_that_moves_on_during_the_pause_is_not_stopped() {
    let mut r = region("a", 1);
    r.handle_coordinator_changed(0, node("c"), 1);
    let (old, new) = (Epoch { term: 1, seq: 1 }, Epoch { term: 1, seq: 2 });
    home(&mut r, 1, old);
    rdrain(&mut r);
    r.handle_claim_refused(1, S, old);
    // Stays here at a newer epoch before the pause is over: that claim is a new one.
    home(&mut r, 1, new);
    rdrain(&mut r);
    r.handle_timeout(1 + RegionConfig::new(1).claim_refused_pause_ms);
    assert!(stops(&mut r).is_empty());
    assert_eq!(r.hosted(), vec![(S, new)]);
}
