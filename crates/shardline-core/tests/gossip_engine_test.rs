//! Gossip engines exchanging their messages directly: joining through a seed, a leader with a
//! term, a silent member suspected then down, a leave, data that cannot be read, and the
//! split-brain resolver and leader rule under one-way cuts, restarts and partitions.

mod gossip_net;

use gossip_net::{id, three_at_defaults, Net};
use shardline_core::gossip::{GossipCommand, GossipConfig, GossipEngine, GossipEvent};
use shardline_core::Engine;
use shardline_core::{MemberStatus, NodeId, SplitBrainPolicy};

#[test]
fn members_join_through_a_seed_and_agree_on_the_oldest_as_leader() {
    let mut net = Net::new();
    net.start("a", 1, &[]);
    net.start("b", 2, &["a"]);
    net.start("c", 3, &["a"]);
    net.run(5_000);
    for n in ["a", "b", "c"] {
        let v = net.view(n);
        let up: Vec<String> =
            v.view.members().filter(|m| m.status == MemberStatus::Up).map(|m| m.node.name.to_string()).collect();
        assert_eq!(up, ["a", "b", "c"], "{n} sees {v:?}");
        let (leader, term) = v.leader.clone().expect("a leader");
        assert_eq!(leader, NodeId::new("a", 1), "{n}");
        assert!(term >= 1);
    }
}

/// A member that joins is `Up` for everyone within a few messages of joining, not a gossip period
/// later: while it shows `Joining`, coordinators hold every rebalance, so the delay would add
/// itself to every scale-out.
#[test]
fn a_member_that_joins_is_up_everywhere_within_a_few_messages() {
    let mut net = three_at_defaults();
    net.start_with("d", 4, &["a"], GossipConfig::default());
    let start = net.now;
    let period = GossipConfig::default().gossip_every_ms;
    let up_everywhere = |net: &Net| {
        ["a", "b", "c", "d"]
            .iter()
            .all(|n| net.view(n).view.members().any(|m| &*m.node.name == "d" && m.status == MemberStatus::Up))
    };
    while !up_everywhere(&net) && net.now < start + 10 * period {
        let next = net.now + 1;
        net.run(next);
    }
    let took = net.now - start;
    assert!(up_everywhere(&net), "d is not up everywhere after {took} ms");
    // Each message takes 1 ms here: an announce, its answer, then the status gossiped to every
    // member. A periodic gossip would take up to a period.
    assert!(took < period / 4, "d was up everywhere only after {took} ms (gossip period {period} ms)");
}

#[test]
fn a_silent_member_is_suspected_then_down_and_the_next_oldest_leads_with_a_larger_term() {
    let mut net = Net::new();
    net.start("a", 1, &[]);
    net.start("b", 2, &["a"]);
    net.start("c", 3, &["a"]);
    net.run(5_000);
    let first = net.view("b").leader.unwrap().1;
    net.silent.insert("a:7000".into());
    let mut suspected = false;
    while net.now < 30_000 {
        let t = net.now + 100;
        net.run(t);
        let v = net.view("b");
        let a = NodeId::new("a", 1);
        if v.view.get(&a).is_some_and(|m| m.status != MemberStatus::Down) && !v.view.is_reachable(&a) {
            suspected = true;
        }
        if v.view.get(&a).is_some_and(|m| m.status == MemberStatus::Down) {
            break;
        }
    }
    assert!(suspected, "unreachable before down");
    let v = net.view("b");
    assert_eq!(v.view.get(&NodeId::new("a", 1)).map(|m| m.status), Some(MemberStatus::Down));
    let t = net.now + 3_000;
    net.run(t);
    for n in ["b", "c"] {
        let (leader, term) = net.view(n).leader.expect("a new leader");
        assert_eq!(leader, NodeId::new("b", 2), "{n}");
        assert!(term > first, "terms never repeat: {term} after {first}");
    }
}

