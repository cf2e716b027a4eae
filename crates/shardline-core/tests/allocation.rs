//! Properties of every allocation strategy.

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;
use shardline_core::{
    AllocationStrategy, ConsistentHash, External, LeastShards, Member, MemberStatus, NodeId, Plan, PlanProblem, Ranges,
    RoundLimit, ShardId, ShardMap, VersionAware,
};

fn host(i: usize) -> Member {
    Member::new(NodeId::new(format!("n{i}"), 1), i as u64).with_status(MemberStatus::Up)
}

fn hosts(n: usize) -> Vec<Member> {
    (0..n).map(host).collect()
}

/// A map whose shards sit on hosts, on ghosts (nodes that may not host), or nowhere.
fn arb_case() -> impl Strategy<Value = (Vec<Member>, ShardMap)> {
    (1usize..10, 1u32..200).prop_flat_map(|(n, s)| {
        proptest::collection::vec(0usize..(n + 3), s as usize).prop_map(move |owners| {
            let hs = hosts(n);
            let mut map = ShardMap::new(s).unwrap();
            for (i, o) in owners.into_iter().enumerate() {
                if o < n {
                    map.assign(ShardId(i as u32), hs[o].node.clone(), 1).unwrap();
                } else if o == n {
                    map.assign(ShardId(i as u32), NodeId::new("ghost", 1), 1).unwrap();
                }
            }
            (hs, map)
        })
    })
}

fn apply(map: &mut ShardMap, plan: &Plan) {
    for m in &plan.moves {
        map.assign(m.shard, m.to.clone(), 2).unwrap();
    }
}

fn counts(hosts: &[Member], map: &ShardMap) -> Vec<usize> {
    let c = map.counts();
    hosts.iter().map(|h| c.get(&h.node).copied().unwrap_or(0)).collect()
}

fn check_common(hosts: &[Member], map: &ShardMap, plan: &Plan) -> Result<(), TestCaseError> {
    let names: HashSet<&NodeId> = hosts.iter().map(|h| &h.node).collect();
    let mut seen = HashSet::new();
    for m in &plan.moves {
        prop_assert!(names.contains(&m.to), "move to a non-host");
        prop_assert!(seen.insert(m.shard), "shard moved twice in one plan");
        prop_assert_eq!(map.owner(m.shard), m.from.as_ref());
    }
    let mut after = map.clone();
    apply(&mut after, plan);
    for (s, slot) in after.iter() {
        prop_assert!(slot.owner.as_ref().is_some_and(|o| names.contains(o)), "{} left without a host", s);
    }
    Ok(())
}

