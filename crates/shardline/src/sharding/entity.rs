//! The contract between the sharding runtime and the application: the [`Entity`] trait that
//! shard hosts run, and the [`EntityContext`] they give it. It is defined here, in the layer that
//! hosts entities, and re-exported by [`crate::entity`], which builds the typed API on it.

use std::any::{Any, TypeId};
use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use shardline_core::{EntityId, Epoch, ShardId};

use super::claim::ShardClaim;
use super::reminder::{stored, Reminder, ShardReminders, When};
use super::settings::Persistence;
use crate::error::Error;
use crate::journal::{Fence, Journal, JournalError, ReminderChange, RequestId};

/// A sharded, stateful entity. Its state lives in memory on one node: see the
/// [module docs](crate::entity) for what happens to it when its shard moves, and implement
/// [`hand_over`](Entity::hand_over)/[`take_over`](Entity::take_over) to keep it across moves.
pub trait Entity: Sized + Send + 'static {
    /// What it receives.
    type Message: Serialize + DeserializeOwned + Send + 'static;
    /// What it answers.
    type Reply: Serialize + DeserializeOwned + Send + 'static;

    /// A fresh instance for `id` (called when the entity starts, or restarts after passivation).
    fn new(id: &EntityId) -> Self;

    /// Handles one message. Messages from one sender arrive in the order sent.
    fn handle(&mut self, ctx: &mut EntityContext, msg: Self::Message) -> impl Future<Output = Self::Reply> + Send;

    /// Runs once before the first message of this instance.
    fn started(&mut self, _ctx: &mut EntityContext) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Runs when the instance stops: passivation, hand-off, leave. Not on a crash or fencing.
    fn stopped(&mut self, _ctx: &mut EntityContext) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// State to carry to the next owner when the entity's shard moves by hand-off (rebalance,
    /// graceful leave), taken after `stopped`. The default, None, starts the entity fresh there
    /// (the usual choice for entities that keep their state in a journal).
    fn hand_over(&self) -> Option<Vec<u8>> {
        None
    }

    /// Rebuilds an entity on the new owner from what [`hand_over`](Self::hand_over) returned.
    fn take_over(_id: &EntityId, _data: &[u8]) -> Option<Self> {
        None
    }

    /// A durable reminder this entity set ([`EntityContext::remind`]) is due. Runs like a
    /// message, in order with them. `Ok` acknowledges it (a repeating one waits for its next
    /// time); an error, a panic or a crash before the acknowledgement is stored fires it again
    /// (after a second, or on the shard's next owner): at least once, so make the handling
    /// idempotent, for instance with [`Reminder::firing_id`]. The default handles none: it logs
    /// a warning and acknowledges.
    fn reminded(
        &mut self,
        ctx: &mut EntityContext,
        reminder: Reminder,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        tracing::warn!(entity = %ctx.id, type_key = %ctx.type_key, reminder = reminder.name(), "reminder fired, but this entity type does not handle reminders (Entity::reminded)");
        async { Ok(()) }
    }
}

/// The entity types registered on a node, as its entities reach them
/// ([`EntityContext::entities`](crate::EntityContext::entities)); the node implements it, so
/// that the contract names nothing above it.
pub(crate) trait Registry: Send + Sync {
    /// The region of a registered type, by the type's `TypeId`.
    fn typed(&self, id: TypeId) -> Option<Arc<dyn Any + Send + Sync>>;
    /// What the layers above keep for the entities of a type key (a daemon's worker): several
    /// types may share one Rust type, which `typed` cannot tell apart.
    fn extension(&self, type_key: &str) -> Option<Arc<dyn Any + Send + Sync>>;
}

/// What an entity knows about itself while it runs.
pub struct EntityContext {
    pub(crate) id: EntityId,
    pub(crate) shard: ShardId,
    pub(crate) epoch: Epoch,
    pub(crate) passivate: bool,
    pub(crate) registry: Arc<dyn Registry>,
    pub(crate) type_key: Arc<str>,
    pub(crate) claim: Option<Arc<ShardClaim>>,
    pub(crate) persistence: Persistence,
    /// The shard's reminders, for a type that has them.
    pub(crate) reminders: Option<Arc<ShardReminders>>,
    /// The request id of the command being decided ([`EntityContext::request_id`]).
    pub(crate) request: Option<RequestId>,
}

impl EntityContext {
    /// The entity's id.
    pub fn id(&self) -> &EntityId {
        &self.id
    }

    /// Its shard.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// The epoch at which this node hosts the shard: a fencing token for journal writes.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The request id of the command an event-sourced entity is deciding
    /// ([`EventSourced::decide_with`](crate::EventSourced::decide_with)), None elsewhere. A
    /// decision may run more than once for one request (its append failed, or its outcome was
    /// unknown): an ask it makes under an id [derived](RequestId::derive) from this one is
    /// applied once however often the decision runs, and answered with its first reply.
    pub fn request_id(&self) -> Option<&RequestId> {
        self.request.as_ref()
    }

