//! The region's sweeps over its hosted entities (the linger nudge, passivation): on its own
//! timer, only while a shard is hosted, never on a proxy or once fenced.

mod common;

use common::*;
use shardline_core::{Engine, Epoch, RegionCommand, RegionConfig, RegionEngine, ShardHome, ShardId, ToRegion};

fn sweeping(linger: Option<u64>, passivate: Option<u64>, hosting: bool) -> RegionEngine<u32> {
    let mut cfg = RegionConfig::new(2);
    cfg.linger_sweep_ms = linger;
    cfg.passivate_after_ms = passivate;
    cfg.hosting = hosting;
    RegionEngine::new(cfg, node("a"))
}

fn host_a_shard(r: &mut RegionEngine<u32>) {
    r.handle_coordinator_changed(0, node("c"), 1);
    let home = ShardHome { owner: node("a"), epoch: Epoch { term: 1, seq: 1 } };
    r.handle_coordinator_message(0, &node("c"), ToRegion::ShardHomes { term: 1, homes: vec![(ShardId(0), home)] });
    rdrain(r);
}

fn sweeps(r: &mut RegionEngine<u32>) -> Vec<RegionCommand<u32>> {
    rdrain(r)
        .into_iter()
        .filter(|c| matches!(c, RegionCommand::SweepLingering | RegionCommand::PassivateIdle { .. }))
        .collect()
}

#[test]
fn the_linger_sweep_runs_every_interval_while_a_shard_is_hosted() {
    let mut r = sweeping(Some(50), None, true);
    host_a_shard(&mut r);
    r.handle_timeout(10);
    assert_eq!(sweeps(&mut r), vec![RegionCommand::SweepLingering]);
    assert!(r.poll_timeout().is_some_and(|t| t <= 60), "the next one within the interval");
    r.handle_timeout(59);
    assert!(sweeps(&mut r).is_empty(), "not before the interval is over");
    r.handle_timeout(60);
    assert_eq!(sweeps(&mut r), vec![RegionCommand::SweepLingering]);
}

#[test]
fn passivation_sweeps_every_half_of_its_idle_time_and_at_most_twice_a_second() {
    let mut r = sweeping(None, Some(10_000), true);
    host_a_shard(&mut r);
    r.handle_timeout(0);
    assert_eq!(sweeps(&mut r), vec![RegionCommand::PassivateIdle { after_ms: 10_000 }]);
    r.handle_timeout(4_999);
    assert!(sweeps(&mut r).is_empty());
    r.handle_timeout(5_000);
    assert_eq!(sweeps(&mut r), vec![RegionCommand::PassivateIdle { after_ms: 10_000 }]);
    let mut quick = sweeping(None, Some(100), true);
    host_a_shard(&mut quick);
    quick.handle_timeout(0);
    assert_eq!(sweeps(&mut quick).len(), 1);
    quick.handle_timeout(499);
    assert!(sweeps(&mut quick).is_empty(), "500 ms apart at the least");
    quick.handle_timeout(500);
    assert_eq!(sweeps(&mut quick).len(), 1);
}

#[test]
fn nothing_hosted_no_sweep_asked_for() {
    let mut r = sweeping(Some(50), Some(1_000), true);
    r.handle_timeout(0);
    r.handle_timeout(1_000);
    assert!(sweeps(&mut r).is_empty());
    // Hosted later: swept from the next interval on.
    host_a_shard(&mut r);
    r.handle_timeout(1_050);
    assert_eq!(sweeps(&mut r), vec![RegionCommand::SweepLingering]);
}

#[test]
fn no_sweeps_by_default_on_a_proxy_or_once_fenced() {
    let mut default = region("a", 2);
    host_a_shard(&mut default);
    default.handle_timeout(100_000);
    assert!(sweeps(&mut default).is_empty(), "off unless configured");
    let mut proxy = sweeping(Some(50), Some(1_000), false);
    proxy.handle_timeout(100_000);
    assert!(sweeps(&mut proxy).is_empty());
    let mut fenced = sweeping(Some(50), Some(1_000), true);
    host_a_shard(&mut fenced);
    fenced.handle_fenced(10);
    assert_eq!(fenced.poll_timeout(), None, "a fenced region wants no timer");
    fenced.handle_timeout(100_000);
    assert!(sweeps(&mut fenced).is_empty());
}
