//! A network of gossip engines exchanging their messages directly, with the faults the engine
//! tests need: silent, crashed, mute and isolated members, one-way cuts and slow links.
#![allow(dead_code)]

use shardline_core::Engine;
use std::collections::{BTreeMap, BTreeSet};

use shardline_core::gossip::{AddressAnswer, GossipCommand, GossipConfig, GossipEngine, GossipEvent, GossipId};
use shardline_core::{MemberStatus, NodeId};

pub struct Net {
    pub nodes: BTreeMap<String, GossipEngine>,
    /// Addresses that receive nothing and send nothing (a stopped process).
    pub silent: BTreeSet<String>,
    /// Addresses whose process is stopped (`SIGSTOP`): what is sent to them waits, and is read in
    /// order, one message a millisecond, once [`Net::wake`] lets them run again.
    pub paused: BTreeSet<String>,
    /// Addresses whose process crashed while its host runs on: a connection there is refused.
    pub crashed: BTreeSet<String>,
    /// Addresses whose gossip is lost both ways while connections to them succeed (a process
    /// that is still starting up).
    pub mute: BTreeSet<String>,
    /// Addresses cut off from the network: they run, but nothing they send or are sent arrives.
    pub isolated: BTreeSet<String>,
    /// Links that lose everything sent from the first address to the second (one way).
    pub cut: BTreeSet<(String, String)>,
    /// Links whose messages take this many milliseconds longer (a busy receiver).
    pub slow: BTreeMap<(String, String), u64>,
    pub events: Vec<(String, GossipEvent)>,
    pub now: u64,
    /// Messages on their way, with when they arrive: kept from one `run` to the next.
    pub inflight: Vec<(u64, String, Vec<u8>)>,
}

pub fn id(name: &str, inc: u64) -> GossipId {
    GossipId {
        addr: format!("{name}:7000"),
        node: Some(NodeId::new(name, inc)),
        app_version: "1".into(),
        roles: Vec::new(),
        weight: 1,
    }
}

impl Net {
    pub fn new() -> Self {
        Net {
            nodes: BTreeMap::new(),
            silent: BTreeSet::new(),
            paused: BTreeSet::new(),
            crashed: BTreeSet::new(),
            mute: BTreeSet::new(),
            isolated: BTreeSet::new(),
            cut: BTreeSet::new(),
            slow: BTreeMap::new(),
            events: Vec::new(),
            now: 0,
            inflight: Vec::new(),
        }
    }

    pub fn start(&mut self, name: &str, inc: u64, seeds: &[&str]) {
        self.start_with(name, inc, seeds, GossipConfig::without_split_brain());
    }

    pub fn start_with(&mut self, name: &str, inc: u64, seeds: &[&str], config: GossipConfig) {
        self.start_as(id(name, inc), seeds, config);
    }

    pub fn start_as(&mut self, me: GossipId, seeds: &[&str], config: GossipConfig) {
        let seeds: Vec<String> = seeds.iter().map(|s| format!("{s}:7000")).collect();
        let inc = me.node.as_ref().map_or(0, |n| n.incarnation);
        let e = GossipEngine::new(config, me.clone(), &seeds, self.now, inc).unwrap();
        self.nodes.insert(me.addr, e);
    }

    /// Cuts (or joins again) the links between `a` and each of `others`, both ways.
    pub fn cut_both(&mut self, a: &str, others: &[&str], cut: bool) {
        for o in others {
            for link in [(format!("{a}:7000"), format!("{o}:7000")), (format!("{o}:7000"), format!("{a}:7000"))] {
                if cut {
                    self.cut.insert(link);
                } else {
                    self.cut.remove(&link);
                }
            }
        }
    }

    /// Whether `name` logged `event`.
    pub fn logged(&self, name: &str, event: &GossipEvent) -> bool {
        self.events.contains(&(format!("{name}:7000"), event.clone()))
    }

