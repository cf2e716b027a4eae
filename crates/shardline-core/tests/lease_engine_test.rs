//! The lease engine's decisions, one store answer at a time: renewal and self-fencing, elections
//! with terms, members gone, answers that come late or not at all.

use shardline_core::lease::{
    LeaderRecord, LeaseCommand, LeaseConfig, LeaseEngine, LeaseEvent, LeaseKeys, MemberRecord, StoreAnswer, StoreOp,
    StoreValue, StoredEntry,
};
use shardline_core::Engine;
use shardline_core::{MemberStatus, NodeId};

const TTL: u64 = 3_000;
const MARGIN: u64 = 600;

fn record(name: &str, inc: u64) -> MemberRecord {
    MemberRecord::up(NodeId::new(name, inc), format!("127.0.0.1:{}", 7000 + inc), "1")
}

fn engine(now: u64) -> LeaseEngine {
    let config = LeaseConfig { ttl_ms: TTL, safety_margin_ms: MARGIN, ..LeaseConfig::default() };
    LeaseEngine::new(config, LeaseKeys::new("c", "a"), record("a", 1), now).unwrap()
}

/// The commands so far, and the store operation among them (at most one is in flight).
fn drain(e: &mut LeaseEngine) -> (Vec<LeaseCommand>, Option<(u64, StoreOp)>) {
    let cmds: Vec<LeaseCommand> = e.drain_commands().collect();
    let op = cmds.iter().rev().find_map(|c| match c {
        LeaseCommand::Store { id, op } => Some((*id, op.clone())),
        _ => None,
    });
    (cmds, op)
}

fn entry(key: &str, value: StoreValue, revision: u64) -> StoredEntry {
    StoredEntry { key: key.into(), value: Ok(value), revision }
}

/// Runs the engine (time passes, every other operation fails) until it sends an operation that
/// `wanted` picks; returns it and the time.
fn until_op(e: &mut LeaseEngine, mut now: u64, wanted: impl Fn(&StoreOp) -> bool) -> (u64, StoreOp, u64) {
    loop {
        if let (_, Some((id, op))) = drain(e) {
            if wanted(&op) {
                return (id, op, now);
            }
            e.handle_answer(now, id, StoreAnswer::Failed("busy".into()));
            continue;
        }
        now = e.poll_timeout().expect("the engine has something to do");
        e.handle_timeout(now);
    }
}

fn reads_member_key(op: &StoreOp) -> bool {
    matches!(op, StoreOp::Get { key, .. } if key == "c/members/a")
}

/// Creates the member key at `now` (answered at once) and returns the engine's next operation.
fn joined(e: &mut LeaseEngine, now: u64) -> (u64, StoreOp) {
    let (_, op) = drain(e);
    let (id, op) = op.unwrap();
    assert!(matches!(op, StoreOp::CreateEphemeral { ref key, .. } if key == "c/members/a"), "{op:?}");
    e.handle_answer(now, id, StoreAnswer::Written(Some(10)));
    drain(e).1.unwrap()
}

#[test]
fn a_renewal_extends_hosting_from_its_start_and_a_silent_store_fences() {
    let mut e = engine(0);
    let (id, _) = drain(&mut e).1.unwrap();
    e.handle_answer(40, id, StoreAnswer::Written(Some(10)));
    let (cmds, _) = drain(&mut e);
    assert!(cmds.contains(&LeaseCommand::ExtendHosting { until: TTL - MARGIN }), "counted from the request: {cmds:?}");
    // The store never answers again: at the deadline the node stops hosting, whatever is in flight.
    let mut now = 40;
    let mut fenced = false;
    while let Some(at) = e.poll_timeout() {
        if at > TTL * 2 {
            break;
        }
        now = at;
        e.handle_timeout(now);
        let (cmds, _) = drain(&mut e);
        if cmds.contains(&LeaseCommand::RevokeHosting) {
            fenced = true;
            assert!(cmds.iter().any(|c| matches!(c, LeaseCommand::Log(LeaseEvent::Fenced { .. }))));
            break;
        }
    }
    assert!(fenced, "never fenced");
    assert_eq!(now, TTL - MARGIN, "fenced exactly at the deadline");
    let me = NodeId::new("a", 1);
    assert_eq!(e.view(now).view.get(&me).map(|m| m.status), Some(MemberStatus::Down));
}

