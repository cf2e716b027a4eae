//! Carrying out what the engines ask for: messages, timers, entity processing.

use super::*;
use shardline_core::Engine;

impl World {
    /// Carries out every pending command of a node, then re-arms its timer.
    pub(super) fn pump(&mut self, id: &NodeId) {
        loop {
            let Some(n) = self.nodes.get_mut(id) else { return };
            if !n.alive {
                return;
            }
            let term = n.coordinator.as_ref().map(|c| c.term()).unwrap_or(0);
            let ccmds: Vec<CoordinatorCommand> =
                n.coordinator.as_mut().map(|c| c.drain_commands().collect()).unwrap_or_default();
            let rcmds: Vec<RegionCommand<UserMsg>> = n.region.drain_commands().collect();
            if ccmds.is_empty() && rcmds.is_empty() {
                break;
            }
            for c in ccmds {
                self.run_coordinator_command(id, term, c);
            }
            for c in rcmds {
                self.run_region_command(id, c);
            }
        }
        self.arm_timer(id);
    }

    pub(super) fn arm_timer(&mut self, id: &NodeId) {
        let Some(n) = self.nodes.get(id) else { return };
        let next = [n.region.poll_timeout(), n.coordinator.as_ref().and_then(|c| c.poll_timeout())]
            .into_iter()
            .flatten()
            .min();
        if let Some(at) = next {
            if n.timer_at.is_none_or(|t| at < t || t < self.now) {
                self.nodes.get_mut(id).expect("node exists").timer_at = Some(at);
                self.schedule(at, Ev::Timer { node: id.clone() });
            }
        }
    }

    pub(super) fn run_coordinator_command(&mut self, id: &NodeId, term: u64, c: CoordinatorCommand) {
        if let CoordinatorCommand::PersistShardMap { changes, version, .. } = &c {
            if self.store.is_some() && term < self.store_term {
                // Compare-and-set on the writer's term: a newer coordinator wrote the map.
                let (now, by) = (self.now, self.store_term);
                let n = self.nodes.get_mut(id).expect("node exists");
                if let Some(co) = n.coordinator.as_mut().filter(|co| co.term() == term) {
                    co.handle_map_stored(now, *version, Err(MapWriteError::Conflict { term: Some(by) }));
                    if !co.is_stopped() {
                        self.ledger.violations.push(format!("t={now} {id} coordinates on after being deposed"));
                    }
                    n.coordinator = None;
                    self.deposed += 1;
                }
                self.log(|| format!("{id}: map write of term {term} refused, term {by} wrote it"));
                return;
            }
            if let Some(store) = self.store.as_mut() {
                self.store_term = self.store_term.max(term);
                for (shard, slot) in changes {
                    let _ = store.raise_epoch(*shard, slot.epoch);
                    match slot.home() {
                        Some(h) => {
                            let _ = store.adopt(*shard, h);
                        }
                        None => {
                            let _ = store.unassign(*shard);
                        }
                    }
                }
            }
        }
        for (to, m) in c.messages(term) {
            self.send(id, &to, Wire::ToRegion(m));
        }
    }