/// Fewest moves to reach max − min ≤ 1: orphans plus the excess over the best targets.
fn minimum_moves(hosts: &[Member], map: &ShardMap) -> usize {
    let mut c = counts(hosts, map);
    let orphans = map.num_shards() as usize - c.iter().sum::<usize>();
    c.sort_unstable_by(|a, b| b.cmp(a));
    let (q, r) = (map.num_shards() as usize / c.len(), map.num_shards() as usize % c.len());
    orphans + c.iter().enumerate().map(|(i, &x)| x.saturating_sub(q + usize::from(i < r))).sum::<usize>()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn least_shards_converges_with_fewest_moves((hs, map) in arb_case(), abs in 0usize..20, rel in 0.01f64..1.0) {
        let strategy = LeastShards::with_limit(RoundLimit { absolute: abs, relative: rel });
        let expected = minimum_moves(&hs, &map);
        let mut map = map;
        let mut moves = 0;
        for round in 0.. {
            prop_assert!(round <= map.num_shards() as usize + 1, "did not converge");
            let plan = strategy.plan(&hs, &map);
            if plan.is_empty() {
                break;
            }
            check_common(&hs, &map, &plan)?;
            moves += plan.moves.len();
            apply(&mut map, &plan);
        }
        let c = counts(&hs, &map);
        prop_assert!(c.iter().max().unwrap() - c.iter().min().unwrap() <= 1, "unbalanced {:?}", c);
        prop_assert_eq!(moves, expected);
    }

    #[test]
    fn version_aware_converges_to_its_rule((hs, map) in arb_case()) {
        let mut map = map;
        let mut moved: HashMap<ShardId, usize> = HashMap::new();
        for round in 0.. {
            prop_assert!(round <= map.num_shards() as usize + 1, "did not converge");
            let plan = VersionAware::unlimited().plan(&hs, &map);
            if plan.is_empty() {
                break;
            }
            check_common(&hs, &map, &plan)?;
            for m in &plan.moves {
                *moved.entry(m.shard).or_default() += 1;
            }
            apply(&mut map, &plan);
        }
        // Converged: no host above the average by a whole shard has two more than the least.
        let c = counts(&hs, &map);
        let avg = f64::from(map.num_shards()) / hs.len() as f64;
        let min = *c.iter().min().unwrap();
        for &x in &c {
            if x as f64 - avg >= 1.0 {
                prop_assert!(x - min <= 1, "counts {:?} avg {}", c, avg);
            }
        }
        prop_assert!(moved.values().all(|&n| n == 1), "a shard moved more than once");
    }

    #[test]
    fn version_aware_places_on_newest_and_waits_while_mixed((hs, map) in arb_case(), newest in 0usize..10) {
        let hs: Vec<Member> = hs
            .into_iter()
            .enumerate()
            .map(|(i, m)| m.with_version(if i == newest % 10 { "2.0" } else { "1.0" }))
            .collect();
        let mixed = hs.iter().any(|m| m.app_version != hs[0].app_version);
        let plan = VersionAware::unlimited().plan(&hs, &map);
        check_common(&hs, &map, &plan)?;
        let max = hs.iter().map(|m| m.app_version.clone()).max().unwrap();
        for m in &plan.moves {
            let to = hs.iter().find(|h| h.node == m.to).unwrap();
            prop_assert_eq!(&to.app_version, &max);
            if mixed {
                let orphan = m.from.as_ref().is_none_or(|f| !hs.iter().any(|h| &h.node == f));
                prop_assert!(orphan, "rebalanced while versions are mixed");
            }
        }
    }

    #[test]
    fn ranges_are_contiguous_balanced_and_stable((hs, map) in arb_case(), rot in 0usize..10) {
        let plan = Ranges::default().plan(&hs, &map);
        check_common(&hs, &map, &plan)?;
        let mut after = map.clone();
        apply(&mut after, &plan);
        prop_assert!(Ranges::default().plan(&hs, &after).is_empty(), "not stable");
        let mut rotated = hs.clone();
        rotated.rotate_left(rot % hs.len());
        prop_assert!(Ranges::default().plan(&rotated, &after).is_empty(), "depends on the order hosts are given in");
        // Each host owns one contiguous run, of ⌊S/n⌋ or ⌈S/n⌉ shards.
        let mut runs: BTreeMap<NodeId, (u32, u32, u32)> = BTreeMap::new();
        for (s, slot) in after.iter() {
            let o = slot.owner.clone().unwrap();
            let e = runs.entry(o).or_insert((s.0, s.0, 0));
            prop_assert!(e.2 == 0 || e.1 + 1 == s.0, "not contiguous");
            e.1 = s.0;
            e.2 += 1;
        }
        let sizes: Vec<u32> = runs.values().map(|r| r.2).collect();
        let s = map.num_shards();
        let n = hs.len() as u32;
        for size in sizes {
            prop_assert!(size == s / n || size == s.div_ceil(n));
        }
    }
}

