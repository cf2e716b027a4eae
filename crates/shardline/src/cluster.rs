//! The node: builder, entity registration, typed references, graceful leave.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::io::Write;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use shardline_core::{Departure, DepartureStep, DomainEvent, EntityId, Epoch, NodeId, ShardId, TypeKey};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::entity::{Entity, EntitySettings};
use crate::error::{ConfigError, Error};
use crate::membership::{ClusterView, MembershipControl, MembershipProvider, ProviderContext, Seeds};
use crate::sharding::coordinator::Coordinator;
use crate::sharding::envelope::Body;
use crate::sharding::pending::Pending;
use crate::sharding::region::{Region, RegionDyn};
use crate::transport::{Frame, Inbound, Transport, TransportConfig};

/// Builds a [`Cluster`] node.
pub struct ClusterBuilder {
    cluster_name: String,
    node_name: Option<String>,
    bind: String,
    membership: Option<Box<dyn MembershipProvider>>,
    roles: Vec<String>,
    app_version: String,
    weight: u32,
    proxy: bool,
    transport: Option<TransportConfig>,
    ownership_log: Option<std::path::PathBuf>,
}

impl ClusterBuilder {
    /// Cluster name; nodes of other clusters are refused (default `"shardline"`).
    pub fn cluster_name(mut self, name: impl Into<String>) -> Self {
        self.cluster_name = name.into();
        self
    }

    /// Stable node name (default: the bound address).
    pub fn node_name(mut self, name: impl Into<String>) -> Self {
        self.node_name = Some(name.into());
        self
    }

    /// Listen address (default `127.0.0.1:0`, any free port).
    pub fn bind(mut self, addr: impl Into<String>) -> Self {
        self.bind = addr.into();
        self
    }

    /// Membership provider (default: `Seeds` with no seeds, a single-node cluster).
    pub fn membership(mut self, provider: impl MembershipProvider) -> Self {
        self.membership = Some(Box::new(provider));
        self
    }

    /// Membership provider chosen at run time.
    pub fn membership_boxed(mut self, provider: Box<dyn MembershipProvider>) -> Self {
        self.membership = Some(provider);
        self
    }

    /// Application version (rolling updates with `VersionAware`).
    pub fn app_version(mut self, v: impl Into<String>) -> Self {
        self.app_version = v.into();
        self
    }

    /// Relative capacity (consistent hashing gives the node `150 × weight` virtual nodes).
    pub fn weight(mut self, w: u32) -> Self {
        self.weight = w.max(1);
        self
    }

    /// Adds a role.
    pub fn role(mut self, r: impl Into<String>) -> Self {
        self.roles.push(r.into());
        self
    }

    /// A proxy node routes messages but hosts no entity and never leads.
    pub fn proxy(mut self) -> Self {
        self.proxy = true;
        self
    }

    /// Transport settings (max frame, queue sizes, backoff).
    pub fn transport(mut self, config: TransportConfig) -> Self {
        self.transport = Some(config);
        self
    }

    /// Appends `time_ms node type shard epoch start|stop` lines to this file whenever a shard
    /// starts or stops here (for ownership checks).
    pub fn ownership_log(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.ownership_log = Some(path.into());
        self
    }