/// A member that led a cluster of its own (a first seed restarted while cut off from the others,
/// with a member that restarted too and reached it) with a term above the others' merges with
/// them: it gives up, being younger, and the oldest member takes a term above it, since regions
/// follow the highest term they have seen. It takes one term, not a bidding war with the other
/// claimant.
#[test]
fn a_leader_outranked_by_a_merged_cluster_takes_a_term_above_it_once() {
    let mut net = Net::new();
    net.start("a", 1, &[]);
    net.start("b", 2, &["a"]);
    net.cut_both("c", &["a", "b"], true);
    net.cut_both("d", &["a", "b"], true);
    let high = 1 << 40;
    net.start_with("c", 3, &["c", "a"], GossipConfig { term_floor: high, ..GossipConfig::without_split_brain() });
    net.start_with("d", 4, &["c", "a"], GossipConfig { term_floor: high, ..GossipConfig::without_split_brain() });
    net.run(5_000);
    let (leader, term) = net.view("a").leader.expect("a leads");
    assert_eq!(leader, NodeId::new("a", 1));
    assert!(term < high);
    let (alone, high_term) = net.view("c").leader.expect("c leads alone");
    assert_eq!(alone, NodeId::new("c", 3));
    net.cut.clear();
    net.run(20_000);
    for n in ["a", "b", "c", "d"] {
        let (leader, term) = net.view(n).leader.unwrap_or_else(|| panic!("{n} sees no leader"));
        assert_eq!(leader, NodeId::new("a", 1), "{n}");
        assert!(term > high_term, "{n}: the leader's term {term} is above the merged one's {high_term}");
    }
    let leads = |n: &str| net.events.iter().filter(|(a, e)| a == n && matches!(e, GossipEvent::Leads { .. })).count();
    assert_eq!((leads("a:7000"), leads("c:7000"), leads("d:7000")), (2, 1, 0), "{:?}", net.events);
}

#[test]
fn a_leave_is_seen_by_the_others() {
    let mut net = Net::new();
    net.start("a", 1, &[]);
    net.start("b", 2, &["a"]);
    net.run(4_000);
    let now = net.now;
    net.nodes.get_mut("b:7000").unwrap().handle_leave(now);
    net.run(now + 2_000);
    assert_eq!(net.view("a").view.get(&NodeId::new("b", 2)).map(|m| m.status), Some(MemberStatus::Leaving));
}

#[test]
fn unreadable_data_is_reported_and_dropped() {
    let mut net = Net::new();
    net.start("a", 1, &[]);
    let e = net.nodes.get_mut("a:7000").unwrap();
    e.handle_data(1, &[0xff; 40]);
    assert!(e.drain_commands().any(|c| matches!(c, GossipCommand::Log(GossipEvent::BadData { .. }))));
}

/// A member that exits after its hand-offs says `Removed`, and the others see it removed: a
/// graceful leave is not a failure, on either side (being declared down would fence a node
/// that left cleanly and log that it was downed).
#[test]
fn an_exit_is_not_a_declaration_of_down() {
    let mut net = Net::new();
    net.start("a", 1, &[]);
    net.start("b", 2, &["a"]);
    net.run(4_000);
    let now = net.now;
    let b = net.nodes.get_mut("b:7000").unwrap();
    b.handle_leave(now);
    b.handle_exit(now);
    let me = NodeId::new("b", 2);
    assert_eq!(b.view().view.get(&me).map(|m| m.status), Some(MemberStatus::Removed));
    net.run(now + 3_000);
    assert!(!net.events.iter().any(|(n, e)| n == "b:7000" && *e == GossipEvent::DeclaredDown), "{:?}", net.events);
    assert_eq!(net.view("b").view.get(&me).map(|m| m.status), Some(MemberStatus::Removed));
    assert_eq!(net.view("a").view.get(&me).map(|m| m.status), Some(MemberStatus::Removed), "left, not down");
    assert!(net.events.contains(&("a:7000".into(), GossipEvent::MemberLeft { node: me.clone() })), "{:?}", net.events);
}

