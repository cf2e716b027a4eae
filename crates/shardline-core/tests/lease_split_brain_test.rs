//! The lease engine's keep-alives and split-brain race, against a store that answers at once:
//! who is unreachable, who races when, what the winner writes, what a downed member does, and
//! when a new incarnation joins.

#[allow(dead_code)] // shared with the lease simulation
#[path = "sim_lease/store.rs"]
mod store;

use shardline_core::lease::{
    LeaderRecord, LeaseCommand, LeaseConfig, LeaseEngine, LeaseEvent, LeaseKeys, MemberRecord, PeerChecks,
    SplitBrainRecord, StoreAnswer, StoreOp, StoreValue,
};
use shardline_core::Engine;
use shardline_core::NodeId;
use store::{Store, Stored};

const TTL: u64 = 3_000;
const CHECKS: PeerChecks =
    PeerChecks { every_ms: 100, unreachable_after_ms: 400, stable_after_ms: 1_000, acquire_delay_ms: 500 };

fn id(name: &str) -> NodeId {
    NodeId::new(name, 1)
}

fn record(name: &str) -> MemberRecord {
    MemberRecord::up(id(name), format!("127.0.0.1:{}", 7000 + name.len()), "1")
}

/// Another member's key, alive for as long as the test runs.
fn hold(store: &mut Store, r: MemberRecord, revision: u64) {
    let key = format!("c/members/{}", r.node.name);
    store.keys.insert(key, Stored { value: StoreValue::Member(r), revision, expires: Some(u64::MAX) });
}

fn engine() -> LeaseEngine {
    let config =
        LeaseConfig { ttl_ms: TTL, safety_margin_ms: 600, split_brain: Some(CHECKS), ..LeaseConfig::default() };
    LeaseEngine::new(config, LeaseKeys::new("c", "a"), record("a"), 0).unwrap()
}

/// Runs `e` from `from` to `to`: the store answers every operation at once, and the members in
/// `answering` answer every keep-alive. Returns every command, with its time.
fn run(e: &mut LeaseEngine, store: &mut Store, from: u64, to: u64, answering: &[NodeId]) -> Vec<(u64, LeaseCommand)> {
    let mut now = from;
    let mut seen = Vec::new();
    loop {
        let cmds: Vec<LeaseCommand> = e.drain_commands().collect();
        if cmds.is_empty() {
            match e.poll_timeout() {
                Some(t) if t <= to => {
                    now = now.max(t);
                    e.handle_timeout(now);
                    continue;
                }
                _ => return seen,
            }
        }
        for c in cmds {
            seen.push((now, c.clone()));
            match c {
                LeaseCommand::Store { id, op } => {
                    let answer = store.apply(now, &op);
                    e.handle_answer(now, id, answer);
                }
                LeaseCommand::KeepAlive { to } => {
                    for (node, _) in to.iter().filter(|(n, _)| answering.contains(n)) {
                        e.handle_heard(now, node);
                    }
                }
                _ => {}
            }
        }
    }
}

/// Like [`run`], but the store answers each operation `latency` ms after it was sent (applying
/// it then), and fails every operation `fails` picks.
fn run_late(
    e: &mut LeaseEngine,
    store: &mut Store,
    (from, to): (u64, u64),
    answering: &[NodeId],
    latency: u64,
    fails: impl Fn(&StoreOp) -> bool,
) -> Vec<(u64, LeaseCommand)> {
    let mut now = from;
    let mut seen = Vec::new();
    let mut pending: Vec<(u64, u64, StoreOp)> = Vec::new();
    loop {
        for c in e.drain_commands().collect::<Vec<_>>() {
            seen.push((now, c.clone()));
            match c {
                LeaseCommand::Store { id, op } => pending.push((now + latency, id, op)),
                LeaseCommand::KeepAlive { to } => {
                    for (node, _) in to.iter().filter(|(n, _)| answering.contains(n)) {
                        e.handle_heard(now, node);
                    }
                }
                _ => {}
            }
        }
        let answer_at = pending.iter().map(|(at, ..)| *at).min();
        let Some(next) = [e.poll_timeout(), answer_at].into_iter().flatten().min().filter(|t| *t <= to) else {
            return seen;
        };
        now = now.max(next);
        if answer_at == Some(next) {
            let (_, id, op) = pending.remove(pending.iter().position(|(at, ..)| *at == next).unwrap_or(0));
            let answer = if fails(&op) { StoreAnswer::Failed("unavailable".into()) } else { store.apply(now, &op) };
            e.handle_answer(now, id, answer);
        } else {
            e.handle_timeout(now);
        }
    }
}