#[test]
fn an_eligible_member_takes_the_next_term_then_the_leader_key() {
    let mut e = engine(0);
    let (id, op) = joined(&mut e, 5);
    assert!(matches!(op, StoreOp::Get { ref key, .. } if key == "c/leader"));
    e.handle_answer(6, id, StoreAnswer::Entry(None));
    let (id, op) = drain(&mut e).1.unwrap();
    assert!(matches!(op, StoreOp::Get { ref key, .. } if key == "c/term"));
    e.handle_answer(7, id, StoreAnswer::Entry(Some(entry("c/term", StoreValue::Term(4), 33))));
    let (id, op) = drain(&mut e).1.unwrap();
    assert_eq!(op, StoreOp::CompareAndPut { key: "c/term".into(), value: StoreValue::Term(5), revision: 33 });
    e.handle_answer(8, id, StoreAnswer::Written(Some(34)));
    let (id, op) = drain(&mut e).1.unwrap();
    let me = NodeId::new("a", 1);
    let claim = StoreValue::Leader(LeaderRecord { node: me.clone(), term: 5 });
    assert!(matches!(op, StoreOp::CreateEphemeral { ref key, ref value, .. } if key == "c/leader" && *value == claim));
    e.handle_answer(9, id, StoreAnswer::Written(Some(35)));
    let (cmds, _) = drain(&mut e);
    assert!(cmds.contains(&LeaseCommand::Log(LeaseEvent::Leads { term: 5 })));
    assert_eq!(e.view(9).leader, Some((me, 5)));
}

/// Terms go above the journal's fences whatever the counter says: a counter at 4 (or none,
/// a fresh store) with the journal fenced at 9,000 (a store replaced, a cluster that ran on
/// gossip) takes 9,001; a fence found above that later raises the next term again.
#[test]
fn terms_are_taken_above_the_term_floor_and_a_fence_found_above_it() {
    let config = LeaseConfig { ttl_ms: TTL, safety_margin_ms: MARGIN, term_floor: 9_000, ..LeaseConfig::default() };
    for counter in [None, Some(entry("c/term", StoreValue::Term(4), 33))] {
        let mut e = LeaseEngine::new(config.clone(), LeaseKeys::new("c", "a"), record("a", 1), 0).unwrap();
        let (id, _) = joined(&mut e, 5);
        e.handle_answer(6, id, StoreAnswer::Entry(None));
        let (id, _) = drain(&mut e).1.unwrap();
        let revision = counter.as_ref().map_or(0, |c| c.revision);
        e.handle_answer(7, id, StoreAnswer::Entry(counter));
        let (_, op) = drain(&mut e).1.unwrap();
        assert_eq!(op, StoreOp::CompareAndPut { key: "c/term".into(), value: StoreValue::Term(9_001), revision });
    }
    let mut e = LeaseEngine::new(config, LeaseKeys::new("c", "a"), record("a", 1), 0).unwrap();
    e.handle_fenced_above(1, 12_345);
    let (id, _) = joined(&mut e, 5);
    e.handle_answer(6, id, StoreAnswer::Entry(None));
    let (id, _) = drain(&mut e).1.unwrap();
    e.handle_answer(7, id, StoreAnswer::Entry(Some(entry("c/term", StoreValue::Term(9_001), 40))));
    let (_, op) = drain(&mut e).1.unwrap();
    assert_eq!(op, StoreOp::CompareAndPut { key: "c/term".into(), value: StoreValue::Term(12_346), revision: 40 });
}

/// Runs the engine against a store that takes every write and holds nothing else (the member
/// key reads back as this node's) until it sends an operation `wanted` picks.
fn served_until(e: &mut LeaseEngine, mut now: u64, wanted: impl Fn(&StoreOp) -> bool) -> (u64, StoreOp, u64) {
    let mut revision = 100;
    for _ in 0..10_000 {
        let Some((id, op)) = drain(e).1 else {
            now = e.poll_timeout().expect("the engine has something to do");
            e.handle_timeout(now);
            continue;
        };
        if wanted(&op) {
            return (id, op, now);
        }
        revision += 1;
        let answer = match op {
            StoreOp::Get { key, .. } if key == "c/members/a" => {
                StoreAnswer::Entry(Some(entry(&key, StoreValue::Member(record("a", 1)), revision)))
            }
            StoreOp::Get { .. } => StoreAnswer::Entry(None),
            StoreOp::List { .. } => StoreAnswer::Entries(Vec::new()),
            StoreOp::Delete { .. } => StoreAnswer::Deleted,
            _ => StoreAnswer::Written(Some(revision)),
        };
        e.handle_answer(now, id, answer);
    }
    panic!("the engine never sent the operation wanted");
}