/// With the split-brain resolver, a member cut off alone is on the losing side: it downs itself,
/// and the others down it, but show it down (so that its shards would be taken over) only after
/// it has stopped. Without the resolver both sides would go on.
#[test]
fn a_member_cut_off_alone_downs_itself_before_the_others_take_over() {
    let config = GossipConfig {
        split_brain: Some(SplitBrainPolicy::KeepMajority),
        stable_after_ms: 2_000,
        down_margin_ms: 2_000,
        ..GossipConfig::without_split_brain()
    };
    let mut net = Net::new();
    net.start_with("a", 1, &[], config.clone());
    net.start_with("b", 2, &["a"], config.clone());
    net.start_with("c", 3, &["a"], config);
    net.run(5_000);
    net.isolated.insert("c:7000".into());
    let c = NodeId::new("c", 3);
    let mut shown_down = false;
    while net.now < 40_000 && !shown_down {
        let t = net.now + 100;
        net.run(t);
        shown_down = net.view("a").view.get(&c).is_some_and(|m| m.status == MemberStatus::Down);
        let c_stopped = net.events.contains(&("c:7000".into(), GossipEvent::DeclaredDown));
        assert!(!shown_down || c_stopped, "t={}: c is down in a's view while it still runs", net.now);
    }
    assert!(shown_down, "the majority downed c");
    let downed = GossipEvent::DownedUnreachable { nodes: [c.clone()].into() };
    assert!(net.events.iter().any(|(n, e)| n != "c:7000" && *e == downed), "{:?}", net.events);
    assert_eq!(net.view("c").view.get(&c).map(|m| m.status), Some(MemberStatus::Down));
    // The majority still leads.
    assert_eq!(net.view("b").leader.map(|(l, _)| l), Some(NodeId::new("a", 1)));
}

/// Gossip alone has no store to race for a lease in: `LeaseMajority` is refused at start.
#[test]
fn lease_majority_needs_a_store() {
    let config = GossipConfig {
        split_brain: Some(SplitBrainPolicy::LeaseMajority { acquire_delay_ms: 1_000 }),
        ..GossipConfig::without_split_brain()
    };
    assert!(GossipEngine::new(config, id("a", 1), &[], 0, 1).is_none());
}

fn with_resolver() -> GossipConfig {
    GossipConfig {
        split_brain: Some(SplitBrainPolicy::KeepMajority),
        stable_after_ms: 2_000,
        down_margin_ms: 2_000,
        ..GossipConfig::without_split_brain()
    }
}

/// A one-way cut: everything `c` sends is lost, while it still hears the others. Their statuses
/// kept them "connected" to it for as long as they arrived, although none of its probes was
/// answered; a status that arrived late (a busy process, a stalled message) kept `c` on its side
/// past the others' margin, and they showed it down while it ran (the gossip world found it).
/// No answer to anything it sent for a probe period per member and a probe's wait now counts
/// every member unreachable at once, however fresh their statuses (or no majority's answer
/// within the window has made it down itself first).
#[test]
fn a_member_whose_own_traffic_is_lost_finds_itself_cut_off_within_a_probe_round() {
    let config = GossipConfig::with_split_brain(SplitBrainPolicy::KeepMajority, 1_500);
    let mut net = Net::new();
    net.start_with("a", 1, &[], config.clone());
    net.start_with("b", 2, &["a"], config.clone());
    net.start_with("c", 3, &["a"], config.clone());
    net.run(5_000);
    let cut = net.now;
    net.cut.insert(("c:7000".into(), "a:7000".into()));
    net.cut.insert(("c:7000".into(), "b:7000".into()));
    let (c, others) = (NodeId::new("c", 3), [NodeId::new("a", 1), NodeId::new("b", 2)]);
    let alone = GossipEvent::Unreachable { nodes: others.into() };
    // Every member is probed within a round: a period per member (three here) and a probe's wait.
    let round = 3 * config.probe_period_ms + config.probe_rtt_ms;
    let mut shown_down = false;
    while net.now < 40_000 && !shown_down {
        let t = net.now + 100;
        net.run(t);
        // Or it has downed itself already: no majority answered it within the window.
        let gave_up = net.logged("c", &GossipEvent::DeclaredDown);
        assert!(
            net.logged("c", &alone) || gave_up || net.now < cut + round + config.probe_period_ms,
            "t={}: c still counts the others on its side: {:?}",
            net.now,
            net.events
        );
        shown_down = net.view("a").view.get(&c).is_some_and(|m| m.status == MemberStatus::Down);
        let stopped = net.logged("c", &GossipEvent::DeclaredDown);
        assert!(!shown_down || stopped, "t={}: c is down in a's view while it still runs", net.now);
    }
    assert!(shown_down, "the others downed c");
}

