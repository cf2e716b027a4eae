//! Layer 2: membership providers.
//!
//! A provider tells the node who is in the cluster, who leads (and with which term), and where
//! each member listens. The sharding layer reads only that [`ClusterView`], so seed nodes, etcd
//! leases or NATS KV leases plug in behind one trait.

pub mod lease;
pub mod seeds;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use shardline_core::{MembershipView, NodeId, Term};
use tokio::sync::{mpsc, watch};

use crate::error::ConfigError;
use crate::transport::Transport;

pub use seeds::{Seeds, SeedsConfig};

/// The cluster as the provider sees it now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    /// Members and their status; the leader is set in it too.
    pub view: MembershipView,
    /// Where the coordinators run, and their term (strictly larger for every new leader).
    pub leader: Option<(NodeId, Term)>,
    /// Listen addresses of members.
    pub addresses: BTreeMap<NodeId, SocketAddr>,
}

impl ClusterView {
    /// Whether this view declares `node` down (or removed).
    pub fn is_fenced(&self, node: &NodeId) -> bool {
        self.view.is_fenced(node)
    }
}

/// What a provider gets from the node it serves.
pub struct ProviderContext {
    /// This node.
    pub me: NodeId,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its roles (`"proxy"` for a node that hosts nothing).
    pub roles: Vec<String>,
    /// Its application version.
    pub app_version: String,
    /// Its weight.
    pub weight: u32,
    /// The node's transport, for providers that talk to peers.
    pub transport: Transport,
    /// Gossip frames addressed to the provider.
    pub gossip: mpsc::Receiver<(NodeId, seeds::Gossip)>,
}

/// A running provider: its views and how to leave.
pub struct MembershipHandle {
    /// Every new view.
    pub views: watch::Receiver<ClusterView>,
    /// Control of the provider.
    pub control: Arc<dyn MembershipControl>,
}

/// Controls a running provider.
pub trait MembershipControl: Send + Sync {
    /// Marks this node `Leaving`.
    fn leave(&self);
    /// Marks this node `Exiting` then `Removed` (after its shards were handed off).
    fn exit(&self);
    /// Stops taking part at once, without telling anyone (a crash, as peers see it).
    fn halt(&self);
}

/// What a node asks of its running provider.
pub(crate) enum Control {
    Leave,
    Exit,
    Halt,
}

/// The [`MembershipControl`] of the built-in providers: commands over a channel to their task.
pub(crate) struct ControlHandle(pub(crate) mpsc::UnboundedSender<Control>);

impl MembershipControl for ControlHandle {
    fn leave(&self) {
        let _ = self.0.send(Control::Leave);
    }
    fn exit(&self) {
        let _ = self.0.send(Control::Exit);
    }
    fn halt(&self) {
        let _ = self.0.send(Control::Halt);
    }
}

/// A boxed future, for object-safe providers.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A way to form a cluster.
pub trait MembershipProvider: Send + 'static {
    /// Starts the provider for this node.
    fn start(self: Box<Self>, ctx: ProviderContext) -> BoxFuture<'static, Result<MembershipHandle, ConfigError>>;
}
