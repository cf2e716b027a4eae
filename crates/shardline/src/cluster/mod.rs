//! The node: [`Cluster`] and its lifecycle (views applied, fencing, graceful leave), built by
//! [`ClusterBuilder`]; what arrives from peers goes to [`dispatch`]; applications talk to
//! entities through [`EntityHandle`] and [`EntityRef`].

pub(crate) mod admin;
mod admin_auth;
mod builder;
mod daemons;
mod dispatch;
mod formed;
mod readiness;
mod settings_from;

pub use admin::{AdminError, ClusterStatus, MemberReport, RebalancingReport, ShardMapReport, ShardReport};
pub use builder::ClusterBuilder;
pub use formed::Formation;
pub use readiness::Readiness;

use std::any::TypeId;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardline_core::{Closing, Departure, DepartureStep, DomainEvent, NodeId, TypeKey};
use tokio::sync::{broadcast, mpsc, watch};
use tracing::{info, warn};

use crate::entity::{Entities, Entity, EntityHandle, EntitySettings};
use crate::error::{ConfigError, Error};
use crate::membership::{ClusterView, MembershipControl};
use crate::sharding::coordinator::Coordinator;
use crate::sharding::message::NodeTransport;
use crate::sharding::node::Node;
use crate::sharding::region::{Region, RegionDyn};
use crate::sharding::types::Types;

pub(crate) struct NodeInner {
    /// What the sharding runtime sees of this node.
    pub(super) node: Node,
    pub(super) addr: std::net::SocketAddr,
    pub(super) proxy: bool,
    /// Its regions and coordinators.
    pub(super) types: Types,
    /// The view last applied (see `apply_latest_view`).
    pub(super) view: Mutex<ClusterView>,
    /// The membership's views, newest last.
    pub(super) views: watch::Receiver<ClusterView>,
    /// Held while a view is applied: one application at a time.
    pub(super) applying: Mutex<()>,
    pub(super) control: Arc<dyn MembershipControl>,
    pub(super) maps: Option<crate::membership::lease::ShardMaps>,
    pub(super) gossip_tx: mpsc::Sender<(NodeId, Vec<u8>)>,
    pub(super) fenced: AtomicBool,
    pub(super) down_tx: watch::Sender<Option<String>>,
    pub(super) down_rx: watch::Receiver<Option<String>>,
    /// Where the graceful leave is: one at a time, however it was started.
    pub(super) leave: watch::Sender<Leave>,
    /// Who may change the cluster through this node's peers.
    pub(super) admin_auth: admin_auth::AdminAuth,
}

/// Where a node's graceful leave is.
#[derive(Clone, Debug)]
pub(crate) enum Leave {
    Staying,
    Leaving,
    Left(Result<(), Error>),
}

/// How long a leaving node waits for a leader to coordinate its hand-offs before it stops its
/// shards itself (a leader is normally there at once; none means every other member is
/// unreachable or the store is down).
const LEADERLESS_LEAVE: Duration = Duration::from_secs(5);
/// How often a leave looks again at what it waits for.
const LEAVE_POLL: Duration = Duration::from_millis(20);