    pub(super) fn run_region_command(&mut self, id: &NodeId, c: RegionCommand<UserMsg>) {
        let now = self.now;
        match c {
            RegionCommand::Deliver { shard, epoch, msg } => {
                if let Some(owner) = self.live.get(&msg.entity) {
                    if owner != id {
                        self.ledger
                            .violations
                            .push(format!("t={now} I1: entity e{} live on {owner} and {id}", msg.entity));
                    }
                }
                self.live.insert(msg.entity, id.clone());
                let n = self.nodes.get_mut(id).expect("node exists");
                let e = n.entities.entry(msg.entity).or_insert_with(|| Entity { shard, mailbox: VecDeque::new() });
                e.mailbox.push_back((msg, epoch));
                let at = now + self.rng.range(0, 6);
                self.schedule(at, Ev::Process { node: id.clone() });
            }
            // The simulated network has no send queue to fill: both go out at once.
            RegionCommand::SendToRegion { to, msg } | RegionCommand::SendToRegionWhenReady { to, msg } => {
                self.send(id, &to, Wire::Region(msg))
            }
            RegionCommand::SendToCoordinator { to, msg } => self.send(id, &to, Wire::ToCoord(msg)),
            RegionCommand::StartShard { shard, handover, .. } => {
                if handover.as_ref().is_some_and(|h| h[..] != shard.0.to_be_bytes()) {
                    self.ledger.violations.push(format!("t={now} handover of another shard reached {shard}"));
                }
            }
            RegionCommand::RaiseEpoch { shard, to, .. } => {
                // Entities see the epoch their node hosts the shard at when they process.
                let n = self.nodes.get_mut(id).expect("node exists");
                for e in n.entities.values_mut().filter(|e| e.shard == shard) {
                    for (_, epoch) in e.mailbox.iter_mut() {
                        *epoch = to;
                    }
                }
            }
            RegionCommand::StopShard { shard, fenced, .. } => {
                let n = self.nodes.get_mut(id).expect("node exists");
                if fenced {
                    let dead: Vec<u32> = n.entities.iter().filter(|(_, e)| e.shard == shard).map(|(k, _)| *k).collect();
                    let mut lost = Vec::new();
                    for k in dead {
                        if let Some(e) = n.entities.remove(&k) {
                            lost.extend(e.mailbox.into_iter().map(|(m, _)| m));
                        }
                        self.live.remove(&k);
                    }
                    for m in &lost {
                        self.ledger.excuse(m, now);
                    }
                } else {
                    n.stopping.insert(shard);
                    let at = now + self.rng.range(0, 6);
                    self.schedule(at, Ev::Process { node: id.clone() });
                }
            }
            RegionCommand::Reject { msg, .. } => self.ledger.excuse(&msg, now),
            // This world's regions run without sweeps (the default): entities here are messages
            // and their ledger, not tasks that linger.
            RegionCommand::SweepLingering | RegionCommand::PassivateIdle { .. } => {}
            RegionCommand::ClaimShard { shard, epoch } => self.ask_journal(id, shard, epoch, false),
            RegionCommand::ReadRemembered { shard, epoch } => self.ask_journal(id, shard, epoch, true),
            RegionCommand::WakeEntity { shard, epoch, id: entity } => self.wake(id, shard, epoch, &entity),
        }
    }

    /// Entities process one message each; stopping shards whose mailboxes are empty stop.
    pub(super) fn process(&mut self, id: &NodeId) {
        let now = self.now;
        let Some(n) = self.nodes.get_mut(id) else { return };
        if !n.alive {
            return;
        }
        let mut done = Vec::new();
        let mut again = false;
        for (&k, e) in n.entities.iter_mut() {
            if let Some((m, epoch)) = e.mailbox.pop_front() {
                done.push((k, e.shard, m, epoch));
                again |= !e.mailbox.is_empty();
            }
        }
        for (k, shard, m, epoch) in done {
            let n = &self.nodes[id];
            let hosts_at = n.region.hosted().into_iter().find(|(s, _)| *s == shard).map(|(_, e)| e);
            if hosts_at != Some(epoch) {
                self.ledger
                    .violations
                    .push(format!("t={now} I1: e{k} processed on {id} at epoch {epoch} while hosting {hosts_at:?}"));
            }
            self.ledger.processed(&m, id, now);
        }
        let n = self.nodes.get_mut(id).expect("node exists");
        let ready: Vec<ShardId> = n
            .stopping
            .iter()
            .copied()
            .filter(|s| n.entities.values().all(|e| e.shard != *s || e.mailbox.is_empty()))
            .collect();
        for shard in ready {
            n.stopping.remove(&shard);
            let gone: Vec<u32> = n.entities.iter().filter(|(_, e)| e.shard == shard).map(|(k, _)| *k).collect();
            for k in gone {
                n.entities.remove(&k);
                self.live.remove(&k);
            }
            // The shard's number stands for its entities' state: it must reach the next owner.
            n.region.handle_shard_stopped(now, shard, Some(shard.0.to_be_bytes().to_vec()));
        }
        if again {
            let at = now + self.rng.range(1, 6);
            self.schedule(at, Ev::Process { node: id.clone() });
        }
        self.pump(id);
    }
}
