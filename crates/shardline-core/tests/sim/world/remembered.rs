//! Remembered entities: the journal that claims shards and lists their entities (and sometimes
//! cannot answer), entities woken at the engine's pace, and what is checked of them: a wake only
//! where the shard is hosted at the epoch it names, never an entity live on two nodes, never
//! more recovering at once than the pace allows, and every entity back on its shard's owner after
//! the quiet period.

use super::*;
use shardline_core::{ClaimOutcome, EntityId, RememberPace};

/// The pace of every remembered type here: slow enough that the places run out.
pub(super) const PACE: RememberPace = RememberPace { per_second: 200, at_once: 3 };

impl World {
    pub(super) fn ask_journal(&mut self, node: &NodeId, shard: ShardId, epoch: Epoch, read: bool) {
        let at = self.now + self.rng.range(1, 12);
        self.schedule(at, Ev::Journal { node: node.clone(), shard, epoch, read });
    }

    pub(super) fn journal_answers(&mut self, node: &NodeId, shard: ShardId, epoch: Epoch, read: bool) {
        let now = self.now;
        let down = self.rng.chance(0.2);
        let remembered: Vec<EntityId> = (0..self.p.entities)
            .filter(|k| self.entity_shard[*k as usize] == shard)
            .map(|k| EntityId::new(format!("e{k}")))
            .collect();
        let Some(n) = self.nodes.get_mut(node).filter(|n| n.alive && !n.fenced) else { return };
        if read {
            n.region.handle_remembered(now, shard, epoch, (!down).then_some(remembered));
        } else {
            let outcome = if down { ClaimOutcome::Unavailable } else { ClaimOutcome::Claimed };
            n.region.handle_claimed(now, shard, epoch, outcome);
        }
        self.pump(node);
    }

    pub(super) fn wake(&mut self, node: &NodeId, shard: ShardId, epoch: Epoch, entity: &EntityId) {
        let now = self.now;
        let Some(k) = entity.as_str().strip_prefix('e').and_then(|k| k.parse::<u32>().ok()) else {
            self.ledger.violations.push(format!("t={now} woke {entity}, which no client uses"));
            return;
        };
        if self.entity_shard.get(k as usize) != Some(&shard) {
            self.ledger.violations.push(format!("t={now} woke {entity} in {shard}, not its shard"));
        }
        let Some(n) = self.nodes.get_mut(node) else { return };
        let hosts_at = n.region.hosted().into_iter().find(|(s, _)| *s == shard).map(|(_, e)| e);
        if hosts_at != Some(epoch) || !n.region.is_active(shard) {
            let msg = format!("t={now} I1: {node} woke {entity} of {shard} at {epoch} while hosting {hosts_at:?}");
            self.ledger.violations.push(msg);
        }
        n.waking += 1;
        if n.waking > PACE.at_once {
            let msg = format!("t={now} {node} has {} remembered entities recovering, over {}", n.waking, PACE.at_once);
            self.ledger.violations.push(msg);
        }
        n.entities.entry(k).or_insert_with(|| Entity { shard, mailbox: VecDeque::new() });
        if let Some(owner) = self.live.get(&k).filter(|o| *o != node) {
            self.ledger.violations.push(format!("t={now} I1: entity e{k} live on {owner} and {node}"));
        }
        self.live.insert(k, node.clone());
        let at = now + self.rng.range(1, 20);
        self.schedule(at, Ev::Woken { node: node.clone(), shard, epoch, entity: k });
    }

    pub(super) fn woken(&mut self, node: &NodeId, shard: ShardId, epoch: Epoch, entity: u32) {
        let now = self.now;
        // A fenced node's entities are aborted, and still say they are gone.
        let Some(n) = self.nodes.get_mut(node).filter(|n| n.alive) else { return };
        n.waking = n.waking.saturating_sub(1);
        n.region.handle_woken(now, shard, epoch, &EntityId::new(format!("e{entity}")));
        self.pump(node);
    }

    /// After the quiet period, every remembered entity is live on its shard's owner: claims and
    /// reads the journal could not answer were asked again, and no wake was lost.
    pub(super) fn check_remembered(&mut self) {
        if !self.p.remember {
            return;
        }
        for k in 0..self.p.entities {
            let shard = self.entity_shard[k as usize];
            let owner = self.nodes.values().find(|n| n.alive && !n.fenced && n.region.is_active(shard));
            let Some(owner) = owner else { continue };
            if self.live.get(&k) != Some(&owner.id) {
                let msg = format!("remembered e{k} of {shard} is not live on its owner {}", owner.id);
                self.ledger.violations.push(msg);
            }
        }
    }
}