/// A running node of the cluster. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    pub(super) inner: Arc<NodeInner>,
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
            network: None,
            admin_secret: None,
        }
    }

    /// This node.
    pub fn node_id(&self) -> &NodeId {
        self.inner.node.id()
    }

    /// Where it listens.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.inner.addr
    }

    pub(crate) fn transport(&self) -> &NodeTransport {
        self.inner.node.transport()
    }

    fn now_ms(&self) -> u64 {
        self.inner.node.now_ms()
    }

    /// The membership as this node last applied it: its coordinators and regions act on this view
    /// (the membership may already hold a newer one, applied a moment later).
    pub fn view(&self) -> ClusterView {
        self.inner.view.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Domain events of the cluster's coordinators: those running on this node, and those the
    /// leader's node relays to every member (see [`ClusterReadModel`](shardline_core::ClusterReadModel)).
    /// A receiver that falls behind by 4,096 events misses the oldest (`Lagged`).
    pub fn events(&self) -> broadcast::Receiver<(TypeKey, DomainEvent)> {
        self.inner.node.events()
    }

    /// Resolves when this node was declared down or fenced, with the reason. Not once a leave
    /// has begun (an operator's drain, [`leave`](Self::leave)): that ends with
    /// [`left`](Self::left), even when the node's hosting ends before the leave is over.
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

    /// Fences this node if its lease ran out (a paused process wakes up here before its
    /// provider notices). Must not be called with an engine or the coordinators locked.
    pub(super) fn fence_if_lapsed(&self) {
        if crate::sabotage::is(crate::sabotage::Sabotage::IgnoreLease) {
            return;
        }
        if self.inner.node.lease().is_some_and(|l| l.has_lapsed()) {
            self.fence("lease ran out");
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
        if self.inner.types.regions.read().unwrap_or_else(|e| e.into_inner()).contains_key(&key) {
            return Err(ConfigError::DuplicateType(settings.type_key));
        }
        let region = Region::<E>::new(self.inner.node.clone(), settings, self.inner.proxy);
        self.inner.types.regions.write().unwrap_or_else(|e| e.into_inner()).insert(key, region.clone());
        self.inner.node.add_typed(TypeId::of::<E>(), region.clone());
        self.apply_latest_view();
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
        self.entities().handle::<E>()
    }

    /// The entity types registered on this node.
    pub fn entities(&self) -> Entities {
        Entities { registry: Arc::new(self.inner.node.clone()) }
    }

    pub(super) fn regions(&self) -> Vec<Arc<dyn RegionDyn>> {
        self.inner.types.regions()
    }

    /// Applies the membership's newest view: starts or stops this node's coordinators and tells
    /// the regions who leads. Both the membership watcher and `register` apply views; each takes
    /// the newest one under one lock, since an older copy applied after a newer one stops the
    /// coordinator the newer one started, and nothing starts it again while the view stays the
    /// same (a single node whose first view lost that race never allocated a shard).
    pub(super) fn apply_latest_view(&self) {
        let _one = self.inner.applying.lock().unwrap_or_else(|e| e.into_inner());
        let v = self.inner.views.borrow().clone();
        self.apply_view(&v);
    }

    /// Applies a membership view: addresses, fencing, coordinators, regions.
    fn apply_view(&self, v: &ClusterView) {
        *self.inner.view.lock().unwrap_or_else(|e| e.into_inner()) = v.clone();
        for (node, addr) in &v.addresses {
            if v.is_fenced(node) {
                self.inner.node.transport().forget(node);
            } else {
                self.inner.node.transport().set_address(node, *addr);
            }
        }
        if v.view.get(self.inner.node.id()).is_some_and(|m| m.status == shardline_core::MemberStatus::Down) {
            self.fence("declared down by the cluster");
            return;
        }
        if self.inner.fenced.load(Ordering::Acquire) {
            return;
        }
        let regions = self.regions();
        {
            let mut coords = self.inner.types.coordinators.lock().unwrap_or_else(|e| e.into_inner());
            match &v.leader {
                Some((leader, term)) if leader == self.inner.node.id() && !self.inner.proxy => {
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
                                coords
                                    .insert(key, Coordinator::start(self.inner.node.clone(), s, *term, &v.view, maps));
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
    pub(super) fn fence(&self, why: &str) {
        if self.inner.fenced.swap(true, Ordering::AcqRel) {
            return;
        }
        // A leaving node's hosting ends with its exit (a gossip member that said `Removed` may
        // host no more): that is the leave finishing, not the node being downed. Its runner
        // waits for `left`; signalling `downed` too would race it, and a drained process that
        // saw `downed` first rejoined the cluster instead of ending.
        let leaving = !matches!(*self.inner.leave.borrow(), Leave::Staying);
        if leaving {
            info!(node = %self.inner.node.id(), reason = why, "hosting ended during the leave: stopping every shard");
        } else {
            warn!(node = %self.inner.node.id(), reason = why, "node fenced: stopping every shard");
        }
        for (_, c) in self.inner.types.coordinators.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            c.stop();
        }
        for r in self.regions() {
            r.on_fenced();
        }
        if !leaving {
            let _ = self.inner.down_tx.send(Some(why.to_string()));
        }
    }

    /// Graceful leave: hands every shard of this node off, then leaves the membership.
    /// Messages sent meanwhile are not lost. Waits at most `timeout`. When the node leaves
    /// already (a drain through the admin API, an earlier call), waits for that leave instead.
    pub async fn leave_within(&self, timeout: Duration) -> Result<(), Error> {
        if !self.begin_leave() {
            return self.left().await;
        }
        self.run_leave(timeout).await
    }

    /// Resolves when this node's graceful leave is over, with its outcome, however it was started
    /// ([`leave`](Self::leave), a drain through the admin API).
    pub async fn left(&self) -> Result<(), Error> {
        let mut rx = self.inner.leave.subscribe();
        loop {
            if let Leave::Left(r) = &*rx.borrow_and_update() {
                return r.clone();
            }
            if rx.changed().await.is_err() {
                return Err(Error::Unavailable("the node was dropped".into()));
            }
        }
    }

    /// Marks the leave begun; false when it had begun already.
    pub(super) fn begin_leave(&self) -> bool {
        self.inner.leave.send_if_modified(|s| match s {
            Leave::Staying => {
                *s = Leave::Leaving;
                true
            }
            _ => false,
        })
    }

    /// Runs the leave [`begin_leave`](Self::begin_leave) marked, and records its outcome for
    /// [`left`](Self::left).
    pub(super) async fn run_leave(&self, timeout: Duration) -> Result<(), Error> {
        let r = self.leave_steps(timeout).await;
        self.inner.leave.send_replace(Leave::Left(r.clone()));
        r
    }

    async fn leave_steps(&self, timeout: Duration) -> Result<(), Error> {
        info!(node = %self.inner.node.id(), "leaving the cluster");
        self.inner.control.leave();
        let timeout_ms = timeout.as_millis().min(u128::from(u64::MAX)) as u64;
        let mut departure =
            Departure::new(LEADERLESS_LEAVE.as_millis() as u64).until(self.now_ms().saturating_add(timeout_ms));
        // The hand-offs, or the shards stopped here when nobody can take them.
        loop {
            let hosting: Vec<_> = self.regions().into_iter().filter(|r| !r.hosted().is_empty()).collect();
            let step = departure.step(self.now_ms(), &self.view().view, self.inner.node.id(), !hosting.is_empty());
            match step {
                DepartureStep::Done => break,
                DepartureStep::TimedOut => return Err(Error::Timeout(timeout)),
                DepartureStep::Wait => {}
                DepartureStep::StopHere { reason, first } => {
                    if first {
                        warn!(
                            node = %self.inner.node.id(),
                            reason = reason.as_str(),
                            "leaving without hand-off: stopping this node's shards here"
                        );
                    }
                    for r in hosting {
                        r.stop_all();
                    }
                }
            }
            tokio::time::sleep(LEAVE_POLL).await;
        }
        // The closing, in the order the departure gives.
        loop {
            let settled = self.regions().iter().all(|r| r.is_settled());
            match departure.close_step(self.now_ms(), settled) {
                Closing::RefuseWaiting => {
                    // Messages for this node's shards that arrived while they stopped have
                    // nowhere to go.
                    for r in self.regions() {
                        r.on_left();
                    }
                }
                Closing::Flush => {
                    for r in self.regions() {
                        r.flush_all();
                    }
                }
                Closing::Wait => tokio::time::sleep(LEAVE_POLL).await,
                Closing::Exit => self.inner.control.exit(),
                Closing::Close => break,
            }
        }
        for r in self.regions() {
            r.clone().on_left();
            // Refuse what callers still send here, as not processed, instead of buffering it.
            r.on_fenced();
        }
        for (_, c) in self.inner.types.coordinators.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            c.stop();
        }
        self.inner.node.transport().shutdown();
        info!(node = %self.inner.node.id(), "left the cluster");
        Ok(())
    }

    /// [`leave_within`](Self::leave_within) with a 60 s limit.
    pub async fn leave(&self) -> Result<(), Error> {
        self.leave_within(Duration::from_secs(60)).await
    }

    /// Serves until `signal` resolves, then leaves gracefully ([`leave`](Self::leave)): the end
    /// of a tokio application's `main`. `signal` is any future: `tokio::signal::ctrl_c()`, a
    /// `CancellationToken`'s `cancelled()`, a channel's receive. Returns once the node left
    /// another way (a drain through the admin API), and early, with
    /// `Unavailable` and the reason, when the node was declared down or fenced first: it no
    /// longer serves, and its runner decides whether to start a new incarnation.
    ///
    /// ```no_run
    /// # async fn run(cluster: shardline::Cluster) -> Result<(), shardline::Error> {
    /// cluster.leave_on(async { let _ = tokio::signal::ctrl_c().await; }).await?;
    /// # Ok(()) }
    /// ```
    pub async fn leave_on(&self, signal: impl std::future::Future<Output = ()>) -> Result<(), Error> {
        tokio::select! {
            () = signal => self.leave().await,
            // Left another way meanwhile (a drain through the admin API).
            left = self.left() => left,
            why = self.downed() => Err(Error::Unavailable(format!("this node stopped serving: {why}"))),
        }
    }

    /// Stops this node at once, without a hand-off: its peers see it as crashed (no goodbye, its
    /// lease just lapses) and take its shards once its membership lapses. For a node runner that
    /// gets a second stop signal during a [`leave`](Self::leave), or whose node was fenced and
    /// rejoins as a new incarnation; tests use it to crash a node.
    pub fn crash(&self) {
        self.inner.control.halt();
        self.fence("crashed on purpose");
        self.inner.node.transport().shutdown();
    }

    /// What this process's asks did so far: outcomes, and the latency of a sample (all nodes of
    /// the process together; a process runs one node outside of tests).
    pub fn ask_stats(&self) -> crate::AskStats {
        crate::sharding::ask::stats::read()
    }

    /// What this node hosts, per registered entity type (sorted by type).
    pub fn hosting(&self) -> Vec<crate::Hosting> {
        let mut all: Vec<crate::Hosting> = self.regions().iter().map(|r| r.hosting()).collect();
        all.sort_by(|a, b| a.type_key.cmp(&b.type_key));
        all
    }

    /// Shards each owner hosts, as the coordinator running on this node knows them (empty when
    /// this node does not lead).
    pub fn shard_counts(&self, type_key: &str) -> HashMap<NodeId, usize> {
        let c = self
            .inner
            .types
            .coordinators
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&TypeKey::new(type_key))
            .cloned();
        c.and_then(|c| c.map())
            .map(|m| m.counts().into_iter().map(|(k, v)| (k.clone(), v)).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn node() -> Cluster {
        Cluster::builder().cluster_name("leave").node_name("a").build().await.expect("a lone node starts")
    }

    fn downed_now(c: &Cluster) -> Option<String> {
        c.inner.down_rx.borrow().clone()
    }

    /// The drill that found it: a drained process whose hosting ended at its exit (a gossip
    /// member that said `Removed`) saw `downed` before `left`, and rejoined instead of ending.
    #[tokio::test]
    async fn hosting_that_ends_during_a_leave_does_not_down_the_node() {
        let c = node().await;
        assert!(c.begin_leave());
        c.fence("lease ran out");
        assert!(c.inner.fenced.load(Ordering::Acquire), "it still stops hosting");
        assert_eq!(downed_now(&c), None);
    }

    #[tokio::test]
    async fn hosting_that_ends_while_staying_downs_the_node() {
        let c = node().await;
        c.fence("lease ran out");
        assert_eq!(downed_now(&c).as_deref(), Some("lease ran out"));
        assert_eq!(c.downed().await, "lease ran out");
    }
}