/// The leader key, held by `name` for `term` for as long as the test runs.
fn lead(store: &mut Store, name: &str, term: u64) {
    let value = StoreValue::Leader(LeaderRecord { node: id(name), term });
    store.keys.insert("c/leader".into(), Stored { value, revision: 90, expires: Some(u64::MAX) });
}

fn reads_leader(op: &StoreOp) -> bool {
    matches!(op, StoreOp::Get { key, .. } if key == "c/leader")
}

fn logged(cmds: &[(u64, LeaseCommand)], pick: impl Fn(&LeaseEvent) -> bool) -> Option<u64> {
    cmds.iter().find_map(|(t, c)| matches!(c, LeaseCommand::Log(e) if pick(e)).then_some(*t))
}

fn creates_member_key(cmds: &[(u64, LeaseCommand)]) -> bool {
    cmds.iter().any(|(_, c)| {
        matches!(c, LeaseCommand::Store { op: StoreOp::CreateEphemeral { key, .. }, .. } if key == "c/members/a")
    })
}

fn my_record(store: &Store) -> MemberRecord {
    match store.keys.get("c/members/a").map(|s| &s.value) {
        Some(StoreValue::Member(r)) => r.clone(),
        other => panic!("no member record for a: {other:?}"),
    }
}

#[test]
fn a_new_incarnation_joins_only_once_a_member_answers() {
    let mut store = Store::default();
    hold(&mut store, record("b"), 1);
    let mut e = engine();
    let cmds = run(&mut e, &mut store, 0, 2_000, &[]);
    assert!(!creates_member_key(&cmds), "joined a cluster it cannot reach");
    assert!(logged(&cmds, |e| *e == LeaseEvent::WaitingToReachAMember).is_some());
    assert!(cmds.iter().any(|(_, c)| matches!(c, LeaseCommand::KeepAlive { to } if to[0].0 == id("b"))));
    let cmds = run(&mut e, &mut store, 2_000, 3_000, &[id("b")]);
    assert!(creates_member_key(&cmds), "did not join once b answered");
    assert!(cmds.iter().any(|(_, c)| matches!(c, LeaseCommand::ExtendHosting { .. })));
}

/// A new incarnation's reads are not cut short by its next try to join, which is due at once or
/// a keep-alive period away: with a store slower than that, it never learnt who leads (and fell
/// back on "any member answered").
#[test]
fn a_new_incarnation_learns_who_leads_from_a_store_slower_than_a_keep_alive_period() {
    let mut store = Store::default();
    hold(&mut store, record("b"), 1);
    lead(&mut store, "b", 1);
    let mut e = engine();
    let latency = CHECKS.every_ms + 50;
    let cmds = run_late(&mut e, &mut store, (0, 2_000), &[], latency, |_| false);
    assert!(!creates_member_key(&cmds), "joined a cluster it cannot reach");
    assert_eq!(e.view(2_000).leader, Some((id("b"), 1)), "never learnt who leads");
}