    /// Starts the node: binds, starts membership, begins serving.
    pub async fn build(self) -> Result<Cluster, ConfigError> {
        if self.cluster_name.is_empty() {
            return Err(ConfigError::Invalid { name: "cluster_name", reason: "must not be empty".into() });
        }
        let incarnation = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(1);
        let bind = self.bind.clone();
        let listener = tokio::net::TcpListener::bind(&bind)
            .await
            .map_err(|source| ConfigError::Bind { addr: bind.clone(), source })?;
        let addr = listener.local_addr().map_err(|source| ConfigError::Bind { addr: bind.clone(), source })?;
        let name = self.node_name.clone().unwrap_or_else(|| addr.to_string());
        let tconf = self.transport.unwrap_or_else(|| TransportConfig::new(self.cluster_name.clone()));
        let tconf = TransportConfig { cluster: self.cluster_name.clone(), ..tconf };
        let transport = Transport::new(NodeId::new(name, incarnation), &listener, tconf)
            .map_err(|source| ConfigError::Bind { addr: bind.clone(), source })?;
        let me = transport.me().clone();
        let (gossip_tx, gossip_rx) = mpsc::channel(1024);
        let mut roles = self.roles.clone();
        if self.proxy {
            roles.push(shardline_core::PROXY_ROLE.into());
        }
        let provider = self.membership.unwrap_or_else(|| Box::new(Seeds::new(Vec::<String>::new())));
        let handle = provider
            .start(ProviderContext {
                me: me.clone(),
                addr,
                roles,
                app_version: self.app_version.clone(),
                weight: self.weight,
                transport: transport.clone(),
                gossip: gossip_rx,
            })
            .await?;
        let (events, _) = broadcast::channel(4096);
        let log = match self.ownership_log {
            Some(p) => {
                Some(Mutex::new(std::fs::OpenOptions::new().create(true).append(true).open(&p).map_err(|e| {
                    ConfigError::Invalid { name: "ownership_log", reason: format!("{}: {e}", p.display()) }
                })?))
            }
            None => None,
        };
        let (down_tx, down_rx) = watch::channel(None);
        let inner = Arc::new(NodeInner {
            me: me.clone(),
            addr,
            transport: transport.clone(),
            clock: Instant::now(),
            proxy: self.proxy,
            regions: RwLock::new(HashMap::new()),
            typed: RwLock::new(HashMap::new()),
            coordinators: Mutex::new(HashMap::new()),
            pending: Pending::new(),
            view: Mutex::new(ClusterView::default()),
            control: handle.control,
            maps: handle.maps,
            lease: handle.lease,
            gossip_tx,
            events,
            log,
            fenced: AtomicBool::new(false),
            down_tx,
            down_rx,
        });
        transport.start(listener, Arc::new(Dispatcher(Arc::downgrade(&inner))));
        let cluster = Cluster { inner };
        tokio::spawn(watch_membership(cluster.clone(), handle.views));
        tokio::spawn(sweep_pending(Arc::downgrade(&cluster.inner)));
        info!(node = %me, %addr, "node started");
        Ok(cluster)
    }
}

pub(crate) struct NodeInner {
    me: NodeId,
    addr: std::net::SocketAddr,
    transport: Transport,
    clock: Instant,
    proxy: bool,
    regions: RwLock<HashMap<TypeKey, Arc<dyn RegionDyn>>>,
    typed: RwLock<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    coordinators: Mutex<HashMap<TypeKey, Arc<Coordinator>>>,
    pending: Pending,
    view: Mutex<ClusterView>,
    control: Arc<dyn MembershipControl>,
    maps: Option<crate::membership::lease::ShardMaps>,
    lease: Option<crate::membership::HostingLease>,
    gossip_tx: mpsc::Sender<(NodeId, crate::membership::seeds::Gossip)>,
    events: broadcast::Sender<(TypeKey, DomainEvent)>,
    log: Option<Mutex<std::fs::File>>,
    fenced: AtomicBool,
    down_tx: watch::Sender<Option<String>>,
    down_rx: watch::Receiver<Option<String>>,
}

/// How long a leaving node waits for a leader to coordinate its hand-offs before it stops its
/// shards itself (a leader is normally there at once; none means every other member is
/// unreachable or the store is down).
const LEADERLESS_LEAVE: Duration = Duration::from_secs(5);

/// A running node of the cluster. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<NodeInner>,
}