    /// The entity's type.
    pub fn type_key(&self) -> &str {
        &self.type_key
    }

    /// The journal of the entity's type, when its settings name one.
    pub fn journal(&self) -> Option<&Arc<dyn Journal>> {
        self.claim.as_ref().map(|c| c.journal())
    }

    /// The fence journal writes of this entity carry: its type, shard and current epoch.
    pub fn fence(&self) -> Fence {
        Fence { type_key: self.type_key.to_string(), shard: self.shard, epoch: self.epoch }
    }

    /// Makes sure the journal's fence of this shard is raised to this node's epoch before the
    /// entity reads or writes its journal. `Fenced` when a newer owner raised it further:
    /// this node no longer owns the shard, and must neither read nor write.
    pub async fn claim_shard(&self) -> Result<(), JournalError> {
        match &self.claim {
            Some(c) => c.ensure(self.epoch).await,
            None => Err(JournalError::Failed(format!("entity type {} has no journal", self.type_key))),
        }
    }

    /// Sets the durable reminder `name` of this entity, replacing one of that name: it is stored
    /// in the type's journal (fenced by this shard's epoch) before this returns, and fires
    /// [`Entity::reminded`] when due, on whichever node hosts the shard then, at least once.
    /// `Rejected` for a type without [`EntitySettings::reminders`](crate::EntitySettings::reminders),
    /// an empty name, a zero period or a time that cannot be stored; `Unavailable` when the
    /// journal refused or could not be reached (nothing was stored); `OutcomeUnknown` when the
    /// connection was lost while it committed (it may be stored: setting it again is safe).
    ///
    /// ```no_run
    /// # use shardline::{EntityContext, When};
    /// # use std::time::Duration;
    /// # async fn f(ctx: &mut EntityContext) -> Result<(), shardline::Error> {
    /// ctx.remind("expire", When::After(Duration::from_secs(24 * 3600))).await?;
    /// ctx.remind("ping", When::Every(Duration::from_secs(60))).await?;
    /// # Ok(()) }
    /// ```
    pub async fn remind(&self, name: &str, when: When) -> Result<(), Error> {
        let r = stored(self.id.as_str(), name, when, std::time::SystemTime::now())?;
        self.change_reminder(ReminderChange::Set(r)).await
    }

    /// Cancels the reminder `name` of this entity (nothing when there is none). The same errors
    /// as [`remind`](Self::remind).
    pub async fn cancel_reminder(&self, name: &str) -> Result<(), Error> {
        let change = ReminderChange::Cancel { entity_id: self.id.as_str().to_string(), name: name.to_string() };
        self.change_reminder(change).await
    }

    async fn change_reminder(&self, change: ReminderChange) -> Result<(), Error> {
        let (Some(_), Some(claim)) = (&self.reminders, &self.claim) else {
            return Err(Error::Rejected(format!(
                "entity type {} keeps no reminders: give its settings a journal and .reminders()",
                self.type_key
            )));
        };
        let stored = match claim.ensure(self.epoch).await {
            Ok(()) => claim.journal().change_reminders(&self.fence(), vec![change.clone()]).await,
            Err(e) => Err(e),
        };
        self.reminders_appended(std::slice::from_ref(&change), &stored);
        match stored {
            Ok(()) => Ok(()),
            Err(JournalError::Failed(m)) => Err(Error::Rejected(m)),
            // Stored or not: the schedule reads the journal again to find out.
            Err(e @ JournalError::CommitUnknown(_)) => {
                Err(Error::OutcomeUnknown(format!("the reminder may or may not be stored: {e}")))
            }
            Err(e) => Err(Error::Unavailable(format!("the reminder was not stored: {e}"))),
        }
    }

    /// The reminder changes of a write of this entity's (an append of its events, or `remind`),
    /// after it: the shard's schedule learns those committed, and reads the journal again after
    /// a commit of unknown outcome. A refused write changed nothing.
    pub(crate) fn reminders_appended<T>(&self, changes: &[ReminderChange], appended: &Result<T, JournalError>) {
        let Some(r) = &self.reminders else { return };
        for c in changes {
            match appended {
                Ok(_) => r.changed(c),
                Err(JournalError::CommitUnknown(_)) => r.unsure(c),
                Err(_) => {}
            }
        }
    }

    /// Whether this entity's type keeps reminders.
    pub(crate) fn has_reminders(&self) -> bool {
        self.reminders.is_some()
    }

    /// Stop this entity after the current message; the next message starts it again.
    pub fn passivate(&mut self) {
        self.passivate = true;
    }
}