/// Who leads must be known before a member's answer counts: the leader's side is the cluster,
/// and a member that answers may be on the other side of a cut from it.
#[test]
fn a_new_incarnation_that_cannot_read_who_leads_does_not_join_through_another_member() {
    let mut store = Store::default();
    hold(&mut store, record("b"), 1);
    hold(&mut store, record("c"), 2);
    lead(&mut store, "b", 1);
    let mut e = engine();
    // c answers, b (the leader) does not, and every read of the leader key fails.
    let cmds = run_late(&mut e, &mut store, (0, 2_000), &[id("c")], 5, reads_leader);
    assert!(!creates_member_key(&cmds), "joined through c without knowing who leads");
    // Once the leader key can be read, it waits for b.
    let cmds = run_late(&mut e, &mut store, (2_000, 4_000), &[id("c")], 5, |_| false);
    assert!(!creates_member_key(&cmds), "joined through c while b leads");
    let cmds = run_late(&mut e, &mut store, (4_000, 5_000), &[id("b"), id("c")], 5, |_| false);
    assert!(creates_member_key(&cmds), "did not join once the leader answered");
}

/// A member the winner of a split-brain race names is leaving: its answer does not let a new
/// incarnation join (it was on the named side, most likely with this node's previous one).
#[test]
fn a_new_incarnation_does_not_join_through_a_member_being_downed() {
    let mut store = Store::default();
    hold(&mut store, MemberRecord { downed: vec![id("c")], ..record("b") }, 1);
    hold(&mut store, record("c"), 2);
    let mut e = engine();
    // Nobody leads; only c, which b names, answers.
    let cmds = run_late(&mut e, &mut store, (0, 2_000), &[id("c")], 5, |_| false);
    assert!(!creates_member_key(&cmds), "joined through a member being downed");
    let cmds = run_late(&mut e, &mut store, (2_000, 3_000), &[id("b"), id("c")], 5, |_| false);
    assert!(creates_member_key(&cmds), "did not join once b answered");
}

#[test]
fn a_silent_member_is_unreachable_then_downed_by_the_majority() {
    let mut store = Store::default();
    hold(&mut store, record("b"), 1);
    hold(&mut store, record("c"), 2);
    let mut e = engine();
    let both = [id("b"), id("c")];
    run(&mut e, &mut store, 0, 1_000, &both);
    // c goes silent at 1 000.
    let cmds = run(&mut e, &mut store, 1_000, 4_000, &[id("b")]);
    let unreachable = logged(&cmds, |e| *e == LeaseEvent::Unreachable { node: id("c") }).expect("c unreachable");
    assert!(unreachable >= 1_000 + CHECKS.unreachable_after_ms, "unreachable too early: {unreachable}");
    let view = e.view(4_000).view;
    assert!(!view.is_reachable(&id("c")) && view.is_reachable(&id("b")), "{view:?}");
    let race = logged(&cmds, |e| matches!(e, LeaseEvent::SplitBrainRace { reachable: 2, unreachable: 1, delay_ms: 0 }))
        .expect("the majority races at once");
    assert!(race >= unreachable + CHECKS.stable_after_ms, "raced before the stable window: {race}");
    assert!(logged(&cmds, |e| *e == LeaseEvent::SplitBrainWon { downed: vec![id("c")] }).is_some());
    // The flag: a's own record names c, and the key says who won.
    assert_eq!(my_record(&store).downed, vec![id("c")]);
    let key = store.keys.get("c/split-brain").map(|s| s.value.clone());
    assert_eq!(key, Some(StoreValue::SplitBrain(SplitBrainRecord { winner: id("a"), downed: vec![id("c")] })));
    // c is gone (it read the flag and deleted its key): the key is released.
    store.keys.remove("c/members/c");
    run(&mut e, &mut store, 4_000, 6_000, &[id("b")]);
    assert!(!store.keys.contains_key("c/split-brain"), "the split-brain key outlived the members it downed");
    assert!(my_record(&store).downed.is_empty());
}

