//! [`Node`]: what the sharding runtime (regions, coordinators, shard hosts) needs of the node it
//! runs on, and nothing more. They hold this narrow handle, not the whole `Cluster`: the node's
//! lifecycle (views, fencing, leaving) stays above them, and they cannot reach into it.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use shardline_core::{DomainEvent, Epoch, NodeId, ShardId, Term, TypeKey};
use tokio::sync::broadcast;
use tracing::{debug, info};

use super::ask::deadlines::Deadlines;
use super::ask::pending::Pending;
use super::entity::Registry;
use super::message::NodeTransport;
use crate::clock::Clock;
use crate::membership::{HostingLease, MembershipControl};

/// The node as the sharding runtime sees it. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Node {
    shared: Arc<Shared>,
}

struct Shared {
    me: NodeId,
    transport: NodeTransport,
    pending: Pending,
    deadlines: Deadlines,
    clock: Clock,
    lease: Option<HostingLease>,
    /// The membership's controls: where a fence found above this cluster's terms is told.
    membership: Arc<dyn MembershipControl>,
    events: broadcast::Sender<(TypeKey, DomainEvent)>,
    log: Option<Mutex<std::fs::File>>,
    /// Each registered type's region, by the entity's Rust type (downcast by typed handles).
    typed: RwLock<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    /// What the layers above keep per type key for the type's entities (a daemon's worker).
    extensions: RwLock<HashMap<String, Arc<dyn Any + Send + Sync>>>,
}

impl Node {
    pub fn new(
        transport: NodeTransport,
        clock: Clock,
        lease: Option<HostingLease>,
        membership: Arc<dyn MembershipControl>,
        log: Option<std::fs::File>,
    ) -> Node {
        let (events, _) = broadcast::channel(4096);
        Node {
            shared: Arc::new(Shared {
                me: transport.me().clone(),
                transport,
                pending: Pending::new(),
                deadlines: Deadlines::start(clock),
                clock,
                lease,
                membership,
                events,
                log: log.map(Mutex::new),
                typed: RwLock::new(HashMap::new()),
                extensions: RwLock::new(HashMap::new()),
            }),
        }
    }

    pub fn id(&self) -> &NodeId {
        &self.shared.me
    }

    /// The journal refused a claim of this node's: a shard's fence is stored at `term` (see
    /// [`MembershipControl::fenced_above`]).
    pub fn fenced_above(&self, term: Term) {
        self.shared.membership.fenced_above(term);
    }

    pub fn transport(&self) -> &NodeTransport {
        &self.shared.transport
    }

    /// Asks waiting for a remote reply.
    pub fn pending(&self) -> &Pending {
        &self.shared.pending
    }

    /// The deadlines of the asks waiting on this node.
    pub fn deadlines(&self) -> &Deadlines {
        &self.shared.deadlines
    }

    pub fn now_ms(&self) -> u64 {
        self.shared.clock.now_ms()
    }

    pub fn lease(&self) -> Option<&HostingLease> {
        self.shared.lease.as_ref()
    }

    /// Whether this node may process messages now: its lease, where it has one, is valid.
    pub fn may_host(&self) -> bool {
        self.shared.lease.as_ref().is_none_or(|l| l.is_valid())
            || crate::sabotage::is(crate::sabotage::Sabotage::IgnoreLease)
    }

    /// Whether this node's lease was ever granted (a node without one counts as granted): a
    /// lease granted and run out is not waited for.
    pub fn lease_granted(&self) -> bool {
        self.lease().is_none_or(|l| l.valid_until().is_some() || l.has_lapsed())
    }

    /// Hands a coordinator's domain event to whoever listens (and the log).
    pub fn publish(&self, type_key: &TypeKey, e: DomainEvent) {
        // One shard's move is a line per shard (a thousand at a node's start): debug. What
        // concerns the whole cluster, and a hand-off that timed out, stay at info.
        match e {
            DomainEvent::ShardAssigned { .. }
            | DomainEvent::ShardMigrated { .. }
            | DomainEvent::StaleShardStopped { .. } => {
                debug!(type_key = %type_key, event = ?e, "cluster event")
            }
            _ => info!(type_key = %type_key, event = ?e, "cluster event"),
        }
        let _ = self.shared.events.send((type_key.clone(), e));
    }

    /// Hands on an event the leader's node relayed (it logged it already).
    pub fn publish_relayed(&self, type_key: &TypeKey, e: DomainEvent) {
        let _ = self.shared.events.send((type_key.clone(), e));
    }

    pub fn events(&self) -> broadcast::Receiver<(TypeKey, DomainEvent)> {
        self.shared.events.subscribe()
    }

    /// Appends `time_ms node type shard epoch start|stop` to the ownership log, if there is one.
    pub fn ownership_log(&self, type_key: &TypeKey, shard: ShardId, epoch: Epoch, start: bool) {
        let Some(log) = &self.shared.log else { return };
        let mut now = SystemTime::now();
        // A shard stopped after the lease ran out (the process was paused) was idle since the
        // lease's end: every message checks the lease before it is processed.
        if let Some(until) = self.lease().filter(|l| !start && l.has_lapsed()).and_then(|l| l.valid_until()) {
            now -= std::time::Duration::from_millis(self.now_ms().saturating_sub(until));
        }
        let ms = now.duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        let what = if start { "start" } else { "stop" };
        // One write per line: appends from several processes to one file stay whole.
        let line = format!("{ms} {} {type_key} {} {epoch} {what}\n", self.shared.me, shard.0);
        let mut f = log.lock().unwrap_or_else(|e| e.into_inner());
        let _ = f.write_all(line.as_bytes());
    }

    /// Records the region of entity type `id` (a Rust type).
    pub fn add_typed(&self, id: TypeId, region: Arc<dyn Any + Send + Sync>) {
        self.shared.typed.write().unwrap_or_else(|e| e.into_inner()).insert(id, region);
    }

    /// The region of entity type `id`, if registered.
    pub fn typed(&self, id: TypeId) -> Option<Arc<dyn Any + Send + Sync>> {
        self.shared.typed.read().unwrap_or_else(|e| e.into_inner()).get(&id).cloned()
    }

    /// Keeps `value` for the entities of `type_key` (see [`Registry::extension`]).
    pub fn add_extension(&self, type_key: &str, value: Arc<dyn Any + Send + Sync>) {
        self.shared.extensions.write().unwrap_or_else(|e| e.into_inner()).insert(type_key.to_string(), value);
    }
}

impl Registry for Node {
    fn typed(&self, id: TypeId) -> Option<Arc<dyn Any + Send + Sync>> {
        Node::typed(self, id)
    }

    fn extension(&self, type_key: &str) -> Option<Arc<dyn Any + Send + Sync>> {
        self.shared.extensions.read().unwrap_or_else(|e| e.into_inner()).get(type_key).cloned()
    }
}