/// The first seed, downed and restarted (a rejoin, or a restart on a journal whose fences show
/// that a cluster ran) while it hears nobody (a one-way cut: its announces reach the others, their
/// answers do not): it must not start a cluster of its own, which the others would down while it
/// leads.
#[test]
fn a_first_seed_that_rejoins_while_it_hears_nobody_starts_no_cluster_of_its_own() {
    for (rejoin, term_floor) in [(true, 0), (false, 1 << 40)] {
        let mut net = Net::new();
        net.start("a", 1, &["a", "b"]);
        net.start("b", 2, &["a", "b"]);
        net.start("c", 3, &["a", "b"]);
        net.run(5_000);
        net.silent.insert("a:7000".into());
        net.run(10_000);
        assert_eq!(net.view("b").leader.map(|(l, _)| l), Some(NodeId::new("b", 2)), "b leads once a is down");
        net.silent.clear();
        let config = GossipConfig { rejoin, term_floor, ..GossipConfig::without_split_brain() };
        net.start_with("a", 9, &["a", "b"], config);
        let restarted = net.events.len();
        net.cut.insert(("b:7000".into(), "a:7000".into()));
        net.cut.insert(("c:7000".into(), "a:7000".into()));
        net.run(20_000);
        let led = net.events[restarted..].iter().any(|(n, e)| n == "a:7000" && matches!(e, GossipEvent::Leads { .. }));
        assert!(!led, "rejoin {rejoin}, floor {term_floor}: a led a cluster of its own: {:?}", net.events);
        for n in ["b", "c"] {
            assert_eq!(net.view(n).leader.map(|(l, _)| l), Some(NodeId::new("b", 2)), "{n}");
        }
    }
}

/// Liveness of the rule above: when every member restarted (each side of a partition may have
/// downed itself), the first seed that rejoins reaches members none of which is in a formed
/// cluster, and forms it again.
#[test]
fn a_first_seed_that_rejoins_forms_the_cluster_again_when_everyone_restarted() {
    let mut net = Net::new();
    net.start_with("a", 5, &["a", "b"], GossipConfig { rejoin: true, ..GossipConfig::without_split_brain() });
    net.start_with("b", 6, &["a", "b"], GossipConfig { rejoin: true, ..GossipConfig::without_split_brain() });
    net.run(10_000);
    for n in ["a", "b"] {
        assert_eq!(net.view(n).leader.map(|(l, _)| l), Some(NodeId::new("a", 5)), "{n}");
    }
}

/// `a` started alone, cut off, long before it joined `c`, at the moment `c` was cut from `b`:
/// `b` never heard of `a`. Counting itself as known since it started, `a` found its side {a}
/// (`c`, joined just now, did not count) against {b}, kept it on the tie rule (the lowest
/// node), and downed `b`, while `b`, on {b} against {c}, kept its side too: both sides survived.
/// A member counts on its own side from when it joined, as the others do. (`b`, which hears
/// nobody, no longer wins its tie either: it downs itself, and so may everyone.)
#[test]
fn a_member_counts_on_its_side_from_when_it_joined_not_from_when_it_started() {
    let mut net = Net::new();
    net.start_with("b", 1, &["b", "c"], with_resolver());
    net.start_with("c", 2, &["b", "c"], with_resolver());
    net.run(5_000);
    net.cut_both("a", &["b", "c"], true);
    net.start_with("a", 3, &["c"], with_resolver());
    net.run(10_000);
    net.cut_both("a", &["c"], false);
    net.cut_both("b", &["c"], true);
    net.run(40_000);
    let downed = |by: &str, node: NodeId| {
        net.events.iter().any(|(n, e)| {
            n == &format!("{by}:7000") && matches!(e, GossipEvent::DownedUnreachable { nodes } if nodes.contains(&node))
        })
    };
    let b_survives = downed("b", NodeId::new("c", 2));
    let other_survives = downed("a", NodeId::new("b", 1)) || downed("c", NodeId::new("b", 1));
    let decided = |n: &str| net.logged(n, &GossipEvent::DeclaredDown);
    assert!(b_survives || decided("b"), "b decided: {:?}", net.events);
    assert!(other_survives || (decided("a") && decided("c")), "a and c decided: {:?}", net.events);
    assert!(!(b_survives && other_survives), "both sides survived: {:?}", net.events);
}

