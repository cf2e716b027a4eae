//! The shard map: where every shard lives, at which epoch, and the map's version.
//!
//! The epoch of a shard is its fencing token. It grows at every (re)allocation, and it is made of
//! the coordinator's leadership term and a counter, so an allocation by a newer coordinator
//! always outranks every allocation made before it, even when the new coordinator never saw
//! them. A node hosting a shard carries the epoch on journal writes and replies; anything
//! carrying an older epoch is rejected.

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::id::{NodeId, ShardId};
use crate::membership::MembershipView;

/// A leadership term of the coordinator. Every new leader has a strictly larger term.
pub type Term = u64;

/// Fencing token of one allocation of a shard: ordered by term, then by counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Epoch {
    /// Term of the coordinator that made the allocation.
    pub term: Term,
    /// Counter within the term.
    pub seq: u64,
}

impl Epoch {
    /// The epoch never handed out: older than every allocation.
    pub const ZERO: Epoch = Epoch { term: 0, seq: 0 };

    /// The epoch a coordinator of `term` gives to the next allocation after `self`: always
    /// above it. None when there is none within the term (the counter is at its maximum, which
    /// only a corrupt stored map or report can bring): the shard cannot be allocated again,
    /// rather than at an epoch that would not fence its previous owner.
    pub fn next(self, term: Term) -> Option<Epoch> {
        if self.term < term {
            Some(Epoch { term, seq: 1 })
        } else {
            self.seq.checked_add(1).map(|seq| Epoch { term: self.term, seq })
        }
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.term, self.seq)
    }
}

/// Where a shard lives: its owner and the epoch of that allocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardHome {
    /// The node hosting the shard.
    pub owner: NodeId,
    /// The allocation's fencing token.
    pub epoch: Epoch,
}

/// One entry of the map. The epoch is kept when the shard has no owner, so the next allocation
/// still gets a larger one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSlot {
    /// Current owner, if allocated.
    pub owner: Option<NodeId>,
    /// Epoch of the latest allocation.
    pub epoch: Epoch,
}

impl ShardSlot {
    /// The home, when allocated.
    pub fn home(&self) -> Option<ShardHome> {
        self.owner.as_ref().map(|o| ShardHome { owner: o.clone(), epoch: self.epoch })
    }
}

/// A shard map that breaks the rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// A shard number outside `0..num_shards`.
    #[error("{shard} is out of range (num_shards = {num_shards})")]
    ShardOutOfRange {
        /// The shard.
        shard: ShardId,
        /// The map's size.
        num_shards: u32,
    },
    /// An owner that is not a member allowed to host.
    #[error("{shard} is owned by {owner}, which is not a member that may host")]
    OwnerCannotHost {
        /// The shard.
        shard: ShardId,
        /// The owner.
        owner: NodeId,
    },
    /// The map has no shards.
    #[error("a shard map needs at least one shard")]
    Empty,
    /// No epoch above the shard's exists in the coordinator's term (see [`Epoch::next`]).
    #[error("{shard} has no epoch left above {epoch}")]
    EpochExhausted {
        /// The shard.
        shard: ShardId,
        /// Its epoch.
        epoch: Epoch,
    },
}

/// Shard → (owner, epoch), plus a version that grows at every change.
///
/// ```
/// use shardline_core::{NodeId, ShardId, ShardMap};
/// let mut map = ShardMap::new(4).unwrap();
/// let a = NodeId::new("a", 1);
/// let e1 = map.assign(ShardId(2), a.clone(), 7).unwrap();
/// assert_eq!(map.home(ShardId(2)).unwrap().owner, a);
/// assert_eq!(map.version(), 1);
/// let e2 = map.assign(ShardId(2), NodeId::new("b", 1), 7).unwrap();
/// assert!(e2 > e1);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMap {
    version: u64,
    slots: Vec<ShardSlot>,
}

impl ShardMap {
    /// A map of `num_shards` unallocated shards, version 0.
    pub fn new(num_shards: u32) -> Result<Self, MapError> {
        if num_shards == 0 {
            return Err(MapError::Empty);
        }
        Ok(ShardMap { version: 0, slots: vec![ShardSlot::default(); num_shards as usize] })
    }

    /// A new map of `num_shards` that resumes from a stored one: its homes and epoch floors
    /// taken, its version not (a stored map is read, not trusted to count). A stored map with
    /// another number of shards (the type was reconfigured) gives nothing.
    pub fn resume(num_shards: u32, stored: Option<&ShardMap>) -> Result<Self, MapError> {
        let mut map = ShardMap::new(num_shards)?;
        if let Some(stored) = stored.filter(|s| s.num_shards() == num_shards) {
            for (shard, slot) in stored.iter() {
                map.raise_epoch(shard, slot.epoch)?;
                if let Some(home) = slot.home() {
                    map.adopt(shard, home)?;
                }
            }
        }
        Ok(map)
    }

