//! [`EntitySettings`]: how one entity type is sharded, hosted and persisted.

use std::sync::Arc;
use std::time::Duration;

use shardline_core::host::PassivationPolicy;
use shardline_core::{RoundLimit, ShardId};

use crate::journal::Journal;

/// How an entity type uses its journal.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Persistence {
    pub event_sourced: EventSourcedSettings,
    /// Remembered entities restart, at most this many per second, when their shard starts.
    pub remember: Option<u32>,
    /// And at most this many of them recovering at once on one node.
    pub remember_at_once: usize,
    /// Durable reminders: each hosted shard reads and fires its entities' reminders.
    pub reminders: Option<shardline_core::reminder::ScheduleConfig>,
}

impl Default for Persistence {
    fn default() -> Self {
        Persistence {
            event_sourced: EventSourcedSettings::default(),
            remember: None,
            remember_at_once: 64,
            reminders: None,
        }
    }
}

/// Settings of one entity type.
#[derive(Clone, Debug)]
pub struct EntitySettings {
    pub(crate) type_key: String,
    pub(crate) shards: u32,
    pub(crate) passivate_after: Option<Duration>,
    pub(crate) max_active: Option<usize>,
    pub(crate) passivation_policy: PassivationPolicy,
    pub(crate) ask_timeout: Duration,
    pub(crate) mailbox: usize,
    pub(crate) max_buffered: usize,
    pub(crate) hand_off_timeout: Duration,
    pub(crate) rebalance_interval: Duration,
    pub(crate) strategy: StrategyKind,
    pub(crate) rebalance_limit: Option<RoundLimit>,
    pub(crate) partition_key: Option<PartitionKey>,
    /// Chooses the shard outright (a daemon's worker index is its shard), instead of hashing.
    pub(crate) shard_by: Option<ShardBy>,
    pub(crate) journal: Option<JournalRef>,
    pub(crate) persistence: Persistence,
}

/// What [`EntitySettings::journal`] takes: a journal, or an `Arc` of one.
pub trait IntoJournal {
    /// The journal, shared.
    fn into_journal(self) -> Arc<dyn Journal>;
}

impl<J: Journal> IntoJournal for J {
    fn into_journal(self) -> Arc<dyn Journal> {
        Arc::new(self)
    }
}

impl<J: Journal> IntoJournal for Arc<J> {
    fn into_journal(self) -> Arc<dyn Journal> {
        self
    }
}

impl IntoJournal for Arc<dyn Journal> {
    fn into_journal(self) -> Arc<dyn Journal> {
        self
    }
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

/// Maps an entity id to its shard directly.
#[derive(Clone)]
pub(crate) struct ShardBy(pub(crate) Arc<dyn Fn(&str) -> ShardId + Send + Sync>);

impl std::fmt::Debug for ShardBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardBy(..)")
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
    /// Placement decided outside (e.g. aligned with Kafka partitions), given through
    /// [`Cluster::assign_shards`](crate::Cluster::assign_shards) or the admin API's
    /// `PUT /api/shards`; shards it does not name, or whose named node cannot host them now, are
    /// placed as by `LeastShards`.
    External,
}

impl EntitySettings {
    /// Settings for a type named `type_key` with defaults: 1,024 shards, no idle passivation,
    /// 5 s ask timeout, mailbox of 1,024, 100,000 buffered messages per region.
    pub fn new(type_key: impl Into<String>) -> Self {
        EntitySettings {
            type_key: type_key.into(),
            shards: 1_024,
            passivate_after: None,
            max_active: None,
            passivation_policy: PassivationPolicy::default(),
            ask_timeout: Duration::from_secs(5),
            mailbox: 1_024,
            max_buffered: 100_000,
            hand_off_timeout: Duration::from_secs(10),
            rebalance_interval: Duration::from_secs(10),
            strategy: StrategyKind::default(),
            rebalance_limit: None,
            partition_key: None,
            shard_by: None,
            journal: None,
            persistence: Persistence::default(),
        }
    }

    /// Where entities of this type keep their journal. A node that starts hosting a shard
    /// raises the shard's fence in it first, so that writes from an older owner are refused by
    /// the database (see [`EntityContext::claim_shard`](crate::EntityContext::claim_shard)).
    ///
    /// Takes any journal, or an `Arc` of one to share it between types:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use shardline::journal::InMemoryJournal;
    /// use shardline::{EntitySettings, Journal};
    ///
    /// let carts = EntitySettings::new("cart").journal(InMemoryJournal::new());
    /// let shared: Arc<dyn Journal> = Arc::new(InMemoryJournal::new());
    /// let orders = EntitySettings::new("order").journal(shared.clone());
    /// ```
    pub fn journal(mut self, journal: impl IntoJournal) -> Self {
        self.journal = Some(JournalRef(journal.into_journal()));
        self
    }

