//! Until when a gossip member may host (`GossipEngine::hosting_until`): while a majority
//! answered what it sent within the window. A paused, cut-off or one-way-cut member stops before
//! the others take its shards over; the members that still reach a majority never stop.

mod gossip_net;

use gossip_net::{three_at_defaults, time_until_down, Net};
use shardline_core::gossip::{GossipConfig, GossipEvent};
use shardline_core::{MemberStatus, NodeId};

fn addr(name: &str) -> String {
    format!("{name}:7000")
}

/// Four members at the defaults, started (not yet run).
fn four_at_defaults() -> Net {
    let mut net = Net::new();
    net.start_with("a", 1, &[], GossipConfig::default());
    for (name, inc) in [("b", 2), ("c", 3), ("d", 4)] {
        net.start_with(name, inc, &["a"], GossipConfig::default());
    }
    net
}

fn may_host(net: &Net, name: &str) -> bool {
    net.nodes[&addr(name)].hosting_until().is_some_and(|until| net.now < until)
}

/// Runs until `name` may no longer host (checked every 50 ms), at most `limit` ms: how long it
/// took, and whether `others` could host at every check on the way.
fn time_until_stopped(net: &mut Net, name: &str, others: &[&str], limit: u64) -> Option<u64> {
    let start = net.now;
    while net.now < start + limit {
        let t = net.now + 50;
        net.run(t);
        for o in others {
            let e = &net.nodes[&addr(o)];
            assert!(
                may_host(net, o),
                "{o} stopped at {} while it reached a majority: until {:?}, {:?}, {:?}",
                net.now,
                e.hosting_until(),
                e.view(),
                net.events
            );
        }
        if !may_host(net, name) {
            return Some(net.now - start);
        }
    }
    None
}

#[test]
fn members_that_reach_each_other_host() {
    let mut net = three_at_defaults();
    for t in 0..40 {
        net.run(net.now + 250);
        for name in ["a", "b", "c"] {
            assert!(may_host(&net, name), "{name} may not host at {} (step {t})", net.now);
        }
    }
}

/// How long answers count for three members at the defaults: the 5 s window and a probe round
/// (3 × 1 s + 500 ms).
const BOUND_OF_THREE: u64 = 5_000 + 3_500;

/// Cut off from everyone, a member stops within the bound, long before the others show it down,
/// and downs itself (its resolver, or its lost majority, whichever decides first); they never
/// stop.
#[test]
fn a_member_cut_off_stops_before_the_others_take_over() {
    let mut net = three_at_defaults();
    net.isolated.insert(addr("c"));
    let cut_at = net.now;
    let stopped = time_until_stopped(&mut net, "c", &["a", "b"], 10_000);
    let Some(stopped) = stopped else { panic!("c still hosts 10 s after it was cut off") };
    assert!(stopped <= BOUND_OF_THREE + 200, "c stopped {stopped} ms after the cut, past the bound");
    // Its resolver, or its lost majority, whichever decides first.
    assert!(net.logged("c", &GossipEvent::DeclaredDown), "c downed itself: {:?}", net.events);
    let c = NodeId::new("c", 3);
    let down = time_until_down(&mut net, "a", &c, 40_000).map(|t| t + net.now - cut_at);
    assert!(down.is_some_and(|d| d > stopped), "a showed c down at {down:?}, c stopped at {stopped}");
    assert!(!may_host(&net, "c"));
}

/// One-way cuts, either way: a member whose probes are lost, or whose answers are, hears no
/// answer and stops, although it may still hear the others.
#[test]
fn a_member_cut_one_way_stops_either_way() {
    for outgoing in [true, false] {
        let mut net = three_at_defaults();
        for other in ["a", "b"] {
            let link = if outgoing { (addr("c"), addr(other)) } else { (addr(other), addr("c")) };
            net.cut.insert(link);
        }
        let stopped = time_until_stopped(&mut net, "c", &["a", "b"], 10_000);
        let within = stopped.is_some_and(|t| t <= BOUND_OF_THREE + 200);
        assert!(within, "outgoing cut {outgoing}: c stopped after {stopped:?}");
    }
}

/// A paused member is stopped by the clock: it may not host from the moment it wakes, the
/// others having downed it meanwhile, and it never hosts again as this incarnation.
#[test]
fn a_paused_member_may_not_host_when_it_wakes() {
    let mut net = three_at_defaults();
    let paused_at = net.now;
    net.silent.insert(addr("c"));
    let until = net.nodes[&addr("c")].hosting_until().unwrap_or(0);
    assert!(until > paused_at && until <= paused_at + BOUND_OF_THREE, "c hosts until {until}, paused at {paused_at}");
    let c_id = NodeId::new("c", 3);
    assert!(time_until_down(&mut net, "a", &c_id, 40_000).is_some(), "a downs the paused c");
    net.silent.remove(&addr("c"));
    assert!(!may_host(&net, "c"), "c woke at {} and may host until {until}", net.now);
    let declared = |net: &Net| net.logged("c", &GossipEvent::DeclaredDown);
    while !declared(&net) && net.now < paused_at + 60_000 {
        net.run(net.now + 10);
        assert!(!may_host(&net, "c"), "c hosts again at {} before it hears it was downed", net.now);
    }
    assert!(declared(&net), "c heard that it was downed: {:?}", net.events);
}

