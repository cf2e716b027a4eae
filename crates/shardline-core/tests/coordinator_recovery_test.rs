//! A new coordinator rebuilds the map from region reports and the stored map.

mod common;

use common::*;
use shardline_core::Engine;
use shardline_core::{CoordinatorCommand, DomainEvent, Epoch, ShardHome, ShardId, ShardMap};

#[test]
fn reports_rebuild_the_map_without_moving_anything() {
    let mut c = recovering(2, &["a", "b"], 7, None);
    drain(&mut c);
    let e = Epoch { term: 3, seq: 4 };
    c.handle_register(1, &node("a"), 7, &[(ShardId(0), e)], true);
    c.handle_register(1, &node("b"), 7, &[(ShardId(1), e)], true);
    assert!(!c.is_recovering());
    assert_eq!(c.shard_map().home(ShardId(0)), Some(ShardHome { owner: node("a"), epoch: e }));
    assert_eq!(c.shard_map().home(ShardId(1)), Some(ShardHome { owner: node("b"), epoch: e }));
    assert!(c.hand_offs_in_progress().next().is_none());
}

#[test]
fn stale_report_is_told_to_stop() {
    let mut c = coordinator(1, &["a", "b"]);
    drain(&mut c);
    let home = c.shard_map().home(ShardId(0)).unwrap();
    let other = if home.owner == node("a") { node("b") } else { node("a") };
    c.handle_register(5, &other, 1, &[(ShardId(0), Epoch { term: 0, seq: 1 })], true);
    let cmds = drain(&mut c);
    assert!(cmds.contains(&CoordinatorCommand::SendHandOff {
        to: other.clone(),
        shard: ShardId(0),
        epoch: Epoch { term: 0, seq: 1 }
    }));
    assert!(cmds.iter().any(|c| matches!(c, CoordinatorCommand::Emit(DomainEvent::StaleShardStopped { .. }))));
}

#[test]
fn stored_map_is_not_announced_before_its_owner_confirms() {
    let mut stored = ShardMap::new(2).unwrap();
    stored.assign(ShardId(0), node("b"), 1).unwrap();
    stored.assign(ShardId(1), node("b"), 1).unwrap();
    let mut c = recovering(2, &["a", "b"], 2, Some(stored));
    drain(&mut c);
    c.handle_register(1, &node("a"), 2, &[], true);
    let cmds = drain(&mut c);
    assert!(cmds.contains(&CoordinatorCommand::SendWelcome { to: node("a"), homes: vec![] }), "{cmds:?}");
    c.handle_get_shard_home(1, &node("a"), ShardId(0));
    assert!(drain(&mut c).is_empty(), "no answer from an unconfirmed stored entry");
    // b reports only shard 0: shard 1 was stopped, so it is reallocated with a newer epoch.
    c.handle_register(2, &node("b"), 2, &[(ShardId(0), Epoch { term: 1, seq: 1 })], true);
    assert!(!c.is_recovering());
    assert_eq!(c.shard_map().home(ShardId(0)).unwrap().epoch, Epoch { term: 1, seq: 1 });
    let s1 = c.shard_map().home(ShardId(1)).unwrap();
    assert_eq!(s1.epoch.term, 2, "a new allocation by the term-2 coordinator");
}

#[test]
fn silent_members_are_asked_again_while_recovering() {
    let mut c = recovering(2, &["a", "b"], 1, None);
    c.handle_register(0, &node("a"), 1, &[], true);
    drain(&mut c);
    assert!(c.poll_timeout().is_some());
    c.handle_timeout(100);
    assert!(drain(&mut c).contains(&CoordinatorCommand::RequestRegistration { to: vec![node("b")] }));
}

#[test]
fn recovery_does_not_wait_for_a_proxy() {
    use shardline_core::{LeastShards, Member, MemberStatus, PROXY_ROLE};
    let mut v = view(&["a", "b"]);
    v.add(Member::new(node("p"), 9).with_status(MemberStatus::Up).with_role(PROXY_ROLE)).unwrap();
    let mut c =
        shardline_core::CoordinatorEngine::new(config(2), node("a"), 1, Box::new(LeastShards::unlimited()), v, None, 0)
            .unwrap();
    c.handle_register(1, &node("a"), 1, &[], true);
    c.handle_register(1, &node("b"), 1, &[], true);
    // The proxy never registered (it may not even run this type): recovery is over anyway.
    assert!(!c.is_recovering());
    assert!(c.shard_map().iter().all(|(_, slot)| slot.owner.as_ref().is_some_and(|o| o != &node("p"))));
}