    /// Runs every engine until `until`, delivering messages after 1 ms.
    pub fn run(&mut self, until: u64) {
        let mut inflight = std::mem::take(&mut self.inflight);
        while self.now < until {
            self.now += 1;
            let now = self.now;
            let due: Vec<_> = inflight.iter().filter(|(at, ..)| *at <= now).cloned().collect();
            inflight.retain(|(at, ..)| *at > now);
            for (at, to, data) in due {
                if self.paused.contains(&to) {
                    inflight.push((at, to, data));
                    continue;
                }
                let lost = [&self.silent, &self.isolated, &self.crashed, &self.mute];
                if lost.iter().any(|s| s.contains(&to)) {
                    continue;
                }
                if let Some(e) = self.nodes.get_mut(&to) {
                    e.handle_data(now, &data);
                }
            }
            let mut answers = Vec::new();
            for (addr, e) in self.nodes.iter_mut() {
                if self.silent.contains(addr) || self.paused.contains(addr) || self.crashed.contains(addr) {
                    continue;
                }
                if e.poll_timeout().is_some_and(|t| t <= now) {
                    e.handle_timeout(now);
                }
                for c in e.drain_commands() {
                    match c {
                        GossipCommand::Send { .. } if self.isolated.contains(addr) || self.mute.contains(addr) => {}
                        GossipCommand::Send { to, .. } if self.cut.contains(&(addr.clone(), to.addr.clone())) => {}
                        GossipCommand::Send { to, data } => {
                            let slow = self.slow.get(&(addr.clone(), to.addr.clone())).copied().unwrap_or(0);
                            inflight.push((now + 1 + slow, to.addr, data));
                        }
                        GossipCommand::Log(ev) => self.events.push((addr.clone(), ev)),
                        GossipCommand::Publish(_) => {}
                        GossipCommand::CheckAddress { member } => answers.push((addr.clone(), member)),
                    }
                }
            }
            // What a connection to the address finds: a refusal where the process crashed, the
            // node listening there now, or nothing where messages do not get through.
            for (from, member) in answers {
                let answer = if self.crashed.contains(&member.addr) {
                    AddressAnswer::Refused
                } else if self.silent.contains(&member.addr)
                    || self.paused.contains(&member.addr)
                    || self.isolated.contains(&member.addr)
                    || self.isolated.contains(&from)
                    || self.cut.contains(&(from.clone(), member.addr.clone()))
                    || self.cut.contains(&(member.addr.clone(), from.clone()))
                {
                    AddressAnswer::Silent
                } else {
                    match self.nodes.get(&member.addr) {
                        Some(e) => AddressAnswer::Node(e.node().clone()),
                        None => AddressAnswer::Refused,
                    }
                };
                if let Some(e) = self.nodes.get_mut(&from) {
                    e.handle_address(now, &member, answer);
                }
            }
        }
        self.inflight = inflight;
    }

    /// Lets a paused member run again: it reads what waited for it in order, one message a
    /// millisecond from the next one on.
    pub fn wake(&mut self, name: &str) {
        let addr = format!("{name}:7000");
        self.paused.remove(&addr);
        let mut next = self.now;
        for (at, _, _) in self.inflight.iter_mut().filter(|(_, to, _)| *to == addr) {
            next += 1;
            *at = (*at).max(next);
        }
    }

    pub fn view(&self, name: &str) -> shardline_core::gossip::GossipView {
        self.nodes[&format!("{name}:7000")].view()
    }
}

/// Three members at the defaults (the resolver on), joined.
pub fn three_at_defaults() -> Net {
    let mut net = Net::new();
    net.start_with("a", 1, &[], GossipConfig::default());
    net.start_with("b", 2, &["a"], GossipConfig::default());
    net.start_with("c", 3, &["a"], GossipConfig::default());
    net.run(6_000);
    net
}

/// The time from `net.now` until `observer` shows `node` down, within `limit` ms (None past it).
pub fn time_until_down(net: &mut Net, observer: &str, node: &NodeId, limit: u64) -> Option<u64> {
    let start = net.now;
    while net.now < start + limit {
        let t = net.now + 50;
        net.run(t);
        if net.view(observer).view.get(node).is_some_and(|m| m.status == MemberStatus::Down) {
            return Some(net.now - start);
        }
    }
    None
}