    /// Number of shards.
    pub fn num_shards(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Version: grows by one at every change.
    pub fn version(&self) -> u64 {
        self.version
    }

    fn check(&self, shard: ShardId) -> Result<usize, MapError> {
        if shard.index() < self.slots.len() {
            Ok(shard.index())
        } else {
            Err(MapError::ShardOutOfRange { shard, num_shards: self.num_shards() })
        }
    }

    /// The slot of a shard (None when out of range).
    pub fn slot(&self, shard: ShardId) -> Option<&ShardSlot> {
        self.slots.get(shard.index())
    }

    /// The home of a shard, if allocated.
    pub fn home(&self, shard: ShardId) -> Option<ShardHome> {
        self.slot(shard).and_then(ShardSlot::home)
    }

    /// The owner of a shard, if allocated.
    pub fn owner(&self, shard: ShardId) -> Option<&NodeId> {
        self.slot(shard).and_then(|s| s.owner.as_ref())
    }

    /// Allocates a shard to `owner` with a new epoch from a coordinator of `term`.
    pub fn assign(&mut self, shard: ShardId, owner: NodeId, term: Term) -> Result<Epoch, MapError> {
        let i = self.check(shard)?;
        let slot = &mut self.slots[i];
        slot.epoch = slot.epoch.next(term).ok_or(MapError::EpochExhausted { shard, epoch: slot.epoch })?;
        slot.owner = Some(owner);
        self.version += 1;
        Ok(slot.epoch)
    }

    /// Records an allocation learnt from elsewhere (a region's report, a stored map), keeping
    /// its epoch. Ignored (returns false) when the map already knows a newer epoch.
    pub fn adopt(&mut self, shard: ShardId, home: ShardHome) -> Result<bool, MapError> {
        let i = self.check(shard)?;
        let slot = &mut self.slots[i];
        if home.epoch < slot.epoch || (home.epoch == slot.epoch && slot.owner.as_ref() == Some(&home.owner)) {
            return Ok(false);
        }
        slot.epoch = home.epoch;
        slot.owner = Some(home.owner);
        self.version += 1;
        Ok(true)
    }

    /// Raises a shard's epoch floor without allocating it (e.g. from a stored map whose owner is gone).
    pub fn raise_epoch(&mut self, shard: ShardId, epoch: Epoch) -> Result<(), MapError> {
        let i = self.check(shard)?;
        if epoch > self.slots[i].epoch {
            self.slots[i].epoch = epoch;
            self.version += 1;
        }
        Ok(())
    }

    /// Removes the owner of a shard, keeping its epoch. Returns the previous owner.
    pub fn unassign(&mut self, shard: ShardId) -> Result<Option<NodeId>, MapError> {
        let i = self.check(shard)?;
        let prev = self.slots[i].owner.take();
        if prev.is_some() {
            self.version += 1;
        }
        Ok(prev)
    }

    /// Every shard with its slot.
    pub fn iter(&self) -> impl Iterator<Item = (ShardId, &ShardSlot)> {
        self.slots.iter().enumerate().map(|(i, s)| (ShardId(i as u32), s))
    }

    /// Shards without an owner.
    pub fn unallocated(&self) -> impl Iterator<Item = ShardId> + '_ {
        self.iter().filter(|(_, s)| s.owner.is_none()).map(|(id, _)| id)
    }

    /// Shards owned by `node`.
    pub fn shards_of<'a>(&'a self, node: &'a NodeId) -> impl Iterator<Item = ShardId> + 'a {
        self.iter().filter(move |(_, s)| s.owner.as_ref() == Some(node)).map(|(id, _)| id)
    }

    /// Number of shards per owner.
    pub fn counts(&self) -> HashMap<&NodeId, usize> {
        let mut counts = HashMap::new();
        for s in &self.slots {
            if let Some(o) = &s.owner {
                *counts.entry(o).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Checks that every owner is a member allowed to host (for a type restricted to `role`).
    pub fn validate(&self, view: &MembershipView, role: Option<&str>) -> Result<(), MapError> {
        for (shard, slot) in self.iter() {
            if let Some(owner) = &slot.owner {
                if !view.get(owner).is_some_and(|m| m.may_host(role)) {
                    return Err(MapError::OwnerCannotHost { shard, owner: owner.clone() });
                }
            }
        }
        Ok(())
    }
}
