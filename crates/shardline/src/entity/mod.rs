//! Layer 4: typed entities.
//!
//! An [`Entity`] is a piece of state with an id, handling one message at a time. Shardline keeps
//! at most one live instance per id in the cluster. An idle entity costs little more than its
//! state: a task and a mailbox exist only while it has messages.
//!
//! **Where the state lives.** An entity's state is in the memory of the node that hosts its
//! shard, and nowhere else. When the shard moves (a node joins and shards are rebalanced, a node
//! leaves gracefully), the entity starts again on its new node from [`Entity::new`], *unless* it
//! implements [`hand_over`](Entity::hand_over) and [`take_over`](Entity::take_over), which carry
//! its state to the new owner with the hand-off. A crashed node hands nothing over, and
//! passivation ends the instance: state that must outlive those belongs in a journal or a
//! database. `examples/counter.rs` shows state that survives moves; `examples/devices.rs` adds
//! passivation and a partition key.
//!
//! ```no_run
//! use shardline::{Entity, EntityContext, EntityId};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! enum Cmd { Add(i64), Get }
//!
//! struct Counter { n: i64 }
//!
//! impl Entity for Counter {
//!     type Message = Cmd;
//!     type Reply = i64;
//!     fn new(_id: &EntityId) -> Self { Counter { n: 0 } }
//!     async fn handle(&mut self, _ctx: &mut EntityContext, msg: Cmd) -> i64 {
//!         if let Cmd::Add(k) = msg { self.n += k; }
//!         self.n
//!     }
//! }
//! ```

mod claim;
pub mod event_sourced;
mod handles;
pub(crate) mod host;

pub use event_sourced::{EventSourced, EventSourcedHandle, EventSourcedSettings, Persist, PersistError, Persistent};

pub(crate) use claim::ShardClaim;
pub use handles::{Entities, EntityHandle, EntityRef};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use shardline_core::{EntityId, Epoch, RoundLimit, ShardId};

use crate::journal::{Fence, Journal, JournalError};

/// A sharded, stateful entity. Its state lives in memory on one node: see the
/// [module docs](self) for what happens to it when its shard moves, and implement
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
}

/// What an entity knows about itself while it runs.
pub struct EntityContext {
    pub(crate) id: EntityId,
    pub(crate) shard: ShardId,
    pub(crate) epoch: Epoch,
    pub(crate) passivate: bool,
    pub(crate) entities: Entities,
    pub(crate) type_key: Arc<str>,
    pub(crate) claim: Option<Arc<ShardClaim>>,
    pub(crate) persistence: Persistence,
}

/// How an entity type uses its journal.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Persistence {
    pub event_sourced: EventSourcedSettings,
    /// Remembered entities restart, at most this many per second, when their shard starts.
    pub remember: Option<u32>,
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

    /// Stop this entity after the current message; the next message starts it again.
    pub fn passivate(&mut self) {
        self.passivate = true;
    }

    /// The entity types registered on this node, to message other entities:
    /// `ctx.entities().handle::<Other>()`.
    pub fn entities(&self) -> &Entities {
        &self.entities
    }
}

/// Settings of one entity type.
#[derive(Clone, Debug)]
pub struct EntitySettings {
    pub(crate) type_key: String,
    pub(crate) shards: u32,
    pub(crate) passivate_after: Option<Duration>,
    pub(crate) ask_timeout: Duration,
    pub(crate) mailbox: usize,
    pub(crate) max_buffered: usize,
    pub(crate) hand_off_timeout: Duration,
    pub(crate) rebalance_interval: Duration,
    pub(crate) strategy: StrategyKind,
    pub(crate) rebalance_limit: Option<RoundLimit>,
    pub(crate) partition_key: Option<PartitionKey>,
    pub(crate) journal: Option<JournalRef>,
    pub(crate) persistence: Persistence,
}

/// The journal of an entity type (its own type only so that settings stay `Debug`).
#[derive(Clone)]
pub(crate) struct JournalRef(pub(crate) Arc<dyn Journal>);

impl std::fmt::Debug for JournalRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Journal(..)")
    }
}

/// Maps an entity id to the part of it that is hashed to choose its shard.
#[derive(Clone)]
pub(crate) struct PartitionKey(pub(crate) Arc<dyn for<'a> Fn(&'a str) -> &'a str + Send + Sync>);

impl std::fmt::Debug for PartitionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PartitionKey(..)")
    }
}

