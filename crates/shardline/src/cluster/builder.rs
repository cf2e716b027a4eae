//! Building a node: its settings, then starting its transport, membership and drivers.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use shardline_core::NodeId;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::clock::Clock;
use crate::error::ConfigError;
use crate::membership::{ClusterView, Gossip, MembershipProvider, ProviderContext};
use crate::sharding::node::Node;
use crate::sharding::types::Types;
use crate::transport::network::Bound;
use crate::transport::{Network, TlsConfig, Transport, TransportConfig};

use super::dispatch::{sweep_pending, watch_membership, Dispatcher, GossipLink};
use super::{Cluster, NodeInner};

/// Builds a [`Cluster`] node.
pub struct ClusterBuilder {
    pub(super) cluster_name: String,
    pub(super) node_name: Option<String>,
    pub(super) bind: String,
    pub(super) membership: Option<Box<dyn MembershipProvider>>,
    pub(super) roles: Vec<String>,
    pub(super) app_version: String,
    pub(super) weight: u32,
    pub(super) proxy: bool,
    pub(super) transport: Option<TransportConfig>,
    pub(super) ownership_log: Option<std::path::PathBuf>,
    pub(super) network: Option<Arc<dyn Network>>,
    pub(super) admin_secret: Option<Vec<u8>>,
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

    /// Membership provider (default: [`Gossip`] with no seeds, a single-node cluster).
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