impl Cluster {
    /// Starts building a node.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder {
            cluster_name: "shardline".into(),
            node_name: None,
            bind: "127.0.0.1:0".into(),
            membership: None,
            roles: Vec::new(),
            app_version: "1".into(),
            weight: 1,
            proxy: false,
            transport: None,
            ownership_log: None,
        }
    }

    /// This node.
    pub fn node_id(&self) -> &NodeId {
        &self.inner.me
    }

    /// Where it listens.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.inner.addr
    }

    pub(crate) fn transport(&self) -> &Transport {
        &self.inner.transport
    }

    pub(crate) fn pending(&self) -> &Pending {
        &self.inner.pending
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.inner.clock.elapsed().as_millis() as u64
    }

    /// The membership as last seen.
    pub fn view(&self) -> ClusterView {
        self.inner.view.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Domain events of the coordinators running on this node.
    pub fn events(&self) -> broadcast::Receiver<(TypeKey, DomainEvent)> {
        self.inner.events.subscribe()
    }

    /// Resolves when this node was declared down or fenced, with the reason.
    pub async fn downed(&self) -> String {
        let mut rx = self.inner.down_rx.clone();
        loop {
            if let Some(r) = rx.borrow_and_update().clone() {
                return r;
            }
            if rx.changed().await.is_err() {
                return "node dropped".into();
            }
        }
    }

    pub(crate) fn publish(&self, type_key: &TypeKey, e: DomainEvent) {
        info!(type_key = %type_key, event = ?e, "cluster event");
        let _ = self.inner.events.send((type_key.clone(), e));
    }

    /// Whether this node may process messages now: its lease, where it has one, is valid.
    pub(crate) fn may_host(&self) -> bool {
        self.inner.lease.as_ref().is_none_or(|l| l.is_valid())
    }

    /// Fences this node if its lease ran out (a paused process wakes up here before its
    /// provider notices). Must not be called with an engine or the coordinators locked.
    fn fence_if_lapsed(&self) {
        if self.inner.lease.as_ref().is_some_and(|l| l.has_lapsed()) {
            self.fence("lease ran out");
        }
    }

    pub(crate) fn ownership_log(&self, type_key: &TypeKey, shard: ShardId, epoch: Epoch, start: bool) {
        if let Some(log) = &self.inner.log {
            let mut now = SystemTime::now();
            // A shard stopped after the lease ran out (the process was paused) was idle since
            // the lease's end: every message checks the lease before it is processed.
            if let Some(until) =
                self.inner.lease.as_ref().filter(|l| !start && l.has_lapsed()).and_then(|l| l.valid_until())
            {
                now -= until.elapsed();
            }
            let ms = now.duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
            let what = if start { "start" } else { "stop" };
            // One write per line: appends from several processes to one file stay whole.
            let line = format!("{ms} {} {type_key} {} {epoch} {what}\n", self.inner.me, shard.0);
            let mut f = log.lock().unwrap_or_else(|e| e.into_inner());
            let _ = f.write_all(line.as_bytes());
        }
    }

    /// Registers an entity type on this node and returns its handle.
    pub async fn register<E: Entity>(&self, settings: EntitySettings) -> Result<EntityHandle<E>, ConfigError> {
        if settings.shards == 0 {
            return Err(ConfigError::Invalid { name: "shards", reason: "must be at least 1".into() });
        }
        if settings.type_key.is_empty() {
            return Err(ConfigError::Invalid { name: "type_key", reason: "must not be empty".into() });
        }
        let key = TypeKey::new(&settings.type_key);
        if self.inner.regions.read().unwrap_or_else(|e| e.into_inner()).contains_key(&key) {
            return Err(ConfigError::DuplicateType(settings.type_key));
        }
        let region = Region::<E>::new(self.clone(), settings, self.inner.proxy);
        self.inner.regions.write().unwrap_or_else(|e| e.into_inner()).insert(key, region.clone());
        self.inner.typed.write().unwrap_or_else(|e| e.into_inner()).insert(TypeId::of::<E>(), region.clone());
        let view = self.view();
        self.apply_view(&view);
        Ok(EntityHandle { region, _e: PhantomData })
    }

    /// Registers an event-sourced type: its entities keep their state in `settings`' journal
    /// (required, except on a [proxy](ClusterBuilder::proxy), which hosts nothing), so it survives
    /// moves and crashes alike.
    pub async fn register_event_sourced<T: crate::entity::EventSourced>(
        &self,
        settings: EntitySettings,
        es: crate::entity::EventSourcedSettings,
    ) -> Result<crate::entity::EventSourcedHandle<T>, ConfigError> {
        if settings.journal.is_none() && !self.inner.proxy {
            return Err(ConfigError::Invalid {
                name: "journal",
                reason: format!("event-sourced type {} needs EntitySettings::journal", settings.type_key),
            });
        }
        let mut settings = settings;
        settings.persistence.event_sourced = es;
        let inner = self.register::<crate::entity::Persistent<T>>(settings).await?;
        Ok(crate::entity::EventSourcedHandle { inner, _t: PhantomData })
    }

    /// The handle of a registered type.
    pub fn handle<E: Entity>(&self) -> Option<EntityHandle<E>> {
        let any = self.inner.typed.read().unwrap_or_else(|e| e.into_inner()).get(&TypeId::of::<E>()).cloned()?;
        any.downcast::<Region<E>>().ok().map(|region| EntityHandle { region, _e: PhantomData })
    }

    fn regions(&self) -> Vec<Arc<dyn RegionDyn>> {
        self.inner.regions.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    fn region(&self, key: &TypeKey) -> Option<Arc<dyn RegionDyn>> {
        self.inner.regions.read().unwrap_or_else(|e| e.into_inner()).get(key).cloned()
    }

    /// Applies a membership view: addresses, fencing, coordinators, regions.
    fn apply_view(&self, v: &ClusterView) {
        *self.inner.view.lock().unwrap_or_else(|e| e.into_inner()) = v.clone();
        for (node, addr) in &v.addresses {
            if v.is_fenced(node) {
                self.inner.transport.forget(node);
            } else {
                self.inner.transport.set_address(node, *addr);
            }
        }
        if v.view.get(&self.inner.me).is_some_and(|m| m.status == shardline_core::MemberStatus::Down) {
            self.fence("declared down by the cluster");
            return;
        }
        if self.inner.fenced.load(Ordering::Acquire) {
            return;
        }
        let regions = self.regions();
        {
            let mut coords = self.inner.coordinators.lock().unwrap_or_else(|e| e.into_inner());
            match &v.leader {
                Some((leader, term)) if leader == &self.inner.me && !self.inner.proxy => {
                    for r in &regions {
                        let s = r.settings();
                        let key = TypeKey::new(&s.type_key);
                        match coords.get(&key) {
                            Some(c) if c.term == *term => c.on_membership(&v.view),
                            _ => {
                                if let Some(old) = coords.remove(&key) {
                                    old.stop();
                                }
                                let maps = self.inner.maps.clone();
                                coords.insert(key, Coordinator::start(self.clone(), s, *term, &v.view, maps));
                            }
                        }
                    }
                }
                _ => {
                    for (_, c) in coords.drain() {
                        c.stop();
                    }
                }
            }
        }
        if let Some((leader, term)) = &v.leader {
            for r in regions {
                r.on_coordinator_changed(leader.clone(), *term);
            }
        }
    }

    /// This node lost its right to host: stop everything at once.
    fn fence(&self, why: &str) {
        if self.inner.fenced.swap(true, Ordering::AcqRel) {
            return;
        }
        warn!(node = %self.inner.me, reason = why, "node fenced: stopping every shard");
        for (_, c) in self.inner.coordinators.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            c.stop();
        }
        for r in self.regions() {
            r.on_fenced();
        }
        let _ = self.inner.down_tx.send(Some(why.to_string()));
    }

    /// Graceful leave: hands every shard of this node off, then leaves the membership.
    /// Messages sent meanwhile are not lost. Waits at most `timeout`.
    pub async fn leave_within(&self, timeout: Duration) -> Result<(), Error> {
        info!(node = %self.inner.me, "leaving the cluster");
        self.inner.control.leave();
        let deadline = Instant::now() + timeout;
        let mut departure = Departure::new(LEADERLESS_LEAVE.as_millis() as u64);
        loop {
            let hosting: Vec<_> = self.regions().into_iter().filter(|r| !r.hosted().is_empty()).collect();
            let step = departure.step(self.now_ms(), &self.view().view, &self.inner.me, !hosting.is_empty());
            match step {
                DepartureStep::Done => break,
                _ if Instant::now() > deadline => return Err(Error::Timeout(timeout)),
                DepartureStep::Wait => {}
                DepartureStep::StopHere { reason, first } => {
                    if first {
                        warn!(
                            node = %self.inner.me,
                            reason = reason.as_str(),
                            "leaving without hand-off: stopping this node's shards here"
                        );
                    }
                    for r in hosting {
                        r.stop_all();
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if departure.stopped_alone() {
            // Messages for this node's shards that arrived while they stopped have nowhere to go.
            for r in self.regions() {
                r.fail_buffered("the node left and no other member could take its shards");
            }
        }
        for r in self.regions() {
            r.flush_all();
        }
        while !self.regions().iter().all(|r| r.is_settled()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.inner.control.exit();
        // Let the last gossip carry the exit out.
        tokio::time::sleep(Duration::from_millis(600)).await;
        for r in self.regions() {
            r.fail_buffered("node left the cluster");
            // Refuse what callers still send here, as not processed, instead of buffering it.
            r.on_fenced();
        }
        for (_, c) in self.inner.coordinators.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            c.stop();
        }
        self.inner.transport.shutdown();
        info!(node = %self.inner.me, "left the cluster");
        Ok(())
    }

    /// [`leave_within`](Self::leave_within) with a 60 s limit.
    pub async fn leave(&self) -> Result<(), Error> {
        self.leave_within(Duration::from_secs(60)).await
    }

    /// Stops this node abruptly (its peers see it as crashed: no goodbye, its lease just lapses).
    /// For tests.
    pub fn crash(&self) {
        self.inner.control.halt();
        self.fence("crashed on purpose");
        self.inner.transport.shutdown();
    }

    /// Shards each owner hosts, as the coordinator running on this node knows them (empty when
    /// this node does not lead).
    pub fn shard_counts(&self, type_key: &str) -> HashMap<NodeId, usize> {
        let c = self.inner.coordinators.lock().unwrap_or_else(|e| e.into_inner()).get(&TypeKey::new(type_key)).cloned();
        c.and_then(|c| c.map())
            .map(|m| m.counts().into_iter().map(|(k, v)| (k.clone(), v)).collect())
            .unwrap_or_default()
    }
}

struct Dispatcher(std::sync::Weak<NodeInner>);

impl Inbound for Dispatcher {
    fn on_frame(&self, from: &NodeId, frame: Frame) {
        let Some(inner) = self.0.upgrade() else { return };
        let cluster = Cluster { inner };
        if !matches!(frame, Frame::Reply { .. } | Frame::Gossip(_)) {
            cluster.fence_if_lapsed();
        }
        match frame {
            Frame::Gossip(g) => {
                let _ = cluster.inner.gossip_tx.try_send((from.clone(), g));
            }
            Frame::ToCoordinator { type_key, msg } => {
                let c = cluster.inner.coordinators.lock().unwrap_or_else(|e| e.into_inner()).get(&type_key).cloned();
                if let Some(c) = c {
                    c.on_frame(from, msg);
                }
            }
            Frame::ToRegion { type_key, msg } => match cluster.region(&type_key) {
                Some(r) => r.on_coordinator_frame(from, msg),
                None => {
                    tracing::debug!(%type_key, peer = %from, "coordinator message for an entity type not registered here")
                }
            },
            Frame::Region { type_key, msg } => match cluster.region(&type_key) {
                Some(r) => r.on_region_frame(from, msg),
                None => {
                    warn!(%type_key, peer = %from, "message for an unknown entity type");
                    if let shardline_core::RegionMessage::Forward { msg, .. } = msg {
                        if let Some(addr) = msg.reply {
                            let err = Error::Rejected(format!(
                                "entity type {type_key} is not registered on {}",
                                cluster.inner.me
                            ));
                            let _ = cluster
                                .transport()
                                .send(&addr.node, Frame::Reply { req_id: addr.req_id, result: Err(err) });
                        }
                    }
                }
            },
            Frame::Reply { req_id, result } => cluster.inner.pending.complete(req_id, result),
            Frame::Hello { .. } | Frame::HelloOk { .. } | Frame::Refuse { .. } => {
                warn!(peer = %from, "handshake frame after the handshake: ignored")
            }
        }
    }

    fn on_link_down(&self, peer: &NodeId) {
        let Some(inner) = self.0.upgrade() else { return };
        for r in (Cluster { inner }).regions() {
            r.on_link_down(peer);
        }
    }

    fn on_unsendable(&self, peer: &NodeId, frame: Frame, error: crate::TransportError) {
        let Some(inner) = self.0.upgrade() else { return };
        let cluster = Cluster { inner };
        match frame {
            // Never written, so never processed: the asker may resend (a smaller message).
            Frame::Region { msg: shardline_core::RegionMessage::Forward { msg, .. }, .. }
            | Frame::Region { msg: shardline_core::RegionMessage::Bounce { msg, .. }, .. } => {
                if let Some(addr) = msg.reply {
                    let err = Error::Rejected(format!("message to {} cannot be sent: {error}", msg.entity));
                    let _ =
                        cluster.transport().send(&addr.node, Frame::Reply { req_id: addr.req_id, result: Err(err) });
                } else {
                    warn!(peer = %peer, entity = %msg.entity, %error, "a told message cannot be sent: dropped");
                }
            }
            // The entity ran: its asker learns that the reply, not the message, was lost.
            Frame::Reply { req_id, result: Ok(_) } => {
                let err = Error::ReplyLost(format!("the reply cannot be sent: {error}"));
                let _ = cluster.transport().send(peer, Frame::Reply { req_id, result: Err(err) });
            }
            // Protocol frames are repeated on timers; the writer logged and counted this one.
            _ => {}
        }
    }

    fn on_undeliverable(&self, peer: &NodeId, frame: Frame) {
        let Some(inner) = self.0.upgrade() else { return };
        let cluster = Cluster { inner };
        if let Frame::Region { type_key, msg } = frame {
            if let Some(r) = cluster.region(&type_key) {
                r.on_undeliverable(peer, msg);
            }
        }
    }
}

async fn watch_membership(cluster: Cluster, mut views: watch::Receiver<ClusterView>) {
    loop {
        let v = views.borrow_and_update().clone();
        cluster.apply_view(&v);
        if views.changed().await.is_err() {
            return;
        }
    }
}

async fn sweep_pending(inner: std::sync::Weak<NodeInner>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(i) = inner.upgrade() else { return };
        i.pending.sweep();
    }
}

/// A registered entity type on this node.
pub struct EntityHandle<E: Entity> {
    region: Arc<Region<E>>,
    _e: PhantomData<fn() -> E>,
}

impl<E: Entity> Clone for EntityHandle<E> {
    fn clone(&self) -> Self {
        EntityHandle { region: self.region.clone(), _e: PhantomData }
    }
}

impl<E: Entity> EntityHandle<E> {
    /// A reference to entity `id` (no I/O: the entity starts on its first message).
    pub fn entity_ref(&self, id: impl AsRef<str>) -> EntityRef<E> {
        EntityRef { region: self.region.clone(), id: EntityId::new(id) }
    }

    /// The type's default ask timeout.
    pub fn ask_timeout(&self) -> Duration {
        self.region.ask_timeout()
    }

    /// The shard entity `id` belongs to.
    pub fn shard_of(&self, id: impl AsRef<str>) -> ShardId {
        self.region.shard_of(id.as_ref())
    }

    /// The owner of every shard as this node's region knows it (None: unknown).
    pub fn shard_homes(&self) -> Vec<Option<NodeId>> {
        self.region.homes()
    }

    /// Shards hosted on this node, with the epoch each is hosted at (the fencing token its
    /// entities carry).
    pub fn hosted_epochs(&self) -> Vec<(ShardId, Epoch)> {
        self.region.hosted()
    }

    /// Shards hosted on this node.
    pub fn hosted_shards(&self) -> Vec<ShardId> {
        self.region.hosted().into_iter().map(|(s, _)| s).collect()
    }

    /// Entities in memory on this node (idle and active).
    pub fn local_entities(&self) -> usize {
        self.region.entity_count()
    }

    /// Entities on this node with a running task (the others are idle state in memory).
    pub fn active_entities(&self) -> usize {
        self.region.active_count()
    }
}

/// A reference to one entity, valid anywhere in the cluster.
pub struct EntityRef<E: Entity> {
    region: Arc<Region<E>>,
    id: EntityId,
}

impl<E: Entity> Clone for EntityRef<E> {
    fn clone(&self) -> Self {
        EntityRef { region: self.region.clone(), id: self.id.clone() }
    }
}

impl<E: Entity> EntityRef<E> {
    /// The entity's id.
    pub fn id(&self) -> &EntityId {
        &self.id
    }

    /// Sends `msg` and waits for the reply, up to the type's default timeout.
    pub async fn ask(&self, msg: E::Message) -> Result<E::Reply, Error> {
        self.ask_timeout(msg, self.region.ask_timeout()).await
    }

    /// Sends `msg` and waits for the reply, up to `timeout`.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the reply; the message may still be processed.
    pub async fn ask_timeout(&self, msg: E::Message, timeout: Duration) -> Result<E::Reply, Error> {
        let (tx, rx) = oneshot::channel();
        self.region.send(self.id.clone(), Body::Typed { msg, reply: Some(tx) })?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r,
            // Nobody will answer: the entity panicked or its task was torn down mid-message.
            Ok(Err(_)) => Err(Error::OutcomeUnknown("the ask ended without a reply".into())),
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }

    /// Sends `msg` without waiting. Fails at once when the local region refuses it; after that,
    /// delivery is at most once.
    pub fn tell(&self, msg: E::Message) -> Result<(), Error> {
        self.region.send(self.id.clone(), Body::Typed { msg, reply: None })
    }
}
