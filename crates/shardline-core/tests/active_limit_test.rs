//! `ActiveLimit`: the entities a node keeps in memory under a budget, and which leave.

use proptest::prelude::*;
use shardline_core::host::{
    ActiveLimit, AfterMarker, Delivery, Evicted, HostConfig, HostEngine, Mailbox, Marker, PassivationPolicy,
};
use shardline_core::{EntityId, Epoch};

/// Least-recently-used against a plain list kept in recency order: the same entities leave, the
/// one touched never does, and no more than the limit is ever in memory.
#[test]
fn least_recently_used_matches_a_recency_list() {
    proptest!(ProptestConfig::with_cases(256), |(max in 1usize..12, keys in proptest::collection::vec(0u8..24, 0..300))| {
        let mut limit = ActiveLimit::new(max, PassivationPolicy::LeastRecentlyUsed);
        let mut model: Vec<u8> = Vec::new(); // most recent last
        for k in keys {
            let out = limit.touch(k);
            model.retain(|m| *m != k);
            model.push(k);
            let expected: Vec<u8> = if model.len() > max { vec![model.remove(0)] } else { vec![] };
            prop_assert_eq!(&out, &expected);
            prop_assert!(!out.contains(&k));
            prop_assert_eq!(limit.len(), model.len());
            prop_assert!(limit.len() <= max);
        }
    });
}

/// Under frequency admission too, the limit holds and the entity touched stays; whatever is
/// removed is no longer counted, and what left is never counted twice.
#[test]
fn frequency_admission_keeps_within_the_limit() {
    proptest!(ProptestConfig::with_cases(256), |(max in 1usize..300, ops in proptest::collection::vec((0u16..600, any::<bool>()), 0..2_000))| {
        let mut limit = ActiveLimit::new(max, PassivationPolicy::FrequencyAdmission);
        let mut inside = std::collections::HashSet::new();
        for (k, remove) in ops {
            if remove && k % 7 == 0 {
                limit.remove(&k);
                inside.remove(&k);
                continue;
            }
            let out = limit.touch(k);
            inside.insert(k);
            prop_assert!(!out.contains(&k), "the entity touched left");
            for gone in &out {
                prop_assert!(inside.remove(gone), "{} left twice", gone);
                prop_assert!(!limit.contains(gone));
            }
            prop_assert_eq!(limit.len(), inside.len());
            prop_assert!(limit.len() <= max);
        }
    });
}

/// Hits on a hot set of 100 under a limit of 200, with a scan of distinct ids between every two
/// hot messages: the scan pushes the hot set out under least-recently-used, not under frequency
/// admission.
fn hot_hit_rate(policy: PassivationPolicy) -> f64 {
    let mut limit = ActiveLimit::new(200, policy);
    let (mut hot, mut hits) = (0u64, 0u64);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..200_000u64 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let key = if i % 2 == 0 {
            hot += 1;
            let k = rng % 100;
            hits += u64::from(limit.contains(&k));
            k
        } else {
            1_000 + i
        };
        limit.touch(key);
    }
    hits as f64 / hot as f64
}

#[test]
fn a_scan_of_one_hit_ids_does_not_push_the_hot_set_out_under_frequency_admission() {
    let (lru, admitted) =
        (hot_hit_rate(PassivationPolicy::LeastRecentlyUsed), hot_hit_rate(PassivationPolicy::FrequencyAdmission));
    assert!(admitted > 0.95, "frequency admission kept {admitted:.3} of the hot set's messages in memory");
    assert!(lru < 0.9, "least-recently-used kept {lru:.3}: the scan should push the hot set out");
}

#[test]
fn remove_where_forgets_a_stopped_shard() {
    let mut limit = ActiveLimit::new(10, PassivationPolicy::LeastRecentlyUsed);
    for k in [(1, "a"), (1, "b"), (2, "c")] {
        limit.touch(k);
    }
    limit.remove_where(|(shard, _)| *shard == 1);
    assert_eq!((limit.len(), limit.contains(&(2, "c")), limit.contains(&(1, "a"))), (1, true, false));
}

struct Open;

impl Mailbox for Open {
    fn free(&self) -> usize {
        5
    }
}

/// The engine's side: an idle entity picked to leave is taken out for its stop hook, a running
/// one stays, one not here needs nothing.
#[test]
fn evict_stops_the_idle_and_keeps_the_running() {
    let mut engine: HostEngine<String, Open> = HostEngine::new(HostConfig::new(4), Epoch { term: 1, seq: 1 });
    let (idle, running) = (EntityId::new("idle"), EntityId::new("running"));
    engine.restore(idle.clone(), "state".into(), 0);
    assert!(matches!(engine.deliver(&running, (), |_, m| m, || Open), Delivery::Spawn { .. }));
    assert_eq!(engine.evict(&idle), Evicted::Stop("state".to_string()));
    assert_eq!(engine.evict(&running), Evicted::Running);
    assert_eq!(engine.evict(&idle), Evicted::Gone);
    assert_eq!((engine.len(), engine.active_len()), (1, 1));
    // The running one leaves at its next marker instead of going idle...
    let after = engine.marker(&running, Marker::Nudge { busy: false }, false, "running".into(), 0);
    assert_eq!(after, AfterMarker::Evicted("running".to_string()));
    assert!(engine.is_empty());
    // ...unless a message comes for it first: it is in use again.
    assert!(matches!(engine.deliver(&running, (), |_, m| m, || Open), Delivery::Spawn { .. }));
    assert_eq!(engine.evict(&running), Evicted::Running);
    assert!(matches!(engine.deliver(&running, (), |_, m| m, || Open), Delivery::Put(())));
    let after = engine.marker(&running, Marker::Nudge { busy: false }, false, "running".into(), 0);
    assert_eq!(after, AfterMarker::Idle);
}