/// A leader in a term below a fence found in the journal gives its key up at its next renewal,
/// and takes a term above the fence in the election that follows.
#[test]
fn a_leader_below_a_fence_found_in_the_journal_steps_down_and_is_elected_above_it() {
    let mut e = engine(0);
    let (id, _) = joined(&mut e, 5);
    e.handle_answer(6, id, StoreAnswer::Entry(None));
    let (id, _) = drain(&mut e).1.unwrap();
    e.handle_answer(7, id, StoreAnswer::Entry(Some(entry("c/term", StoreValue::Term(4), 33))));
    let (id, _) = drain(&mut e).1.unwrap();
    e.handle_answer(8, id, StoreAnswer::Written(Some(34)));
    let (id, _) = drain(&mut e).1.unwrap();
    e.handle_answer(9, id, StoreAnswer::Written(Some(35)));
    let me = NodeId::new("a", 1);
    assert_eq!(e.view(9).leader, Some((me.clone(), 5)));
    let leader_key =
        |op: &StoreOp| matches!(op, StoreOp::Delete { key, .. } | StoreOp::Refresh { key, .. } if key == "c/leader");
    // A fence at its own term is its own: it leads on.
    e.handle_fenced_above(10, 5);
    let (id, op, now) = served_until(&mut e, 10, leader_key);
    assert!(matches!(op, StoreOp::Refresh { .. }), "{op:?}");
    e.handle_answer(now, id, StoreAnswer::Written(Some(36)));
    assert_eq!(e.view(now).leader, Some((me, 5)));
    // A fence above it: at its next renewal it gives the key up.
    e.handle_fenced_above(now, 700);
    let (id, op, now) = served_until(&mut e, now, leader_key);
    assert_eq!(op, StoreOp::Delete { key: "c/leader".into(), revision: Some(36) }, "it gives the key up");
    assert_eq!(e.view(now).leader, None, "it no longer leads");
    e.handle_answer(now, id, StoreAnswer::Deleted);
    let (id, _, now) = served_until(&mut e, now, |op| matches!(op, StoreOp::Get { key, .. } if key == "c/term"));
    e.handle_answer(now, id, StoreAnswer::Entry(Some(entry("c/term", StoreValue::Term(5), 34))));
    let (_, op) = drain(&mut e).1.unwrap();
    assert_eq!(op, StoreOp::CompareAndPut { key: "c/term".into(), value: StoreValue::Term(701), revision: 34 });
}

#[test]
fn an_unreadable_term_counter_gives_no_leadership() {
    let mut e = engine(0);
    let (id, _) = joined(&mut e, 5);
    e.handle_answer(6, id, StoreAnswer::Entry(None));
    let (id, _) = drain(&mut e).1.unwrap();
    let garbage = StoredEntry { key: "c/term".into(), value: Err("trailing bytes".into()), revision: 3 };
    e.handle_answer(7, id, StoreAnswer::Entry(Some(garbage)));
    let (cmds, op) = drain(&mut e);
    assert!(cmds.iter().any(|c| matches!(c, LeaseCommand::Log(LeaseEvent::BadValue { key, .. }) if key == "c/term")));
    assert!(!matches!(op, Some((_, StoreOp::CompareAndPut { .. }))), "never term 1 again: {op:?}");
    assert_eq!(e.view(7).leader, None);
}

