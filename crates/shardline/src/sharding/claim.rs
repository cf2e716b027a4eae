//! `ShardClaim`: a hosted shard's fence in the journal, raised before its entities read or write.
//!
//! A node that starts hosting a shard at epoch e raises the shard's stored fence to e before any
//! of its entities touches the journal; from then on, a node still hosting it at an older epoch
//! (paused, partitioned, slow to learn) is refused by the database on every write. The raise is
//! started when the shard starts and awaited by the first entity that needs it; a raised epoch
//! (the shard stays here at a newer epoch) is claimed again.

use std::sync::{Arc, Mutex};

use shardline_core::{Epoch, ShardId};

use crate::journal::{Fence, Journal, JournalError};

/// The journal claim of one hosted shard.
pub(crate) struct ShardClaim {
    journal: Arc<dyn Journal>,
    type_key: String,
    shard: ShardId,
    /// The newest epoch this node raised the fence to.
    raised: Mutex<Option<Epoch>>,
}

impl ShardClaim {
    pub fn new(journal: Arc<dyn Journal>, type_key: &str, shard: ShardId) -> Arc<Self> {
        Arc::new(ShardClaim { journal, type_key: type_key.to_string(), shard, raised: Mutex::new(None) })
    }

    pub fn journal(&self) -> &Arc<dyn Journal> {
        &self.journal
    }

    pub fn type_key(&self) -> &str {
        &self.type_key
    }

    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// The fence writes at `epoch` carry.
    pub fn fence(&self, epoch: Epoch) -> Fence {
        Fence { type_key: self.type_key.clone(), shard: self.shard, epoch }
    }

    /// Raises the stored fence to `epoch` unless this node already did. `Fenced` when the
    /// stored fence is newer: another node owns the shard now.
    pub async fn ensure(&self, epoch: Epoch) -> Result<(), JournalError> {
        if self.raised.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|r| r >= epoch) {
            return Ok(());
        }
        let fence = self.fence(epoch);
        fence.admitted_by(Some(self.journal.raise_fence(&fence).await?))?;
        let mut raised = self.raised.lock().unwrap_or_else(|e| e.into_inner());
        *raised = Some(raised.map_or(epoch, |r| r.max(epoch)));
        Ok(())
    }
}