    /// Remember entities: an entity that wrote to the journal is remembered in its shard, and
    /// when the shard starts on a node (a move, a failover), its remembered entities start again
    /// at once, at most `per_second` of them per second and at most
    /// [`remember_at_once`](Self::remember_at_once) recovering at a time on the node (many
    /// thousands recovering at the same moment would swamp the journal: a node that took over a
    /// hundred thousand of them timed its asks out). For event-sourced types.
    pub fn remember_entities(mut self, per_second: u32) -> Self {
        self.persistence.remember = Some(per_second.max(1));
        self
    }

    /// Durable reminders for this type's entities ([`EntityContext::remind`](crate::EntityContext::remind)),
    /// kept in its [`journal`](Self::journal): each node reads the reminders of the shards it
    /// hosts, due within the next 30 s, and fires them. A type without it refuses `remind`.
    ///
    /// ```
    /// use shardline::EntitySettings;
    ///
    /// let orders = EntitySettings::new("order").reminders();
    /// ```
    pub fn reminders(mut self) -> Self {
        self.persistence.reminders = Some(shardline_core::reminder::ScheduleConfig::default());
        self
    }

    /// How many remembered entities of this type may be starting at once on one node, across all
    /// its shards (default 64): the next one starts when one of them has recovered, so their
    /// restart goes as fast as the journal answers and no faster.
    ///
    /// ```
    /// use shardline::EntitySettings;
    ///
    /// let devices = EntitySettings::new("device").remember_entities(10_000).remember_at_once(16);
    /// ```
    pub fn remember_at_once(mut self, n: usize) -> Self {
        self.persistence.remember_at_once = n.max(1);
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
        if let Some(by) = &self.shard_by {
            return (by.0)(id);
        }
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

    /// Keep at most `n` entities of this type in memory on each node (idle or running): past
    /// it, each entity that comes in passivates the one used least recently (its stop hook
    /// runs; an event-sourced entity recovers from its journal on its next message). Idle
    /// passivation bounds memory only as fast as entities go quiet; this bounds it under a burst
    /// of distinct ids. Running entities are never stopped for it: a node may be over by the
    /// entities whose tasks are running. See [`passivation_policy`](Self::passivation_policy)
    /// to keep a hot set through a scan of one-off ids.
    ///
    /// ```
    /// use shardline::{EntitySettings, PassivationPolicy};
    ///
    /// let sessions = EntitySettings::new("session")
    ///     .max_active(100_000)
    ///     .passivation_policy(PassivationPolicy::FrequencyAdmission);
    /// ```
    pub fn max_active(mut self, n: usize) -> Self {
        self.max_active = Some(n.max(1));
        self
    }

    /// Which entity [`max_active`](Self::max_active) passivates to make room: the least
    /// recently used (default), or W-TinyLFU's frequency admission, under which an id seen once
    /// does not push out one asked for often (Akka's admission policy). Without `max_active`
    /// it does nothing.
    pub fn passivation_policy(mut self, policy: PassivationPolicy) -> Self {
        self.passivation_policy = policy;
        self
    }

    /// Default timeout of `ask`. Deadlines are kept to the millisecond, rounded up, so that
    /// none is early: a timeout of 1.2 ms waits 2 ms.
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

    /// How often the coordinator looks at the placement and moves shards (default 10 s): a
    /// node that joins gets shards at the next round.
    pub fn rebalance_interval(mut self, d: Duration) -> Self {
        self.rebalance_interval = d;
        self
    }

    /// How long regions may take to acknowledge a hand-off.
    pub fn hand_off_timeout(mut self, d: Duration) -> Self {
        self.hand_off_timeout = d;
        self
    }
}

/// Settings of an event-sourced type, on top of its [`EntitySettings`].
#[derive(Clone, Copy, Debug)]
pub struct EventSourcedSettings {
    /// Write a snapshot after this many events (0: never).
    pub snapshot_every: u64,
    /// How long a caller may retry a request ([`RequestId`](crate::RequestId)) and still have
    /// it applied once: its reply is kept this long (plus [`CLOCK_SKEW_MARGIN`], since callers,
    /// nodes and the database each read their own clock), however many requests come between.
    /// A retry of a request issued longer ago is refused with
    /// [`Error::RequestExpired`](crate::Error::RequestExpired), never applied again.
    pub reply_retention: Duration,
    /// Replies an entity keeps in memory (its newest): a retry found there costs no read. One
    /// that is not is still recognised by the journal, in the append's transaction.
    pub replies_in_memory: usize,
}

/// How far apart the clocks of callers, nodes and the journal's database may be: replies are
/// kept for [`EventSourcedSettings::reply_retention`] plus this, so that a retry an entity still
/// accepts always finds its reply.
pub const CLOCK_SKEW_MARGIN: Duration = Duration::from_secs(60);

impl Default for EventSourcedSettings {
    /// A snapshot every 100 events; replies kept for 15 minutes, the newest 64 per entity in
    /// memory.
    fn default() -> Self {
        EventSourcedSettings {
            snapshot_every: 100,
            reply_retention: Duration::from_secs(15 * 60),
            replies_in_memory: 64,
        }
    }
}