#[test]
fn homes_confirmed_after_a_welcome_are_announced_to_it() {
    let mut c = recovering(2, &["a", "b"], 2, None);
    drain(&mut c);
    // a registers first: nothing is confirmed yet, so its welcome is empty.
    c.handle_register(1, &node("a"), 2, &[], true);
    assert!(drain(&mut c).contains(&CoordinatorCommand::SendWelcome { to: node("a"), homes: vec![] }));
    let e = Epoch { term: 1, seq: 1 };
    c.handle_register(2, &node("b"), 2, &[(ShardId(0), e), (ShardId(1), e)], true);
    let told_a: Vec<ShardId> = drain(&mut c)
        .into_iter()
        .filter_map(|cmd| match cmd {
            CoordinatorCommand::AnnounceShardHomes { to, homes } if to.contains(&node("a")) => {
                Some(homes.into_iter().map(|(s, _)| s).collect::<Vec<_>>())
            }
            _ => None,
        })
        .flatten()
        .collect();
    assert!(told_a.contains(&ShardId(0)) && told_a.contains(&ShardId(1)), "a learns b's shards: {told_a:?}");
}

#[test]
fn a_stored_map_with_another_shard_count_is_ignored() {
    let mut stored = ShardMap::new(4).unwrap();
    stored.assign(ShardId(0), node("b"), 1).unwrap();
    let c = recovering(2, &["a", "b"], 2, Some(stored));
    assert_eq!(c.shard_map().num_shards(), 2);
    assert!(c.shard_map().iter().all(|(_, slot)| slot.owner.is_none()), "nothing taken from the old map");
}

/// An epoch at the end of its term's counter (a corrupt report or stored map: no real cluster
/// makes 2^64 allocations) has no successor: the shard is left unallocated rather than given
/// an epoch that would not fence the previous owner (before, the counter wrapped to 0, or
/// panicked).
#[test]
fn a_shard_whose_epoch_has_no_successor_is_not_reallocated_below_it() {
    let last = Epoch { term: 3, seq: u64::MAX };
    let mut c = recovering(1, &["a", "b"], 3, None);
    c.handle_register(1, &node("b"), 3, &[(ShardId(0), last)], true);
    c.handle_register(1, &node("a"), 3, &[], true);
    assert_eq!(c.shard_map().home(ShardId(0)), Some(ShardHome { owner: node("b"), epoch: last }));
    drain(&mut c);
    // b is down: its shard must go elsewhere, at an epoch above `last`, and there is none.
    c.handle_node_fenced(2, &node("b"));
    c.handle_timeout(20_000);
    let cmds = drain(&mut c);
    let announced: Vec<&ShardHome> = cmds
        .iter()
        .flat_map(|cmd| match cmd {
            CoordinatorCommand::AnnounceShardHomes { homes, .. } => homes.iter().map(|(_, h)| h).collect(),
            _ => Vec::new(),
        })
        .collect();
    assert!(announced.iter().all(|h| h.epoch > last), "{announced:?}");
    assert_eq!(c.shard_map().home(ShardId(0)), None, "taken from the downed owner, given to nobody");
    assert!(!cmds.iter().any(|c| matches!(c, CoordinatorCommand::Emit(DomainEvent::ShardAssigned { .. }))));
    let mut map = ShardMap::new(1).unwrap();
    map.raise_epoch(ShardId(0), last).unwrap();
    assert!(matches!(map.assign(ShardId(0), node("a"), 3), Err(shardline_core::MapError::EpochExhausted { .. })));
    assert_eq!(last.next(4), Some(Epoch { term: 4, seq: 1 }), "a newer term starts its own count");
}

/// Gossip shows a member whose status never reached this node as `Joining` (a restart that
/// joined one side of a partition sees the other side that way): it may host shards, so a
/// recovering coordinator allocates nothing until it reports, and then leaves its shards where
/// they are.
#[test]
fn a_recovering_coordinator_waits_for_a_member_it_knows_only_as_joining() {
    use shardline_core::{LeastShards, Member, MemberStatus};
    let mut v = view(&["a"]);
    v.add(Member::new(node("b"), 2).with_status(MemberStatus::Joining)).unwrap();
    let _ = v.set_reachable(&node("b"), false);
    let mut c =
        shardline_core::CoordinatorEngine::new(config(2), node("a"), 5, Box::new(LeastShards::unlimited()), v, None, 0)
            .unwrap();
    c.handle_register(1, &node("a"), 5, &[], true);
    assert!(c.is_recovering(), "b may host: its report is awaited");
    assert!(c.shard_map().iter().all(|(_, slot)| slot.owner.is_none()), "nothing allocated meanwhile");
    let e = Epoch { term: 3, seq: 1 };
    c.handle_register(2, &node("b"), 5, &[(ShardId(0), e), (ShardId(1), e)], true);
    assert!(!c.is_recovering());
    assert_eq!(c.shard_map().home(ShardId(0)), Some(ShardHome { owner: node("b"), epoch: e }));
}
