//! Faults: crashes, isolation from everything (store included), cuts between two nodes, broken
//! links, leaves and joins; and what a fenced or dead process loses.

use super::*;

impl World {
    pub(super) fn fault(&mut self) {
        let candidates: Vec<NodeId> = self
            .nodes
            .values()
            .filter(|n| n.alive && !n.fenced && !n.leaving && !self.isolated.contains_key(&*n.id.name))
            .map(|n| n.id.clone())
            .collect();
        let kind = self.rng.range(0, 7);
        if candidates.len() < 2 && kind != 5 {
            return;
        }
        let Some(victim) = self.rng.pick(&candidates).cloned() else { return };
        let now = self.now;
        match kind {
            0 => {
                // crash, restart later
                self.log(|| format!("fault: crash {victim}"));
                self.kill(&victim, false);
                let down = now + DOWN_AFTER;
                self.schedule(down, Ev::Down { node: victim.clone() });
                let back = now + self.rng.range(DOWN_AFTER + 50, 1_500);
                self.schedule(back, Ev::Restart { name: victim.name.to_string() });
            }
            1 => {
                // cut off from everything, store included
                self.next_isolation += 1;
                let iso = self.next_isolation;
                let dur = self.rng.range(100, 1_500);
                self.log(|| format!("fault: isolate {victim} for {dur}"));
                self.isolated.insert(victim.name.to_string(), iso);
                self.refresh_reachability();
                for peer in self.alive_ids() {
                    if peer != victim {
                        self.break_link(&victim, &peer);
                    }
                }
                self.schedule(now + FENCE_AFTER, Ev::Fence { node: victim.clone(), isolation: iso });
                self.schedule(now + dur, Ev::Heal { name: victim.name.to_string(), isolation: iso });
            }
            2 => {
                // cut between two nodes only; leases fine
                let others: Vec<NodeId> = candidates.iter().filter(|n| **n != victim).cloned().collect();
                let Some(other) = self.rng.pick(&others).cloned() else { return };
                self.log(|| format!("fault: cut {victim} / {other}"));
                self.cuts.insert(pair(&victim.name, &other.name));
                self.refresh_reachability();
                self.break_link(&victim, &other);
                let dur = self.rng.range(50, 800);
                self.schedule(now + dur, Ev::HealCut { a: victim.name.to_string(), b: other.name.to_string() });
            }
            3 => {
                let others: Vec<NodeId> = candidates.iter().filter(|n| **n != victim).cloned().collect();
                if let Some(other) = self.rng.pick(&others).cloned() {
                    self.log(|| format!("fault: break link {victim} / {other}"));
                    self.break_link(&victim, &other);
                }
            }
            4 => {
                self.log(|| format!("fault: {victim} leaves"));
                if let Some(n) = self.nodes.get_mut(&victim) {
                    n.leaving = true;
                }
                let _ = self.view.set_status(&victim, MemberStatus::Leaving);
                self.membership_changed();
                if self.rng.chance(0.7) {
                    let at = now + self.rng.range(10, 500);
                    self.schedule(at, Ev::Join);
                }
            }
            _ => self.schedule(now, Ev::Join),
        }
    }

    pub(super) fn fence(&mut self, id: &NodeId) {
        let now = self.now;
        self.log(|| format!("fence {id}"));
        let Some(n) = self.nodes.get_mut(id) else { return };
        if !n.alive || n.fenced {
            return;
        }
        if let Some(c) = n.coordinator.as_mut() {
            c.handle_leadership_lost(now);
        }
        n.region.handle_fenced(now);
        self.pump(id);
        let n = self.nodes.get_mut(id).expect("node exists");
        n.fenced = true;
        n.coordinator = None;
        let mut lost = Vec::new();
        for (_, e) in std::mem::take(&mut n.entities) {
            lost.extend(e.mailbox.into_iter().map(|(m, _)| m));
        }
        for m in &lost {
            self.ledger.excuse(m, now);
        }
        self.live.retain(|_, node| node != id);
    }

    /// The process dies: everything in it is gone (excused), its connections reset.
    pub(super) fn kill(&mut self, id: &NodeId, graceful: bool) {
        let now = self.now;
        let Some(n) = self.nodes.get_mut(id) else { return };
        if !n.alive {
            return;
        }
        n.alive = false;
        n.coordinator = None;
        let mut lost: Vec<UserMsg> = n.region.take_buffered().into_iter().map(|(_, m)| m).collect();
        for (_, e) in std::mem::take(&mut n.entities) {
            lost.extend(e.mailbox.into_iter().map(|(m, _)| m));
        }
        for m in &lost {
            self.ledger.excuse(m, now);
        }
        self.live.retain(|_, node| node != id);
        self.log(|| format!("kill {id} graceful={graceful}"));
        if !graceful {
            let peers: Vec<NodeId> = self.alive_ids();
            for peer in peers {
                self.break_link(id, &peer);
            }
        }
    }

    pub(super) fn break_link(&mut self, a: &NodeId, b: &NodeId) {
        *self.sessions.entry(pair(&a.name, &b.name)).or_insert(0) += 1;
        let d1 = self.now + self.rng.range(1, 40);
        let d2 = self.now + self.rng.range(1, 40);
        self.schedule(d1, Ev::LinkDown { node: a.clone(), peer: b.clone() });
        self.schedule(d2, Ev::LinkDown { node: b.clone(), peer: a.clone() });
    }

    pub(super) fn link_ok(&self, a: &str, b: &str) -> bool {
        a == b || (!self.isolated.contains_key(a) && !self.isolated.contains_key(b) && !self.cuts.contains(&pair(a, b)))
    }
}

impl World {
    /// The failure detector's part of the oracle: a member cut off from everything, or from one
    /// peer, is unreachable in the view until the cut heals. The coordinator must then hold
    /// rebalancing and begin no hand-off with it.
    pub(super) fn refresh_reachability(&mut self) {
        let mut changed = false;
        let members: Vec<NodeId> =
            self.view.members().filter(|m| !m.status.is_fenced()).map(|m| m.node.clone()).collect();
        for id in members {
            let cut = self.isolated.contains_key(&*id.name)
                || self.cuts.iter().any(|(a, b)| **a == *id.name || **b == *id.name);
            if self.view.is_reachable(&id) == cut {
                let _ = self.view.set_reachable(&id, !cut);
                changed = true;
                if cut {
                    self.unreachable_marks += 1;
                }
                self.log(|| format!("{id} {}", if cut { "unreachable" } else { "reachable again" }));
            }
        }
        if changed {
            self.membership_changed();
        }
    }
}
