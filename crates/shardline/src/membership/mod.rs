//! Layer 2: membership providers.
//!
//! A provider tells the node who is in the cluster, who leads (and with which term), and where
//! each member listens. The sharding layer reads only that [`ClusterView`], so seed nodes, etcd
//! leases or NATS KV leases plug in behind one trait.

pub mod gossip;
pub mod lease;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::clock::Clock;

use shardline_core::{MembershipView, NodeId, Term};
use tokio::sync::{mpsc, watch};

use crate::error::{ConfigError, TransportError};

pub use gossip::Gossip;
pub use shardline_core::gossip::GossipConfig;

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

/// Sends the view a provider's engine published (when it changed), with the members' addresses
/// read; an address that cannot be read is logged and left out (that member is not routed to).
pub(crate) fn publish_view(
    tx: &watch::Sender<ClusterView>,
    view: MembershipView,
    leader: Option<(NodeId, Term)>,
    addresses: &BTreeMap<NodeId, String>,
) {
    let mut parsed = BTreeMap::new();
    for (node, addr) in addresses {
        match addr.parse() {
            Ok(a) => {
                parsed.insert(node.clone(), a);
            }
            Err(e) => tracing::warn!(%node, %addr, error = %e, "member address unreadable: not routed to"),
        }
    }
    let view = ClusterView { view, leader, addresses: parsed };
    tx.send_if_modified(|old| {
        if *old != view {
            *old = view;
            true
        } else {
            false
        }
    });
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
    /// How the provider reaches its peers (for providers that talk to them).
    pub peers: Arc<dyn PeerLink>,
    /// Membership data peers sent to the provider (gossip), with the sender.
    pub gossip: mpsc::Receiver<(NodeId, Vec<u8>)>,
    /// The node's clock, which every driver of the node reads.
    pub clock: crate::clock::Clock,
}

/// How a provider reaches its peers: its data, opaque to the layers below, goes over the node's
/// transport, and comes back to the provider of the receiving node
/// ([`ProviderContext::gossip`]).
pub trait PeerLink: Send + Sync + 'static {
    /// Queues `data` for `node`, listening at `addr`, on this node's connection to it (the one
    /// the sharding layer uses). Gossip is lossy by design: data that cannot be queued comes
    /// back as an error saying why, and is not retried.
    fn send(&self, node: &NodeId, addr: SocketAddr, data: Vec<u8>) -> Result<(), &'static str>;
    /// Sends `data` to whatever node listens at `addr` (a seed known by address, a member held
    /// down), on a short-lived connection of its own. Resolves to the node that answered.
    fn send_to_address(&self, addr: SocketAddr, data: Vec<u8>) -> BoxFuture<'static, Result<NodeId, TransportError>>;
    /// Which node listens at `addr` (a handshake, nothing sent). A refused connection is an
    /// [`TransportError::Io`] of kind `ConnectionRefused`.
    fn identify(&self, addr: SocketAddr) -> BoxFuture<'static, Result<NodeId, TransportError>>;
}

/// A running provider: its views and how to leave.
pub struct MembershipHandle {
    /// Every new view.
    pub views: watch::Receiver<ClusterView>,
    /// Control of the provider.
    pub control: Arc<dyn MembershipControl>,
    /// Until when this node may host (None: no bound, gossip without a split-brain resolver).
    pub lease: Option<HostingLease>,
    /// Where coordinators keep their shard maps (providers with a store), so that a new leader
    /// resumes from the last map instead of starting over.
    pub maps: Option<lease::ShardMaps>,
}

