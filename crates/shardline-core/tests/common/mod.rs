//! Fixtures shared by the engine tests.
#![allow(dead_code)]

use shardline_core::Engine;
use shardline_core::{
    CoordinatorCommand, CoordinatorConfig, CoordinatorEngine, LeastShards, Member, MemberStatus, MembershipView,
    NodeId, RegionCommand, RegionConfig, RegionEngine, ShardMap,
};

pub fn node(name: &str) -> NodeId {
    NodeId::new(name, 1)
}

pub fn view(names: &[&str]) -> MembershipView {
    let mut v = MembershipView::new();
    for (i, n) in names.iter().enumerate() {
        v.add(Member::new(node(n), i as u64).with_status(MemberStatus::Up)).unwrap();
    }
    v
}

pub fn config(shards: u32) -> CoordinatorConfig {
    let mut c = CoordinatorConfig::new(shards);
    c.hand_off_timeout_ms = 1_000;
    c.resend_interval_ms = 100;
    c.rebalance_interval_ms = 10_000;
    c
}

/// A coordinator of term 1 on "a", with every member of `names` registered (no shards hosted).
pub fn coordinator(shards: u32, names: &[&str]) -> CoordinatorEngine {
    coordinator_with(shards, names, None)
}

/// A coordinator of `term` on "a" that has just started: recovering, nobody registered yet.
pub fn recovering(shards: u32, names: &[&str], term: u64, stored: Option<ShardMap>) -> CoordinatorEngine {
    CoordinatorEngine::new(config(shards), node("a"), term, Box::new(LeastShards::unlimited()), view(names), stored, 0)
        .unwrap()
}

pub fn coordinator_with(shards: u32, names: &[&str], stored: Option<ShardMap>) -> CoordinatorEngine {
    let mut c = recovering(shards, names, 1, stored);
    for n in names {
        c.handle_register(0, &node(n), 1, &[], true);
    }
    c
}

pub fn drain(c: &mut CoordinatorEngine) -> Vec<CoordinatorCommand> {
    c.drain_commands().collect()
}

pub fn region(me: &str, shards: u32) -> RegionEngine<u32> {
    let mut cfg = RegionConfig::new(shards);
    cfg.max_buffered = 4;
    cfg.retry_initial_ms = 10;
    cfg.retry_max_ms = 80;
    RegionEngine::new(cfg, node(me))
}

pub fn rdrain(r: &mut RegionEngine<u32>) -> Vec<RegionCommand<u32>> {
    r.drain_commands().collect()
}