/// Answers that arrive 10 s late (a link that holds them up) keep no member hosting: with a's
/// and b's answers to c late and only d's on time, c has no majority of four (the tie rule
/// needs a, the lowest) within the bound, and its resolver finds a and b silent; it stops, and
/// the others host on. (Either rule stops it here; the engine credits an answer with the time
/// of its question, so that answers read after a pause extend nothing.)
#[test]
fn a_member_whose_answers_arrive_late_stops() {
    let mut net = four_at_defaults();
    net.run(10_000);
    assert!(may_host(&net, "c"));
    for other in ["a", "b"] {
        net.slow.insert((addr(other), addr("c")), 10_000);
    }
    let stopped = time_until_stopped(&mut net, "c", &["a", "b", "d"], 20_000);
    assert!(stopped.is_some(), "late answers let c host on: {:?}", net.events);
}

/// Four members split in halves: keep-majority's tie rule keeps the half with the lowest member,
/// and so does the bound: a and b host on, c and d stop within the window, and are downed.
#[test]
fn of_two_halves_the_one_with_the_lowest_member_hosts_on() {
    let mut net = four_at_defaults();
    net.run(8_000);
    for name in ["a", "b", "c", "d"] {
        assert!(may_host(&net, name), "{name} hosts before the split");
    }
    net.cut_both("a", &["c", "d"], true);
    net.cut_both("b", &["c", "d"], true);
    let stopped = time_until_stopped(&mut net, "c", &["a", "b"], 12_000);
    // Four members: the 5 s window and a round of 4.5 s.
    assert!(stopped.is_some_and(|t| t <= 9_700), "c stopped after {stopped:?}");
    assert!(!may_host(&net, "d"), "d stopped with c");
    for _ in 0..300 {
        net.run(net.now + 100);
        assert!(may_host(&net, "a") && may_host(&net, "b"), "the half with a stopped at {}", net.now);
    }
    let c = net.view("a").view.get(&NodeId::new("c", 3)).map(|m| m.status);
    assert_eq!(c, Some(MemberStatus::Down), "a downed c: {:?}", net.events);
}

/// Without a resolver nothing bounds hosting (the opt-out hosts on both sides of a partition).
#[test]
fn without_a_resolver_hosting_is_not_bounded() {
    let mut net = Net::new();
    net.start("a", 1, &[]);
    net.run(1_000);
    assert_eq!(net.nodes[&addr("a")].hosting_until(), None);
}

/// A member paused before it heard of any leader wakes to a cluster it never probed, which has
/// downed it meanwhile; what it reads first (written before it was downed) names the leader and
/// the only member it knew as down. It may not host: it has been a member for longer than the
/// bound, so every member it knows counts, and none has answered it. (Counting only members
/// known for the bound, it counted none, and was a majority of one.)
#[test]
fn a_member_paused_before_it_heard_of_a_leader_may_not_host_when_it_wakes() {
    let mut net = Net::new();
    net.start_with("a", 1, &[], GossipConfig::default());
    net.start_with("c", 3, &["a"], GossipConfig::default());
    // b cannot reach a yet: b and e join each other and form nothing.
    net.cut.insert((addr("b"), addr("a")));
    net.start_with("b", 2, &["a"], GossipConfig::default());
    net.start_with("e", 5, &["b"], GossipConfig::default());
    net.run(6_000);
    assert!(net.logged("e", &GossipEvent::Joined), "e joined b: {:?}", net.events);
    assert!(!may_host(&net, "e"), "e hosts in no formed cluster");
    // e stops; b reaches a, and a's cluster learns of e from b; then b crashes.
    net.paused.insert(addr("e"));
    net.cut.clear();
    let e = NodeId::new("e", 5);
    while net.view("a").view.get(&e).is_none() && net.now < 20_000 {
        net.run(net.now + 50);
    }
    assert!(net.view("a").view.get(&e).is_some(), "a learned of e from b: {:?}", net.events);
    net.crashed.insert(addr("b"));
    assert!(time_until_down(&mut net, "a", &e, 30_000).is_some(), "a downs the paused e: {:?}", net.events);
    net.wake("e");
    let woke = net.now;
    while net.now < woke + 5_000 {
        net.run(net.now + 1);
        let of_e: Vec<_> = net.events.iter().filter(|(a, _)| *a == addr("e")).collect();
        assert!(
            !may_host(&net, "e"),
            "e hosts at {} ({} ms after it woke): {:?} {of_e:?}",
            net.now,
            net.now - woke,
            net.view("e")
        );
    }
}
