//! What the region's journal commands do: claim a started shard, read its remembered entities,
//! wake one. The first two wait on the journal, so each runs in a task of its own whose result is
//! the engine's next input; a wake gives the entity a [`Woken`] that tells the engine, once the
//! entity recovered or will not, that its place is free. What is claimed, read and woken, when,
//! and how many at once is the engine's ([`RegionEngine`](shardline_core::RegionEngine)).

use std::sync::Arc;

use shardline_core::{ClaimOutcome, EntityId, Epoch, ShardId};
use tracing::{debug, warn};

use super::{Region, State};
use crate::journal::JournalError;
use crate::sharding::claim::ShardClaim;
use crate::sharding::entity::Entity;
use crate::sharding::envelope::Woken;

impl<E: Entity> Region<E> {
    /// The journal claim of a shard hosted here. The engine asks for claims and reads only for
    /// the shards it hosts, which all have a host, and only for a journaled type, whose hosts all
    /// have a claim; so None is logged, not expected.
    fn claim_of(&self, st: &State<E>, shard: ShardId) -> Option<Arc<ShardClaim>> {
        let claim = st.hosts.get(&shard).and_then(|h| h.claim().cloned());
        if claim.is_none() {
            debug!(type_key = %self.type_key, %shard, "no journal claim: the shard has no host or no journal");
        }
        claim
    }

    pub(super) fn claim_shard(self: &Arc<Self>, st: &mut State<E>, shard: ShardId, epoch: Epoch) {
        let Some(claim) = self.claim_of(st, shard) else { return };
        let me = self.clone();
        tokio::spawn(async move {
            let outcome = match claim.ensure(epoch).await {
                Ok(()) => ClaimOutcome::Claimed,
                Err(JournalError::Fenced { stored: Some(stored), .. }) => {
                    warn!(type_key = %me.type_key, %shard, %epoch, %stored, "the journal refused the shard's claim: a newer fence stands");
                    // The membership decides whether this term is one its cluster never reached.
                    me.node.fenced_above(stored.term);
                    ClaimOutcome::Refused
                }
                Err(e) => {
                    warn!(type_key = %me.type_key, %shard, %epoch, error = %e, "cannot claim the shard in the journal: asked again");
                    ClaimOutcome::Unavailable
                }
            };
            me.input(|e, now| e.handle_claimed(now, shard, epoch, outcome));
        });
    }

    pub(super) fn read_remembered(self: &Arc<Self>, st: &mut State<E>, shard: ShardId, epoch: Epoch) {
        let Some(claim) = self.claim_of(st, shard) else { return };
        let me = self.clone();
        tokio::spawn(async move {
            let ids = match claim.journal().remembered(claim.type_key(), shard).await {
                Ok(ids) => Some(ids.into_iter().map(EntityId::new).collect::<Vec<_>>()),
                Err(e) => {
                    warn!(type_key = %me.type_key, %shard, error = %e, "remembered entities cannot be read: asked again");
                    None
                }
            };
            if let Some(ids) = &ids {
                debug!(type_key = %me.type_key, %shard, remembered = ids.len(), "remembered entities read");
            }
            me.input(|e, now| e.handle_remembered(now, shard, epoch, ids));
        });
    }

    pub(super) fn wake_entity(
        self: &Arc<Self>,
        st: &mut State<E>,
        shard: ShardId,
        epoch: Epoch,
        id: EntityId,
        now: u64,
    ) {
        let Some(host) = st.hosts.get(&shard).cloned() else {
            st.engine.handle_woken(now, shard, epoch, &id);
            return;
        };
        let region = Arc::downgrade(self);
        let entity = id.clone();
        let woken = Woken::new(move || {
            // Dropped by the entity's task, or anywhere a wake is lost (a full mailbox, an aborted
            // task), the region's lock perhaps held: the engine hears of it from a task of its own.
            let Some(region) = region.upgrade() else { return };
            let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
            runtime.spawn(async move {
                // Changes no route: only wakes follow.
                region.input_then(|e, now| e.handle_woken(now, shard, epoch, &entity), false);
            });
        });
        // Nothing to start (in memory already, as after a hand-off, or the shard is stopping):
        // the engine is told here, under the lock this command runs under.
        if let Err(woken) = host.wake(id.clone(), woken) {
            woken.disarm();
            st.engine.handle_woken(now, shard, epoch, &id);
        }
    }
}