/// The 2|2 partition test's hole, on demand: `r`, restarted as a new incarnation, is still cut
/// from the leader `a` and from `b`, and hears first from the proxy `p` (which announces to the
/// address of the downed incarnation). The proxy's status carries the cluster's term and says
/// it is formed; the proxy never leads, so `r` is first in line among the members it knows. It
/// must not take a term above a leader it has not heard of: regions follow the highest term,
/// and its coordinator would give away the shards that `a`'s side hosts. Whether `a`'s own
/// status, relayed by `p`, reaches `r` before `p`'s is a race: `a` repeats it every 2.4 s here,
/// and `r` restarts at moments spread over that period.
#[test]
fn a_rejoined_member_that_reached_only_a_proxy_takes_no_term_above_a_leader_it_never_heard_of() {
    for offset in (0..2_400).step_by(150) {
        let mut net = Net::new();
        net.start_with("a", 1, &["a"], GossipConfig { status_every_ms: 2_400, ..GossipConfig::without_split_brain() });
        net.start("b", 2, &["a"]);
        let mut proxy = id("p", 3);
        proxy.roles = vec![shardline_core::PROXY_ROLE.to_string()];
        net.start_as(proxy, &["a"], GossipConfig::without_split_brain());
        net.start("r", 4, &["a"]);
        net.run(6_000);
        let (leader, term) = net.view("p").leader.expect("a leads");
        assert_eq!(leader, NodeId::new("a", 1));
        net.silent.insert("r:7000".into());
        net.run(12_000 + offset);
        assert_eq!(net.view("p").view.get(&NodeId::new("r", 4)).map(|m| m.status), Some(MemberStatus::Down));
        net.silent.clear();
        net.nodes.remove("r:7000");
        net.cut_both("r", &["a", "b"], true);
        net.start("r", 20, &["a"]);
        net.run(30_000);
        assert!(net.logged("r", &GossipEvent::Joined), "offset {offset}: r heard the proxy: {:?}", net.events);
        let led = net.events.iter().any(|(n, e)| n == "r:7000" && matches!(e, GossipEvent::Leads { .. }));
        assert!(!led, "offset {offset}: r led above the term {term} of a leader it never heard of: {:?}", net.events);
        assert_eq!(net.view("p").leader, Some((NodeId::new("a", 1), term)), "offset {offset}: a still leads");
    }
}

fn cut_in(net: &mut Net, to: &str, from: &[&str]) {
    for f in from {
        net.cut.insert((format!("{f}:7000"), format!("{to}:7000")));
    }
}

fn led(net: &Net, name: &str) -> bool {
    net.events.iter().any(|(n, e)| *n == format!("{name}:7000") && matches!(e, GossipEvent::Leads { .. }))
}

/// `b` leads a cluster of its own and hears nobody (everything sent to it is lost); it still
/// announces to the members it knows of, and announces carry no status. The first seed `a`,
/// rejoining, reaches `c` (a restart, in no formed cluster) and hears of `b` without its status:
/// it must not take `b` for a restarted member and form a second cluster beside it (the gossip
/// world found `b` showing `a` down while `a` led that second cluster).
#[test]
fn a_first_seed_that_rejoins_forms_no_cluster_beside_a_member_whose_status_it_never_heard() {
    let mut net = Net::new();
    net.start_with("b", 1, &["b", "a", "c"], with_resolver());
    cut_in(&mut net, "b", &["a", "c"]);
    net.run(3_000);
    assert!(led(&net, "b"), "b formed a cluster and leads: {:?}", net.events);
    let rejoin = GossipConfig { rejoin: true, ..with_resolver() };
    net.start_with("a", 2, &["a", "b"], rejoin.clone());
    net.start_with("c", 3, &["a", "b"], rejoin);
    net.run(20_000);
    assert!(net.logged("a", &GossipEvent::Joined), "a reached c: {:?}", net.events);
    assert!(!led(&net, "a"), "a formed a cluster beside b: {:?}", net.events);
    assert_eq!(net.view("b").leader.map(|(l, _)| l), Some(NodeId::new("b", 1)));
}