proptest! {
    // The 1.3 bound is statistical (virtual nodes land at hashed points): a fixed seed keeps CI
    // deterministic while still covering 256 cluster shapes.
    #![proptest_config(ProptestConfig {
        cases: 256,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5EED_CA5E),
        ..ProptestConfig::default()
    })]

    #[test]
    fn consistent_hash_adding_a_member_moves_little((n, s) in (1usize..20, 256u32..2048)) {
        let ch = ConsistentHash::default();
        let before = hosts(n);
        let mut map = ShardMap::new(s).unwrap();
        let first = ch.plan(&before, &map);
        apply(&mut map, &first);
        let after = hosts(n + 1);
        let plan = ch.plan(&after, &map);
        check_common(&after, &map, &plan)?;
        let new = &after[n].node;
        for m in &plan.moves {
            prop_assert_eq!(&m.to, new, "moved between two unchanged members");
        }
        let bound = 1.3 * f64::from(s) / (n + 1) as f64;
        prop_assert!((plan.moves.len() as f64) <= bound, "{} moves > {}", plan.moves.len(), bound);
    }

    #[test]
    fn consistent_hash_removing_a_member_moves_only_its_shards((n, s, gone) in (2usize..20, 16u32..1024, 0usize..20)) {
        let ch = ConsistentHash::default();
        let before = hosts(n);
        let mut map = ShardMap::new(s).unwrap();
        let first = ch.plan(&before, &map);
        apply(&mut map, &first);
        let gone = &before[gone % n].node;
        let after: Vec<Member> = before.iter().filter(|m| &m.node != gone).cloned().collect();
        let plan = ch.plan(&after, &map);
        check_common(&after, &map, &plan)?;
        for m in &plan.moves {
            prop_assert_eq!(m.from.as_ref(), Some(gone));
        }
    }

}

#[test]
fn version_aware_follows_the_seed_example() {
    // Four pods, same version, shards 0..10 all on p0: the average is 2.5, so p0 offers
    // floor(10 − 2.5) = 7 of its shards (its highest: 3..=9); each goes to the pod with fewest.
    let hs = hosts(4);
    let mut map = ShardMap::new(10).unwrap();
    for s in 0..10 {
        map.assign(ShardId(s), hs[0].node.clone(), 1).unwrap();
    }
    let plan = VersionAware::unlimited().plan(&hs, &map);
    let moved: Vec<(u32, String)> = plan.moves.iter().map(|m| (m.shard.0, m.to.name.to_string())).collect();
    let expect = [(3, "n1"), (4, "n2"), (5, "n3"), (6, "n1"), (7, "n2"), (8, "n3"), (9, "n1")];
    assert_eq!(moved, expect.map(|(s, n)| (s, n.to_string())));
    apply(&mut map, &plan);
    assert_eq!(counts(&hs, &map), vec![3, 3, 2, 2]);
    assert!(VersionAware::unlimited().plan(&hs, &map).is_empty());
}

#[test]
fn version_aware_skips_moves_that_gain_one() {
    // p0 has 5, p1 has 3, p2 has 4 (average 4): p0 offers 1 shard; p1 has 2 fewer: it moves.
    // Then p0 = 4 and p1 = 4; nothing else is offered.
    let hs = hosts(3);
    let mut map = ShardMap::new(12).unwrap();
    for (s, o) in [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2].into_iter().enumerate() {
        map.assign(ShardId(s as u32), hs[o].node.clone(), 1).unwrap();
    }
    let plan = VersionAware::unlimited().plan(&hs, &map);
    assert_eq!(plan.moves.len(), 1);
    // p0 = 6, p1 = 5, p2 = 1 (average 4): p0 offers 2, p1 offers 1. After two moves to p2
    // (p0 = 4, p2 = 3), p1's shard would go to p2, which has only one fewer than p1... 5 vs 3:
    // it moves; a shard from 4 to 3 would not.
    let mut map = ShardMap::new(12).unwrap();
    for (s, o) in [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2].into_iter().enumerate() {
        map.assign(ShardId(s as u32), hs[o].node.clone(), 1).unwrap();
    }
    let plan = VersionAware::unlimited().plan(&hs, &map);
    apply(&mut map, &plan);
    assert_eq!(counts(&hs, &map), vec![4, 4, 4]);
    let mut one_apart = ShardMap::new(7).unwrap();
    for (s, o) in [0, 0, 0, 1, 1, 2, 2].into_iter().enumerate() {
        one_apart.assign(ShardId(s as u32), hs[o].node.clone(), 1).unwrap();
    }
    assert!(VersionAware::unlimited().plan(&hs, &one_apart).is_empty(), "3/2/2: no move gains more than one");
}