#[test]
fn a_member_named_by_the_winner_stops_hosting_then_deletes_its_keys() {
    let mut store = Store::default();
    hold(&mut store, record("b"), 1);
    let mut e = engine();
    run(&mut e, &mut store, 0, 1_000, &[id("b")]);
    assert!(store.keys.contains_key("c/members/a"));
    hold(&mut store, MemberRecord { downed: vec![id("a")], ..record("b") }, 50);
    let cmds = run(&mut e, &mut store, 1_000, 2_000, &[id("b")]);
    assert!(logged(&cmds, |e| *e == LeaseEvent::DownedBySplitBrain { by: id("b") }).is_some());
    let revoked = cmds.iter().position(|(_, c)| *c == LeaseCommand::RevokeHosting).expect("hosting revoked");
    let deleted = cmds
        .iter()
        .position(
            |(_, c)| matches!(c, LeaseCommand::Store { op: StoreOp::Delete { key, .. }, .. } if key == "c/members/a"),
        )
        .expect("member key deleted");
    assert!(revoked < deleted, "the key went before hosting stopped");
    assert!(!store.keys.contains_key("c/members/a"));
    assert!(e.is_fenced());
}

#[test]
fn the_minority_waits_longer_and_loses_to_a_key_already_held() {
    let mut store = Store::default();
    hold(&mut store, record("b"), 1);
    hold(&mut store, record("c"), 2);
    let mut e = engine();
    run(&mut e, &mut store, 0, 1_000, &[id("b"), id("c")]);
    // a hears nobody; b already won on the other side.
    let winner = SplitBrainRecord { winner: id("b"), downed: vec![id("a")] };
    store.keys.insert(
        "c/split-brain".into(),
        Stored { value: StoreValue::SplitBrain(winner), revision: 60, expires: Some(u64::MAX) },
    );
    let cmds = run(&mut e, &mut store, 1_000, 5_000, &[]);
    let delay = 2 * CHECKS.acquire_delay_ms;
    let race = logged(&cmds, |e| *e == LeaseEvent::SplitBrainRace { reachable: 1, unreachable: 2, delay_ms: delay });
    let lost = logged(&cmds, |e| *e == LeaseEvent::SplitBrainLost).expect("lost the race");
    assert!(lost >= race.expect("raced") + delay, "claimed before its delay: {lost}");
    assert!(logged(&cmds, |e| matches!(e, LeaseEvent::SplitBrainWon { .. })).is_none());
    assert!(my_record(&store).downed.is_empty(), "the loser flagged someone");
}

#[test]
fn a_failed_claim_is_tried_again_a_keep_alive_period_later_not_at_once() {
    let mut store = Store::default();
    hold(&mut store, record("b"), 1);
    hold(&mut store, record("c"), 2);
    let mut e = engine();
    let both = [id("b"), id("c")];
    run(&mut e, &mut store, 0, 1_000, &both);
    // c goes silent; every try for the split-brain key fails, 1 ms after it was sent (a store
    // that refuses at once). The race is due from about 2 400.
    let race_key = |op: &StoreOp| match op {
        StoreOp::CreateEphemeral { key, .. } | StoreOp::Get { key, .. } => key == "c/split-brain",
        _ => false,
    };
    let cmds = run_late(&mut e, &mut store, (1_000, 4_000), &[id("b")], 1, race_key);
    let claims: Vec<u64> = cmds
        .iter()
        .filter(|(_, c)| matches!(c, LeaseCommand::Store { op, .. } if race_key(op)))
        .map(|(t, _)| *t)
        .collect();
    assert!(!claims.is_empty(), "the majority never raced");
    let first = claims[0];
    // Once per keep-alive period at most (and the renewal's own tries), not once a millisecond.
    let allowed = (4_000 - first) / CHECKS.every_ms + 2;
    assert!(claims.len() as u64 <= allowed, "{} tries for the key in {} ms: {claims:?}", claims.len(), 4_000 - first);
}