/// `a` and `c` (not seeds that may form a cluster) have reached each other, and belong to no
/// formed cluster, when `b`, the leader of one, turns up: it sends, but hears nobody. `b` is
/// unreachable to them; two against one, they would keep their side and down `b`, which never
/// learns it and leads on. Members of no formed cluster keep no side: they down themselves.
#[test]
fn members_of_no_formed_cluster_down_themselves_rather_than_the_members_they_cannot_reach() {
    let mut net = Net::new();
    net.start_with("b", 1, &["b", "a", "c"], with_resolver());
    net.start_with("a", 2, &["b", "a", "c"], with_resolver());
    net.start_with("c", 3, &["b", "a", "c"], with_resolver());
    net.isolated.insert("b:7000".into());
    net.run(10_000);
    assert!(net.logged("a", &GossipEvent::Joined) && led(&net, "b"), "{:?}", net.events);
    net.isolated.clear();
    cut_in(&mut net, "b", &["a", "c"]);
    net.run(40_000);
    let downed_b = net.events.iter().any(|(n, e)| {
        n != "b:7000" && matches!(e, GossipEvent::DownedUnreachable { nodes } if nodes.contains(&NodeId::new("b", 1)))
    });
    assert!(!downed_b, "a member of no formed cluster downed b: {:?}", net.events);
    assert!(net.logged("a", &GossipEvent::DeclaredDown), "a downed itself: {:?}", net.events);
    assert_eq!(net.view("b").leader.map(|(l, _)| l), Some(NodeId::new("b", 1)));
}

/// The leader `a` hears nothing (everything sent to it is lost) while `b` still hears its
/// statuses and is answered by the proxy `p`, so `b` never finds itself on a losing side. To
/// `a`, `b` is unreachable: one against one, `a` would win the tie (the lowest address) and show
/// `b` down while `b` runs on (the gossip world found it). From inside `a`, "nothing reaches me"
/// and "the other crashed" look the same: a node that hears nothing never wins a tie, it downs
/// itself.
#[test]
fn a_member_that_hears_nothing_loses_a_tie_and_downs_itself() {
    let mut net = Net::new();
    net.start_with("a", 1, &[], with_resolver());
    net.start_with("b", 2, &["a"], with_resolver());
    let mut proxy = id("p", 3);
    proxy.roles = vec![shardline_core::PROXY_ROLE.to_string()];
    net.start_as(proxy, &["a"], with_resolver());
    net.run(5_000);
    assert_eq!(net.view("b").leader.map(|(l, _)| l), Some(NodeId::new("a", 1)));
    cut_in(&mut net, "a", &["b", "p"]);
    let b = NodeId::new("b", 2);
    while net.now < 40_000 {
        let t = net.now + 100;
        net.run(t);
        let shown_down = net.view("a").view.get(&b).is_some_and(|m| m.status == MemberStatus::Down);
        let stopped = net.logged("b", &GossipEvent::DeclaredDown);
        assert!(!shown_down || stopped, "t={}: b is down in a's view while it runs: {:?}", net.now, net.events);
    }
    let downed_b = net
        .events
        .iter()
        .any(|(n, e)| n == "a:7000" && matches!(e, GossipEvent::DownedUnreachable { nodes } if nodes.contains(&b)));
    assert!(!downed_b, "a won the tie from silence: {:?}", net.events);
    assert!(net.logged("a", &GossipEvent::DeclaredDown), "a downed itself: {:?}", net.events);
}

/// The only seed, restarted while the cluster it started runs on (a term floor above zero: the
/// journal holds fences), has no other seed to try: it waits for the members that outlived it,
/// which announce to its address, and joins them. Starting a cluster at once, it led a second one
/// beside them that never merged (found by the runtime simulation).
#[test]
fn the_only_seed_restarted_joins_the_cluster_that_outlived_it_instead_of_starting_one() {
    let mut net = Net::new();
    net.start("a", 1, &["a"]);
    net.start("b", 2, &["a"]);
    net.start("c", 3, &["a"]);
    net.run(5_000);
    net.silent.insert("a:7000".into());
    net.run(12_000);
    assert_eq!(net.view("b").leader.map(|(l, _)| l), Some(NodeId::new("b", 2)), "b leads once a is down");
    net.silent.clear();
    let restarted = net.events.len();
    net.start_with("a", 9, &["a"], GossipConfig { term_floor: 1 << 33, ..GossipConfig::without_split_brain() });
    net.run(30_000);
    let led = net.events[restarted..].iter().any(|(n, e)| n == "a:7000" && matches!(e, GossipEvent::Leads { .. }));
    assert!(!led, "the restarted seed led a cluster of its own: {:?}", &net.events[restarted..]);
    for n in ["a", "b", "c"] {
        assert_eq!(net.view(n).leader.map(|(l, _)| l), Some(NodeId::new("b", 2)), "{n}");
    }
    // Alone (a single-node cluster restarted), it still starts one after the wait.
    let mut net = Net::new();
    net.start_with("a", 1, &["a"], GossipConfig { term_floor: 1 << 33, ..GossipConfig::without_split_brain() });
    net.run(10_000);
    assert_eq!(net.view("a").leader.map(|(l, _)| l), Some(NodeId::new("a", 1)));
}