#[test]
fn rolling_update_moves_shards_to_new_version_only() {
    let old: Vec<Member> = hosts(3).into_iter().map(|m| m.with_version("1")).collect();
    let mut map = ShardMap::new(30).unwrap();
    let first = VersionAware::unlimited().plan(&old, &map);
    apply(&mut map, &first);
    // One old pod is replaced by a new-version pod: its shards are orphans and go to the new pod.
    let mut next = vec![old[0].clone(), old[1].clone(), host(9).with_version("2")];
    let plan = VersionAware::unlimited().plan(&next, &map);
    assert_eq!(plan.moves.len(), 10);
    assert!(plan.moves.iter().all(|m| m.to == next[2].node));
    apply(&mut map, &plan);
    // Mixed versions: no rebalance.
    assert!(VersionAware::unlimited().plan(&next, &map).is_empty());
    // All new: rebalance resumes.
    next = next.into_iter().map(|m| m.with_version("2")).collect();
    assert!(VersionAware::unlimited().plan(&next, &map).is_empty(), "already balanced 10/10/10");
}

#[test]
fn consistent_hash_respects_weights_and_is_deterministic() {
    let hs = vec![host(0).with_weight(1), host(1).with_weight(3)];
    let ch = ConsistentHash::default();
    let owners = ch.owners(&hs, 4096);
    let heavy = owners.iter().filter(|o| **o == hs[1].node).count();
    assert!((2700..3500).contains(&heavy), "weight 3 of 4 got {heavy} of 4096");
    let mut reversed = hs.clone();
    reversed.reverse();
    assert_eq!(ch.owners(&reversed, 4096), owners, "order of hosts must not matter");
    // A restarted node (same name, new incarnation) gets the same shards back.
    let restarted = vec![hs[0].clone(), Member { node: NodeId::new("n1", 2), ..hs[1].clone() }];
    let again = ch.owners(&restarted, 4096);
    assert!(again.iter().zip(&owners).all(|(a, b)| a.name == b.name));
}

#[test]
fn external_validates_and_applies() {
    let hs = hosts(2);
    let ext = External::new([(ShardId(0), "n1"), (ShardId(1), "n0"), (ShardId(5), "n0"), (ShardId(2), "nobody")]);
    let map = ShardMap::new(4).unwrap();
    let plan = ext.plan(&hs, &map);
    assert_eq!(plan.moves.len(), 2);
    assert!(plan.rejected.contains(&(ShardId(5), PlanProblem::OutOfRange)));
    assert!(plan.rejected.contains(&(ShardId(2), PlanProblem::NotAHost { node: "nobody".into() })));
    let mut after = map;
    apply(&mut after, &plan);
    assert!(ext.plan(&hs, &after).moves.is_empty());
    assert_eq!(after.owner(ShardId(3)), None, "unnamed shards are left alone");
}

#[test]
fn external_with_a_fallback_places_what_it_does_not_name() {
    let hs = hosts(2);
    let ext = External::new([(ShardId(0), "n1"), (ShardId(1), "n1"), (ShardId(2), "nobody")])
        .otherwise(LeastShards { limit: RoundLimit::UNLIMITED });
    let mut map = ShardMap::new(6).unwrap();
    for _ in 0..4 {
        let plan = ext.plan(&hs, &map);
        apply(&mut map, &plan);
    }
    assert!(orphans(&hs, &map).is_empty(), "every shard placed, the one named to nobody too");
    assert_eq!((map.owner(ShardId(0)), map.owner(ShardId(1))), (Some(&hs[1].node), Some(&hs[1].node)));
    // n1 dies: its named shards are placed elsewhere, not left homeless.
    let survivors = vec![hs[0].clone()];
    for _ in 0..4 {
        let plan = ext.plan(&survivors, &map);
        apply(&mut map, &plan);
    }
    assert!(orphans(&survivors, &map).is_empty());
    // The fallback never moves a shard the assignments rule: balancing alone would move one of
    // n1's three shards to n0, which holds none.
    let mut map = ShardMap::new(3).unwrap();
    for s in 0..3 {
        map.assign(ShardId(s), hs[1].node.clone(), 1).unwrap();
    }
    let balancing = LeastShards { limit: RoundLimit::UNLIMITED };
    assert!(!balancing.plan(&hs, &map).moves.is_empty(), "the fallback alone would move");
    let all_named = External::new((0..3).map(|s| (ShardId(s), "n1"))).otherwise(balancing);
    assert!(all_named.plan(&hs, &map).moves.is_empty(), "{:?}", all_named.plan(&hs, &map));
}