/// Until when this node may host shards, as its membership provider last proved it: a lease
/// provider by its lease in the store, gossip by the answers of a majority
/// ([`GossipEngine::hosting_until`](shardline_core::gossip::GossipEngine::hosting_until)).
///
/// The provider fences the node when its lease runs out, but a paused process (a stall, a
/// suspended VM, `SIGSTOP`) wakes up with work queued everywhere, and its provider task is only
/// one of many to run. So every entry point (frames, coordinator inputs, each message an entity
/// is about to process) checks this first: a node whose lease ran out processes nothing more.
///
/// Its times are milliseconds on the node's [`Clock`], the clock every driver of
/// the node reads: a test or a simulation that pauses tokio's time pauses the lease with them.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use shardline::membership::HostingLease;
/// use shardline::Clock;
///
/// let clock = Clock::start();
/// let lease = HostingLease::new(clock);
/// assert!(!lease.is_valid() && !lease.has_lapsed());
/// lease.extend_to(4_000);
/// assert!(lease.is_valid());
/// tokio::time::sleep(Duration::from_secs(1)).await;
/// lease.revoke();
/// assert!(!lease.is_valid() && lease.has_lapsed());
/// // The end is now the moment of the revocation, no longer 4 s in.
/// assert_eq!(lease.valid_until(), Some(1_000));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct HostingLease {
    clock: Clock,
    /// [`NEVER`] granted, [`REVOKED`] before it was ever granted, or the end as `OFFSET +`
    /// milliseconds on `clock` (exclusive).
    until: Arc<AtomicU64>,
}

const NEVER: u64 = 0;
const REVOKED: u64 = 1;
const OFFSET: u64 = 2;

impl HostingLease {
    /// A lease not granted yet, on the node's clock.
    pub fn new(clock: Clock) -> Self {
        HostingLease { clock, until: Arc::new(AtomicU64::new(NEVER)) }
    }

    fn now(&self) -> u64 {
        OFFSET.saturating_add(self.clock.now_ms())
    }

    /// Valid until `until_ms` on the node's clock (the last renewal's start + TTL − safety
    /// margin).
    pub fn extend_to(&self, until_ms: u64) {
        self.until.store(OFFSET.saturating_add(until_ms), Ordering::Release);
    }

    /// Not valid from now on; the recorded end becomes now, if that is earlier.
    pub fn revoke(&self) {
        let now = self.now();
        let _ = self
            .until
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| Some(if u < OFFSET { REVOKED } else { u.min(now) }));
    }

    /// Whether the node may host now.
    pub fn is_valid(&self) -> bool {
        let until = self.until.load(Ordering::Acquire);
        until >= OFFSET && self.now() < until
    }

    /// Whether it was granted and has run out (or was revoked): the node must fence itself.
    pub fn has_lapsed(&self) -> bool {
        match self.until.load(Ordering::Acquire) {
            NEVER => false,
            REVOKED => true,
            until => self.now() >= until,
        }
    }

    /// When it ends or ended, in milliseconds on the node's clock (None: never granted).
    pub fn valid_until(&self) -> Option<u64> {
        let until = self.until.load(Ordering::Acquire);
        (until >= OFFSET).then(|| until - OFFSET)
    }
}

/// Controls a running provider.
pub trait MembershipControl: Send + Sync {
    /// Marks this node `Leaving`.
    fn leave(&self);
    /// Marks this node `Exiting` then `Removed` (after its shards were handed off).
    fn exit(&self);
    /// Stops taking part at once, without telling anyone (a crash, as peers see it).
    fn halt(&self);
    /// The journal refused to let this node claim a shard: its fence is stored at `term`. Above
    /// every term this cluster used, a cluster led apart from it took it (a first seed restarted
    /// alone, the other side of a partition), or this cluster did before every member restarted.
    /// A provider that picks its own terms (gossip) then leads above it, or this cluster could
    /// never claim that shard again; one whose terms come from a store that orders them already
    /// (leases) has nothing to do.
    fn fenced_above(&self, term: Term) {
        let _ = term;
    }
}

/// What a node asks of its running provider.
pub(crate) enum Control {
    Leave,
    Exit,
    Halt,
    FencedAbove(Term),
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
    fn fenced_above(&self, term: Term) {
        let _ = self.0.send(Control::FencedAbove(term));
    }
}

/// A boxed future, for object-safe providers (the transport's, which sits below membership).
pub use crate::transport::network::BoxFuture;

/// A way to form a cluster.
pub trait MembershipProvider: Send + 'static {
    /// Starts the provider for this node.
    fn start(self: Box<Self>, ctx: ProviderContext) -> BoxFuture<'static, Result<MembershipHandle, ConfigError>>;
}