/// A fence in the journal above the cluster's terms (a cluster led apart from it took the
/// shard), told to any member: the leader hears of it through that member's status and takes a
/// term above it, so that its coordinator's epochs pass the fence.
#[test]
fn a_fence_above_the_clusters_terms_told_to_any_member_makes_the_leader_outbid_it() {
    let mut net = Net::new();
    net.start("a", 1, &["a"]);
    net.start("b", 2, &["a"]);
    net.start("c", 3, &["a"]);
    net.run(5_000);
    let (leader, before) = net.view("a").leader.expect("a leads");
    assert_eq!(leader, NodeId::new("a", 1));
    let fence = before + (5 << 32);
    let now = net.now;
    net.nodes.get_mut("c:7000").unwrap().handle_fenced_above(now, fence);
    net.run(now + 15_000);
    for n in ["a", "b", "c"] {
        let (leader, term) = net.view(n).leader.unwrap_or_else(|| panic!("{n} sees no leader"));
        assert_eq!(leader, NodeId::new("a", 1), "{n}");
        assert!(term > fence, "{n}: the leader's term {term} is not above the fence {fence}");
    }
    // Told again, or of a lower fence, it changes nothing.
    let (_, term) = net.view("a").leader.unwrap();
    let now = net.now;
    net.nodes.get_mut("b:7000").unwrap().handle_fenced_above(now, fence);
    net.run(now + 10_000);
    assert_eq!(net.view("a").leader.map(|(_, t)| t), Some(term));
}

/// `r` announced itself to `a` and was heard, but hears only `b`, and joins through `b`'s
/// probe. Such a message carries recent changes only, not the membership, so `r` knew `b` and
/// nobody else; when `b` went (here it leaves; in the gossip world it lost a 2|2 tie and downed
/// itself), `r` ran on alone with nobody unreachable, while `a` and `c` downed it. Joined, a
/// member asks the member it joined through for the whole membership: `r` then finds `a` and
/// `c` unreachable and downs itself before they show it down.
#[test]
fn a_member_that_joined_through_a_probe_asks_for_the_whole_membership() {
    let mut net = Net::new();
    for (name, inc) in [("a", 1), ("b", 2), ("c", 3)] {
        net.start_with(name, inc, &["a", "b", "c"], with_resolver());
    }
    net.run(5_000);
    assert_eq!(net.view("b").leader.map(|(l, _)| l), Some(NodeId::new("a", 1)));
    cut_in(&mut net, "r", &["a", "b", "c"]);
    net.start_with("r", 9, &["a"], GossipConfig { rejoin: true, ..with_resolver() });
    let r = NodeId::new("r", 9);
    while net.view("a").view.get(&r).is_none() {
        assert!(net.now < 10_000, "a never heard of r: {:?}", net.events);
        let t = net.now + 50;
        net.run(t);
    }
    net.cut_both("r", &["a", "c"], true);
    net.cut.remove(&("b:7000".to_string(), "r:7000".to_string()));
    while !net.logged("r", &GossipEvent::Joined) {
        assert!(net.now < 20_000, "r never heard b: {:?}", net.events);
        let t = net.now + 50;
        net.run(t);
    }
    let t = net.now + 50;
    net.run(t);
    net.nodes.get_mut("b:7000").unwrap().handle_exit(t);
    while net.now < 60_000 {
        let t = net.now + 100;
        net.run(t);
        let shown_down = net.view("a").view.get(&r).is_some_and(|m| m.status == MemberStatus::Down);
        let stopped = net.logged("r", &GossipEvent::DeclaredDown);
        assert!(!shown_down || stopped, "t={}: r is down in a's view while it runs: {:?}", net.now, net.events);
    }
    assert!(net.logged("r", &GossipEvent::DeclaredDown), "r downed itself: {:?}", net.events);
}