/// Which allocation strategy the coordinator uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum StrategyKind {
    /// Fewest shards first, in bounded rounds, newest application version first (default).
    #[default]
    LeastShards,
    /// Newest app version first; no rebalance while versions are mixed (Shardcake).
    VersionAware,
    /// Consistent hashing with virtual nodes.
    ConsistentHash,
    /// Contiguous ranges over the ordered members.
    Ranges,
}

impl EntitySettings {
    /// Settings for a type named `type_key` with defaults: 1,024 shards, no idle passivation,
    /// 5 s ask timeout, mailbox of 1,024, 100,000 buffered messages per region.
    pub fn new(type_key: impl Into<String>) -> Self {
        EntitySettings {
            type_key: type_key.into(),
            shards: 1_024,
            passivate_after: None,
            ask_timeout: Duration::from_secs(5),
            mailbox: 1_024,
            max_buffered: 100_000,
            hand_off_timeout: Duration::from_secs(10),
            rebalance_interval: Duration::from_secs(10),
            strategy: StrategyKind::default(),
            rebalance_limit: None,
            partition_key: None,
            journal: None,
            persistence: Persistence::default(),
        }
    }

    /// Where entities of this type keep their journal. A node that starts hosting a shard
    /// raises the shard's fence in it first, so that writes from an older owner are refused by
    /// the database (see [`EntityContext::claim_shard`]).
    pub fn journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = Some(JournalRef(journal));
        self
    }

    /// Remember entities: an entity that wrote to the journal is remembered in its shard, and
    /// when the shard starts on a node (a move, a failover), its remembered entities start again
    /// at once, at most `per_second` of them per second (many thousands recovering at the same
    /// moment would swamp the journal). For event-sourced types.
    pub fn remember_entities(mut self, per_second: u32) -> Self {
        self.persistence.remember = Some(per_second.max(1));
        self
    }

    /// Which part of an entity id chooses its shard (default: the whole id, hashed with
    /// `xxh3`). Entities whose ids map to the same key always share a shard, so they live on one
    /// node and move together: every device of one home, an owner and the objects it owns. Every
    /// node must use the same function for a type, as it must use the same number of shards.
    ///
    /// ```
    /// use shardline::EntitySettings;
    ///
    /// // "home-7/thermostat" and "home-7/door" land in the shard of "home-7".
    /// let devices = EntitySettings::new("device")
    ///     .partition_key(|id| id.split_once('/').map_or(id, |(home, _)| home));
    /// ```
    pub fn partition_key(mut self, key: impl for<'a> Fn(&'a str) -> &'a str + Send + Sync + 'static) -> Self {
        self.partition_key = Some(PartitionKey(Arc::new(key)));
        self
    }

    /// The shard entity `id` belongs to under these settings.
    pub fn shard_of(&self, id: &str) -> ShardId {
        let key = match &self.partition_key {
            Some(k) => (k.0)(id),
            None => id,
        };
        shardline_core::shard_of(key, self.shards)
    }

    /// Number of shards (must be the same on every node).
    pub fn shards(mut self, n: u32) -> Self {
        self.shards = n;
        self
    }

    /// Stop entities idle for this long.
    pub fn passivate_after(mut self, d: Duration) -> Self {
        self.passivate_after = Some(d);
        self
    }

    /// Default timeout of `ask`.
    pub fn ask_timeout(mut self, d: Duration) -> Self {
        self.ask_timeout = d;
        self
    }

    /// Messages an entity may have waiting; more are refused with `Overloaded`.
    pub fn mailbox(mut self, n: usize) -> Self {
        self.mailbox = n.max(1);
        self
    }

    /// Messages a region may buffer while homes are unknown or moving.
    pub fn max_buffered(mut self, n: usize) -> Self {
        self.max_buffered = n;
        self
    }

    /// The allocation strategy.
    pub fn strategy(mut self, s: StrategyKind) -> Self {
        self.strategy = s;
        self
    }

    /// Most shards with a live owner that one rebalance round moves: at most `absolute` (0: no
    /// absolute limit) and at most `relative` × shards, and at least one. Unowned shards are
    /// always placed at once. Default: 100 or a tenth of the shards for `LeastShards` and
    /// `VersionAware`, no limit for `ConsistentHash` and `Ranges`.
    pub fn rebalance_limit(mut self, absolute: usize, relative: f64) -> Self {
        self.rebalance_limit = Some(RoundLimit { absolute, relative });
        self
    }

    /// How long regions may take to acknowledge a hand-off.
    pub fn hand_off_timeout(mut self, d: Duration) -> Self {
        self.hand_off_timeout = d;
        self
    }
}
