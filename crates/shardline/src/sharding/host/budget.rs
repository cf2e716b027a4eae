//! The node's budget of entities in memory for one type ([`EntitySettings::max_active`]): the
//! core's [`ActiveLimit`] behind a lock, shared by the type's hosted shards, and the passivation
//! of the entities it picks, wherever their shard is on this node.
//!
//! [`EntitySettings::max_active`]: crate::EntitySettings::max_active

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};

use shardline_core::host::{ActiveLimit, Evicted, PassivationPolicy};
use shardline_core::{EntityId, ShardId};

use super::ShardHost;
use crate::sharding::entity::Entity;

pub(crate) struct Budget<E: Entity> {
    limit: Mutex<ActiveLimit<(ShardId, EntityId)>>,
    /// The type's hosted shards on this node, to reach an entity the limit picked.
    hosts: RwLock<HashMap<ShardId, Weak<ShardHost<E>>>>,
}

impl<E: Entity> Budget<E> {
    pub fn new(max: usize, policy: PassivationPolicy) -> Arc<Self> {
        Arc::new(Budget { limit: Mutex::new(ActiveLimit::new(max, policy)), hosts: RwLock::new(HashMap::new()) })
    }

    fn limit(&self) -> std::sync::MutexGuard<'_, ActiveLimit<(ShardId, EntityId)>> {
        self.limit.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A shard started here.
    pub fn hosting(&self, host: &Arc<ShardHost<E>>) {
        self.hosts.write().unwrap_or_else(|e| e.into_inner()).insert(host.shard, Arc::downgrade(host));
    }

    /// A shard stopped here: its entities no longer count.
    pub fn stopped(&self, shard: ShardId) {
        self.hosts.write().unwrap_or_else(|e| e.into_inner()).remove(&shard);
        self.limit().remove_where(|(s, _)| *s == shard);
    }

    /// An entity left memory some other way (idle, failed, passivated itself).
    pub fn forget(&self, shard: ShardId, id: &EntityId) {
        self.limit().remove(&(shard, id.clone()));
    }

    /// `id` of `host` got a message or started: passivates what the limit picks to make room.
    /// Called with no engine lock held.
    pub fn touch(&self, host: &Arc<ShardHost<E>>, id: &EntityId) {
        let picked = self.limit().touch((host.shard, id.clone()));
        for (shard, id) in picked {
            let owner = if shard == host.shard { Some(host.clone()) } else { self.host(shard) };
            let Some(owner) = owner else { continue };
            let evicted = owner.lock().evict(&id);
            // A running one leaves once its mailbox is empty (its task runs the stop hook);
            // one gone already needs nothing.
            if let Evicted::Stop(state) = evicted {
                owner.stop_evicted(id, state);
            }
        }
    }

    fn host(&self, shard: ShardId) -> Option<Arc<ShardHost<E>>> {
        self.hosts.read().unwrap_or_else(|e| e.into_inner()).get(&shard).and_then(Weak::upgrade)
    }
}