#[test]
fn a_member_missing_from_a_listing_is_confirmed_gone_before_it_is_down() {
    let mut e = engine(0);
    let (id, _) = joined(&mut e, 5);
    // Someone leads; the round ends; then the members are listed.
    let other = record("b", 2);
    e.handle_answer(
        6,
        id,
        StoreAnswer::Entry(Some(entry(
            "c/leader",
            StoreValue::Leader(LeaderRecord { node: other.node.clone(), term: 1 }),
            3,
        ))),
    );
    let mut now = 6;
    let (id, op) = loop {
        if let (_, Some(x)) = drain(&mut e) {
            break x;
        }
        now = e.poll_timeout().unwrap();
        e.handle_timeout(now);
    };
    assert!(matches!(op, StoreOp::List { .. }), "{op:?}");
    let both = vec![
        entry("c/members/a", StoreValue::Member(record("a", 1)), 10),
        entry("c/members/b", StoreValue::Member(other.clone()), 11),
    ];
    e.handle_answer(now, id, StoreAnswer::Entries(both));
    // Follow the round to the next listing, then leave b out of it.
    let (id, op) = drain(&mut e).1.unwrap();
    assert!(matches!(op, StoreOp::Get { ref key, .. } if key == "c/leader"));
    e.handle_answer(now, id, StoreAnswer::Entry(None));
    let mut listing = None;
    while listing.is_none() {
        if let (_, Some((id, op))) = drain(&mut e) {
            match op {
                StoreOp::List { .. } => listing = Some(id),
                _ => e.handle_answer(now, id, StoreAnswer::Failed("busy".into())),
            }
            continue;
        }
        now = e.poll_timeout().unwrap();
        e.handle_timeout(now);
    }
    e.handle_answer(
        now,
        listing.unwrap(),
        StoreAnswer::Entries(vec![entry("c/members/a", StoreValue::Member(record("a", 1)), 10)]),
    );
    assert_eq!(
        e.view(now).view.get(&other.node).map(|m| m.status),
        Some(MemberStatus::Up),
        "not down on a listing alone"
    );
    let (id, op) = drain(&mut e).1.unwrap();
    assert!(matches!(op, StoreOp::Get { ref key, .. } if key == "c/members/b"), "confirmed with a read: {op:?}");
    e.handle_answer(now, id, StoreAnswer::Entry(None));
    assert_eq!(e.view(now).view.get(&other.node).map(|m| m.status), Some(MemberStatus::Down));
}

#[test]
fn a_late_answer_is_ignored_and_an_uncertain_create_is_read_back() {
    let mut e = engine(0);
    let (first, _) = drain(&mut e).1.unwrap();
    // No answer within a sixth of the TTL: abandoned, and the next renewal reads the key.
    let (id, op, now) = until_op(&mut e, 0, |op| reads_member_key(op) || matches!(op, StoreOp::CreateEphemeral { .. }));
    assert!(reads_member_key(&op), "read, not created again: {op:?}");
    // The first create's answer arrives now: too late, ignored.
    e.handle_answer(now, first, StoreAnswer::Written(Some(10)));
    assert!(!drain(&mut e).0.iter().any(|c| matches!(c, LeaseCommand::ExtendHosting { .. })));
    // The key holds this node's record: the create went through after it was sent at 0.
    e.handle_answer(now, id, StoreAnswer::Entry(Some(entry("c/members/a", StoreValue::Member(record("a", 1)), 10))));
    let (cmds, op) = drain(&mut e);
    assert!(cmds.contains(&LeaseCommand::ExtendHosting { until: TTL - MARGIN }), "{cmds:?}");
    assert!(matches!(op, Some((_, StoreOp::Refresh { revision: 10, .. }))), "refreshed at once: {op:?}");
}

#[test]
fn an_uncertain_create_whose_key_is_gone_starts_a_new_incarnation() {
    let mut e = engine(0);
    let (id, _) = drain(&mut e).1.unwrap();
    e.handle_answer(3, id, StoreAnswer::Failed("connection reset".into()));
    let (id, op, now) = until_op(&mut e, 3, |op| reads_member_key(op) || matches!(op, StoreOp::CreateEphemeral { .. }));
    assert!(reads_member_key(&op), "read, not created again: {op:?}");
    // Gone: it may have been this node's and expired unseen by it, but not by others.
    e.handle_answer(now, id, StoreAnswer::Entry(None));
    assert!(drain(&mut e).0.contains(&LeaseCommand::RevokeHosting));
    assert!(e.is_fenced());
}