#[test]
fn no_hosts_no_moves() {
    let map = ShardMap::new(8).unwrap();
    let strategies: Vec<Box<dyn AllocationStrategy>> = vec![
        Box::new(LeastShards::default()),
        Box::new(VersionAware::default()),
        Box::new(ConsistentHash::default()),
        Box::new(Ranges::default()),
        Box::new(External::new([(ShardId(0), "n0")])),
        Box::new(External::new([(ShardId(0), "n0")]).otherwise(LeastShards::default())),
    ];
    for s in strategies {
        assert!(s.plan(&[], &map).moves.is_empty(), "{}", s.name());
    }
}

fn arb_limit() -> impl Strategy<Value = RoundLimit> {
    (0usize..12, 0.0f64..0.6).prop_map(|(absolute, relative)| RoundLimit { absolute, relative })
}

/// Shards whose owner is not one of the hosts (unallocated, or on a node that may not host).
fn orphans(hosts: &[Member], map: &ShardMap) -> Vec<ShardId> {
    map.iter()
        .filter(|(_, slot)| slot.owner.as_ref().is_none_or(|o| !hosts.iter().any(|h| &h.node == o)))
        .map(|(s, _)| s)
        .collect()
}

fn limited(limit: RoundLimit) -> Vec<Box<dyn AllocationStrategy>> {
    vec![
        Box::new(LeastShards::with_limit(limit)),
        Box::new(VersionAware { limit }),
        Box::new(ConsistentHash { limit, ..ConsistentHash::default() }),
        Box::new(Ranges { limit }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Every balancing strategy moves at most its round limit of shards that have a live owner,
    /// always places every orphan, and still gets where it is going, round after round.
    #[test]
    fn every_strategy_keeps_its_round_limit_and_converges((hs, map) in arb_case(), limit in arb_limit()) {
        let budget = limit.per_round(map.num_shards() as usize);
        let unlimited: Vec<Box<dyn AllocationStrategy>> = vec![
            Box::new(LeastShards::unlimited()),
            Box::new(VersionAware::unlimited()),
            Box::new(ConsistentHash::default()),
            Box::new(Ranges::default()),
        ];
        for (strategy, free) in limited(limit).into_iter().zip(unlimited) {
            let mut m = map.clone();
            for round in 0.. {
                prop_assert!(round <= m.num_shards() as usize + 1, "{} did not converge", strategy.name());
                let plan = strategy.plan(&hs, &m);
                if plan.is_empty() {
                    break;
                }
                check_common(&hs, &m, &plan)?;
                let lost = orphans(&hs, &m);
                let rebalanced = plan.moves.iter().filter(|mv| !lost.contains(&mv.shard)).count();
                prop_assert!(rebalanced <= budget, "{}: {} moves over a limit of {}", strategy.name(), rebalanced, budget);
                for s in &lost {
                    prop_assert!(plan.moves.iter().any(|mv| mv.shard == *s), "{}: orphan {} not placed", strategy.name(), s);
                }
                apply(&mut m, &plan);
            }
            // Where the unlimited strategy gets in one go (hash and ranges: the same owners).
            if matches!(strategy.name(), "consistent-hash" | "ranges") {
                let mut target = map.clone();
                apply(&mut target, &free.plan(&hs, &map));
                prop_assert_eq!(counts(&hs, &m), counts(&hs, &target));
            } else {
                prop_assert!(free.plan(&hs, &m).is_empty(), "{} stopped short of balance", strategy.name());
            }
        }
    }

    /// During a rolling update, `LeastShards` gives shards to newest-version hosts only and
    /// moves no shard away from a live host (Akka's rule).
    #[test]
    fn least_shards_prefers_the_newest_version_and_waits_while_mixed((hs, map) in arb_case(), newest in 0usize..10) {
        let hs: Vec<Member> = hs
            .into_iter()
            .enumerate()
            .map(|(i, m)| m.with_version(if i == newest % 10 { "1.10" } else { "1.9" }))
            .collect();
        let mixed = hs.iter().any(|m| m.app_version != hs[0].app_version);
        let plan = LeastShards::unlimited().plan(&hs, &map);
        check_common(&hs, &map, &plan)?;
        let lost = orphans(&hs, &map);
        let max = hs.iter().map(|m| m.app_version.clone()).max().unwrap();
        if mixed {
            prop_assert_eq!(plan.moves.len(), lost.len(), "every orphan placed, nothing rebalanced");
            for mv in &plan.moves {
                let to = hs.iter().find(|h| h.node == mv.to).unwrap();
                prop_assert_eq!(&to.app_version, &max);
            }
        }
    }
}

fn on(hs: &[Member], owners: &[usize]) -> ShardMap {
    let mut map = ShardMap::new(owners.len() as u32).unwrap();
    for (s, &o) in owners.iter().enumerate() {
        map.assign(ShardId(s as u32), hs[o].node.clone(), 1).unwrap();
    }
    map
}

/// Akka's allocation spec: with versions 1, 1 and 2, a new shard goes to the version-2 region
/// even though it has the most shards; once every region runs version 2, rebalancing resumes.
#[test]
fn least_shards_gives_new_shards_to_the_newest_version_like_akka() {
    let hs = vec![host(0).with_version("1"), host(1).with_version("1"), host(2).with_version("2")];
    let mut map = on(&hs, &[0, 1, 2, 2, 2, 2]);
    map.unassign(ShardId(0)).unwrap();
    let plan = LeastShards::default().plan(&hs, &map);
    let to: Vec<&str> = plan.moves.iter().map(|m| &*m.to.name).collect();
    assert_eq!(to, ["n2"], "only the orphan moves, to the newest version");
    let all_new: Vec<Member> = hs.iter().map(|m| m.clone().with_version("2")).collect();
    let plan = LeastShards::unlimited().plan(&all_new, &map);
    assert!(plan.moves.iter().any(|m| m.from.as_ref() == Some(&hs[2].node)), "rebalances once versions agree");
}

/// Akka's limits: absolute 2 of 20 shards, relative 0.1 of 50 shards (5).
#[test]
fn least_shards_rebalance_limits_like_akka() {
    let hs = hosts(3);
    let map = on(&hs, &[0; 20]);
    let plan = LeastShards::with_limit(RoundLimit { absolute: 2, relative: 1.0 }).plan(&hs, &map);
    assert_eq!(plan.moves.len(), 2);
    let map = on(&hs, &[0; 50]);
    let plan = LeastShards::with_limit(RoundLimit { absolute: 0, relative: 0.1 }).plan(&hs, &map);
    assert_eq!(plan.moves.len(), 5);
}

/// Shardcake's case from the issue: 300 shards on 20 pods, scaled to 25. Unlimited, one round
/// starts every hand-off at once; with the default limit (a tenth: 30) the moves spread over
/// rounds, and the pods still end up balanced.
#[test]
fn version_aware_scaling_20_to_25_pods_is_spread_over_rounds() {
    let hs = hosts(25);
    let owners: Vec<usize> = (0..300).map(|s| s % 20).collect();
    let mut map = on(&hs, &owners);
    let all_at_once = VersionAware::unlimited().plan(&hs, &map).moves.len();
    assert!(all_at_once > 30, "the unlimited plan moves {all_at_once}");
    let strategy = VersionAware::default();
    let mut rounds = 0;
    loop {
        let plan = strategy.plan(&hs, &map);
        if plan.is_empty() {
            break;
        }
        assert!(plan.moves.len() <= 30, "round {rounds} moves {}", plan.moves.len());
        apply(&mut map, &plan);
        rounds += 1;
    }
    assert!(rounds >= 2);
    let c = counts(&hs, &map);
    assert!(c.iter().max().unwrap() - c.iter().min().unwrap() <= 1, "{c:?}");
}
