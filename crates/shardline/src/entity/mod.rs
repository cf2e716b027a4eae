//! Layer 4: typed entities.
//!
//! An [`Entity`] is a piece of state with an id, handling one message at a time. Shardline keeps
//! at most one live instance per id in the cluster. An idle entity costs little more than its
//! state: a task and a mailbox exist only while it has messages.
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

pub(crate) mod host;

use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use shardline_core::{EntityId, Epoch, ShardId};

use crate::cluster::Cluster;

/// A sharded, stateful entity.
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
    pub(crate) cluster: Cluster,
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

    /// Stop this entity after the current message; the next message starts it again.
    pub fn passivate(&mut self) {
        self.passivate = true;
    }

    /// The cluster, to message other entities.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
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
}

/// Which allocation strategy the coordinator uses.
#[derive(Clone, Debug, PartialEq)]
pub enum StrategyKind {
    /// Fewest shards first, bounded rounds (default).
    LeastShards {
        /// Most shards moved per round.
        absolute_limit: usize,
        /// Most shards moved per round, as a fraction.
        relative_limit: f64,
    },
    /// Newest app version first; no rebalance while versions are mixed.
    VersionAware,
    /// Consistent hashing with virtual nodes.
    ConsistentHash,
    /// Contiguous ranges over the ordered members.
    Ranges,
}

impl Default for StrategyKind {
    /// `LeastShards`, moving at most 1,000 shards or half of them per round.
    fn default() -> Self {
        StrategyKind::LeastShards { absolute_limit: 1_000, relative_limit: 0.5 }
    }
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
        }
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

    /// How long regions may take to acknowledge a hand-off.
    pub fn hand_off_timeout(mut self, d: Duration) -> Self {
        self.hand_off_timeout = d;
        self
    }
}
