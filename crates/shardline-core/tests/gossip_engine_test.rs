//! Gossip engines exchanging their messages directly: joining through a seed, a leader with a
//! term, a silent member suspected then down, a leave, and data that cannot be read.

use std::collections::{BTreeMap, BTreeSet};

use shardline_core::gossip::{GossipCommand, GossipConfig, GossipEngine, GossipEvent, GossipId};
use shardline_core::{MemberStatus, NodeId, SplitBrainPolicy};

struct Net {
    nodes: BTreeMap<String, GossipEngine>,
    /// Addresses that receive nothing and send nothing (a stopped process).
    silent: BTreeSet<String>,
    /// Addresses cut off from the network: they run, but nothing they send or are sent arrives.
    isolated: BTreeSet<String>,
    events: Vec<(String, GossipEvent)>,
    now: u64,
}

fn id(name: &str, inc: u64) -> GossipId {
    GossipId {
        addr: format!("{name}:7000"),
        node: Some(NodeId::new(name, inc)),
        app_version: "1".into(),
        roles: Vec::new(),
        weight: 1,
    }
}

impl Net {
    fn new() -> Self {
        Net { nodes: BTreeMap::new(), silent: BTreeSet::new(), isolated: BTreeSet::new(), events: Vec::new(), now: 0 }
    }

    fn start(&mut self, name: &str, inc: u64, seeds: &[&str]) {
        self.start_with(name, inc, seeds, GossipConfig::default());
    }

    fn start_with(&mut self, name: &str, inc: u64, seeds: &[&str], config: GossipConfig) {
        let seeds: Vec<String> = seeds.iter().map(|s| format!("{s}:7000")).collect();
        let me = id(name, inc);
        let e = GossipEngine::new(config, me.clone(), &seeds, self.now, inc).unwrap();
        self.nodes.insert(me.addr, e);
    }

    /// Runs every engine until `until`, delivering messages after 1 ms.
    fn run(&mut self, until: u64) {
        let mut inflight: Vec<(u64, String, Vec<u8>)> = Vec::new();
        while self.now < until {
            self.now += 1;
            let now = self.now;
            let due: Vec<_> = inflight.iter().filter(|(at, ..)| *at <= now).cloned().collect();
            inflight.retain(|(at, ..)| *at > now);
            for (_, to, data) in due {
                if self.silent.contains(&to) || self.isolated.contains(&to) {
                    continue;
                }
                if let Some(e) = self.nodes.get_mut(&to) {
                    e.handle_data(now, &data);
                }
            }
            for (addr, e) in self.nodes.iter_mut() {
                if self.silent.contains(addr) {
                    continue;
                }
                if e.poll_timeout().is_some_and(|t| t <= now) {
                    e.handle_timeout(now);
                }
                for c in e.drain_commands() {
                    match c {
                        GossipCommand::Send { .. } if self.isolated.contains(addr) => {}
                        GossipCommand::Send { to, data } => inflight.push((now + 1, to.addr, data)),
                        GossipCommand::Log(ev) => self.events.push((addr.clone(), ev)),
                        GossipCommand::Publish(_) => {}
                    }
                }
            }
        }
    }

    fn view(&self, name: &str) -> shardline_core::gossip::GossipView {
        self.nodes[&format!("{name}:7000")].view()
    }
}

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

/// A member that led a cluster of its own (a first seed restarted while cut off) with a term
/// above the others' merges with them: it gives up, being younger, and the oldest member takes
/// a term above it, since regions follow the highest term they have seen. It takes one term, not
/// a bidding war with the other claimant.
#[test]
fn a_leader_outranked_by_a_merged_cluster_takes_a_term_above_it_once() {
    let mut net = Net::new();
    net.start("a", 1, &[]);
    net.start("b", 2, &["a"]);
    net.isolated.insert("c:7000".into());
    let high = 1 << 40;
    net.start_with("c", 3, &["c", "a"], GossipConfig { term_floor: high, ..GossipConfig::default() });
    net.run(5_000);
    let (leader, term) = net.view("a").leader.expect("a leads");
    assert_eq!(leader, NodeId::new("a", 1));
    assert!(term < high);
    let (alone, high_term) = net.view("c").leader.expect("c leads alone");
    assert_eq!(alone, NodeId::new("c", 3));
    net.isolated.clear();
    net.run(20_000);
    for n in ["a", "b", "c"] {
        let (leader, term) = net.view(n).leader.unwrap_or_else(|| panic!("{n} sees no leader"));
        assert_eq!(leader, NodeId::new("a", 1), "{n}");
        assert!(term > high_term, "{n}: the leader's term {term} is above the merged one's {high_term}");
    }
    let leads = |n: &str| net.events.iter().filter(|(a, e)| a == n && matches!(e, GossipEvent::Leads { .. })).count();
    assert_eq!((leads("a:7000"), leads("c:7000")), (2, 1), "{:?}", net.events);
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
        ..GossipConfig::default()
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
        ..GossipConfig::default()
    };
    assert!(GossipEngine::new(config, id("a", 1), &[], 0, 1).is_none());
}