/// A claim of the leader key whose answer never came may have taken: the key was created after
/// the claim was sent, so a read that finds this node's record with the claim's term lets it
/// lead, counted from the claim's send time. Letting such a key expire every time left a cluster
/// without a leader for good when its store answered slower than the election's steps allow.
#[test]
fn a_claim_whose_answer_was_lost_leads_from_its_send_time_once_read_back() {
    let mut e = engine(0);
    let (id, _) = joined(&mut e, 5);
    e.handle_answer(6, id, StoreAnswer::Entry(None));
    let (id, _) = drain(&mut e).1.unwrap();
    e.handle_answer(7, id, StoreAnswer::Entry(None));
    let (id, _) = drain(&mut e).1.unwrap();
    e.handle_answer(8, id, StoreAnswer::Written(Some(34)));
    let (claim, op) = drain(&mut e).1.unwrap();
    assert!(matches!(op, StoreOp::CreateEphemeral { ref key, .. } if key == "c/leader"), "{op:?}");
    // No answer: the claim is abandoned at the next renewal, which goes through.
    let now = e.poll_timeout().unwrap();
    e.handle_timeout(now);
    let (id, op) = drain(&mut e).1.unwrap();
    assert!(matches!(op, StoreOp::Refresh { ref key, .. } if key == "c/members/a"), "{op:?}");
    e.handle_answer(now, id, StoreAnswer::Written(Some(36)));
    // The claim's answer, too late: ignored.
    e.handle_answer(now, claim, StoreAnswer::Written(Some(35)));
    let (id, op) = drain(&mut e).1.unwrap();
    assert!(matches!(op, StoreOp::Get { ref key, .. } if key == "c/leader"), "{op:?}");
    let me = NodeId::new("a", 1);
    let mine = LeaderRecord { node: me.clone(), term: 1 };
    e.handle_answer(now, id, StoreAnswer::Entry(Some(entry("c/leader", StoreValue::Leader(mine.clone()), 35))));
    let (cmds, _) = drain(&mut e);
    assert!(cmds.contains(&LeaseCommand::Log(LeaseEvent::Leads { term: 1 })), "{cmds:?}");
    assert_eq!(e.view(now).leader, Some((me, 1)));
    // Led from the claim's send time (8): renewed by its revision, given up unless renewed by then.
    assert!(e.poll_timeout().is_some_and(|t| t <= 8 + TTL - MARGIN));
    // The next round refreshes it by the revision read.
    let mut now = now;
    let op = loop {
        match drain(&mut e).1 {
            Some((id, StoreOp::Refresh { key, revision, .. })) if key == "c/members/a" => {
                e.handle_answer(now, id, StoreAnswer::Written(Some(revision + 1)))
            }
            Some((_, op)) => break op,
            None => {
                now = e.poll_timeout().unwrap();
                e.handle_timeout(now);
            }
        }
    };
    assert_eq!(
        op,
        StoreOp::Refresh { key: "c/leader".into(), value: StoreValue::Leader(mine), revision: 35, ttl_ms: TTL }
    );
}

/// A key of this node with another term (an older claim of this incarnation) is still let
/// expire: its age is unknown.
#[test]
fn a_leader_key_of_this_node_with_an_unknown_age_is_let_expire() {
    let mut e = engine(0);
    let (id, _) = joined(&mut e, 5);
    let me = NodeId::new("a", 1);
    let old = LeaderRecord { node: me, term: 3 };
    e.handle_answer(6, id, StoreAnswer::Entry(Some(entry("c/leader", StoreValue::Leader(old), 20))));
    let (cmds, _) = drain(&mut e);
    assert!(!cmds.iter().any(|c| matches!(c, LeaseCommand::Log(LeaseEvent::Leads { .. }))), "{cmds:?}");
    assert_eq!(e.view(6).leader, None);
}

#[test]
fn exit_deletes_the_member_key_and_renews_nothing_more() {
    let mut e = engine(0);
    let (id, _) = joined(&mut e, 5);
    e.handle_exit(6);
    assert!(e.is_fenced() && e.is_exiting());
    // The operation in flight is no longer wanted: the exit's delete replaces it.
    e.handle_answer(7, id, StoreAnswer::Entry(None));
    let (_, op) = drain(&mut e);
    let (id, op) = op.expect("the exit deletes its keys");
    assert_eq!(op, StoreOp::Delete { key: "c/members/a".into(), revision: Some(10) });
    e.handle_answer(8, id, StoreAnswer::Deleted);
    // It held no leader key and no slot: nothing more to delete, and nothing is renewed.
    assert!(drain(&mut e).1.is_none());
    assert!(!e.is_exiting());
    let later = e.poll_timeout().unwrap_or(100_000).max(100_000);
    e.handle_timeout(later);
    assert!(drain(&mut e).1.is_none(), "an exited node writes nothing more");
    e.handle_leave(later + 1);
    assert!(drain(&mut e).1.is_none(), "nor does leaving after the exit");
}

#[test]
fn leave_writes_the_member_record_as_leaving_at_once() {
    let mut e = engine(0);
    let (id, _) = joined(&mut e, 5);
    e.handle_answer(6, id, StoreAnswer::Failed("busy".into()));
    drain(&mut e);
    e.handle_leave(7);
    let (_, op, _) = until_op(&mut e, 7, |op| matches!(op, StoreOp::Refresh { .. }));
    let StoreOp::Refresh { key, value, .. } = op else { unreachable!() };
    assert_eq!(key, "c/members/a");
    assert!(
        matches!(value, StoreValue::Member(ref m) if m.status == MemberStatus::Leaving),
        "the renewal says Leaving: {value:?}"
    );
}