    /// Mutual TLS between nodes with this certificate, key and CA (see
    /// [`TlsConfig`](crate::TlsConfig)); the node's certificate must be for its node
    /// name. Without it the node speaks plain TCP and says so loudly in its log.
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        let mut config = self.transport.take().unwrap_or_else(|| TransportConfig::new(self.cluster_name.clone()));
        config.tls = Some(tls);
        self.transport = Some(config);
        self
    }

    /// The secret that lets an operator's request reach other nodes: drain, rebalance and shard
    /// assignments asked of this node for another one travel as cluster messages, and a node
    /// takes them only with a tag made with the same secret (or from peers certified by mutual
    /// TLS). Give every node the same one; `shardline node` gives its admin token. Without it
    /// and without TLS, such a request is refused with
    /// [`AdminError::Unauthorized`](crate::AdminError::Unauthorized), since anyone who knows the
    /// cluster's name can connect as a peer. Questions that change nothing need no secret.
    pub fn admin_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.admin_secret = Some(secret.into());
        self
    }

    /// Appends `time_ms node type shard epoch start|stop` lines to this file whenever a shard
    /// starts or stops here (for ownership checks).
    pub fn ownership_log(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.ownership_log = Some(path.into());
        self
    }

    /// Takes connections from `network` instead of TCP: a simulated network in tests (see
    /// [`Network`](crate::Network)). Refused together with TLS.
    pub fn network(mut self, network: Arc<dyn Network>) -> Self {
        self.network = Some(network);
        self
    }

    /// Starts the node: binds, starts membership, begins serving.
    pub async fn build(self) -> Result<Cluster, ConfigError> {
        if self.cluster_name.is_empty() {
            return Err(ConfigError::Invalid { name: "cluster_name", reason: "must not be empty".into() });
        }
        let incarnation = new_incarnation();
        let bind = self.bind.clone();
        let bind_failed = |source| ConfigError::Bind { addr: bind.clone(), source };
        let listener = match &self.network {
            None => Bound::Tcp(tokio::net::TcpListener::bind(&bind).await.map_err(bind_failed)?),
            Some(network) => Bound::Other(network.bind(&bind).await.map_err(bind_failed)?),
        };
        let addr = match &listener {
            Bound::Tcp(l) => l.local_addr(),
            Bound::Other(l) => l.local_addr(),
        }
        .map_err(bind_failed)?;
        let name = self.node_name.clone().unwrap_or_else(|| addr.to_string());
        // Stored records tell a header from a record of before headers by a leading zero byte,
        // which an empty name's length would also be (see `format`).
        if name.is_empty() {
            return Err(ConfigError::Invalid { name: "node_name", reason: "must not be empty".into() });
        }
        let tconf = self.transport.unwrap_or_else(|| TransportConfig::new(self.cluster_name.clone()));
        let tconf = TransportConfig { cluster: self.cluster_name.clone(), ..tconf };
        match &tconf.tls {
            Some(_) if self.network.is_some() => {
                return Err(ConfigError::Invalid {
                    name: "tls",
                    reason: "TLS runs over TCP only, and this node takes its connections from a network of its own"
                        .into(),
                })
            }
            Some(tls) => {
                tls.certifies(&name).map_err(|e| ConfigError::Invalid { name: "tls", reason: e.to_string() })?
            }
            None if self.network.is_some() => {}
            None => {
                let why = "NO TLS: node-to-node traffic is neither encrypted nor authenticated, and anyone who \
                           reaches this address can join the cluster; give the node a certificate outside \
                           development (ClusterBuilder::tls, or the CLI's --tls-cert, --tls-key, --tls-ca)";
                warn!(node = %name, %addr, "{why}");
                // An application that installed no subscriber would never see it.
                if !tracing::dispatcher::has_been_set() {
                    eprintln!("shardline: node {name} at {addr}: {why}");
                }
            }
        }
        let admin_auth =
            super::admin_auth::AdminAuth::new(&self.cluster_name, self.admin_secret.as_deref(), tconf.tls.is_some());
        let transport = Transport::at(NodeId::new(name, incarnation), addr, tconf, self.network.clone());
        let me = transport.me().clone();
        let (gossip_tx, gossip_rx) = mpsc::channel(1024);
        let clock = Clock::start();
        let mut roles = self.roles.clone();
        if self.proxy {
            roles.push(shardline_core::PROXY_ROLE.into());
        }
        let provider = self.membership.unwrap_or_else(|| Box::new(Gossip::new(Vec::<String>::new())));
        let handle = provider
            .start(ProviderContext {
                me: me.clone(),
                addr,
                roles,
                app_version: self.app_version.clone(),
                weight: self.weight,
                peers: Arc::new(GossipLink(transport.clone())),
                gossip: gossip_rx,
                clock,
            })
            .await?;
        let log = match self.ownership_log {
            Some(p) => Some(std::fs::OpenOptions::new().create(true).append(true).open(&p).map_err(|e| {
                ConfigError::Invalid { name: "ownership_log", reason: format!("{}: {e}", p.display()) }
            })?),
            None => None,
        };
        let (down_tx, down_rx) = watch::channel(None);
        let inner = Arc::new(NodeInner {
            node: Node::new(transport.clone(), clock, handle.lease, handle.control.clone(), log),
            addr,
            proxy: self.proxy,
            types: Types::default(),
            view: Mutex::new(ClusterView::default()),
            views: handle.views.clone(),
            applying: Mutex::new(()),
            control: handle.control,
            maps: handle.maps,
            gossip_tx,
            fenced: AtomicBool::new(false),
            down_tx,
            down_rx,
            leave: watch::channel(super::Leave::Staying).0,
            admin_auth,
        });
        transport.serve_from(listener, Arc::new(Dispatcher(Arc::downgrade(&inner))));
        let cluster = Cluster { inner };
        tokio::spawn(watch_membership(cluster.clone(), handle.views));
        tokio::spawn(sweep_pending(Arc::downgrade(&cluster.inner)));
        info!(node = %me, %addr, "node started");
        Ok(cluster)
    }
}

/// A node's incarnation: the time it started (ms), made unique in the process, so that a node
/// restarted within the same millisecond (tests, a simulation) is still a new incarnation.
fn new_incarnation() -> u64 {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_millis() as u64);
    let mut last = LAST.load(std::sync::atomic::Ordering::Relaxed);
    loop {
        let next = now.max(last + 1);
        match LAST.compare_exchange_weak(
            last,
            next,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        ) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}
