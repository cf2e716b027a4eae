//! Gossip engines exchanging their messages directly: joining through a seed, a leader with a
//! term, a silent member suspected then down, a leave, and data that cannot be read.

use std::collections::{BTreeMap, BTreeSet};

use shardline_core::gossip::{GossipCommand, GossipConfig, GossipEngine, GossipEvent, GossipId};
use shardline_core::{MemberStatus, NodeId};

struct Net {
    nodes: BTreeMap<String, GossipEngine>,
    /// Addresses that receive nothing and send nothing (a stopped process).
    silent: BTreeSet<String>,
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
        Net { nodes: BTreeMap::new(), silent: BTreeSet::new(), events: Vec::new(), now: 0 }
    }

    fn start(&mut self, name: &str, inc: u64, seeds: &[&str]) {
        let seeds: Vec<String> = seeds.iter().map(|s| format!("{s}:7000")).collect();
        let me = id(name, inc);
        let e = GossipEngine::new(GossipConfig::default(), me.clone(), &seeds, self.now, inc).unwrap();
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
                if self.silent.contains(&to) {
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
