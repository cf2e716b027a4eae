//! What arrives from peers, handed to the layer it is for (membership data to the membership,
//! admin questions to the node, the rest to the sharding layer's `inbound`); and the node's two
//! background tasks, which apply membership views and sweep asks past their deadline.

use std::time::Duration;

use shardline_core::NodeId;
use tokio::sync::watch;

use crate::error::TransportError;
use crate::membership::ClusterView;
use crate::membership::{BoxFuture, PeerLink};
use crate::sharding::message::{NodeTransport, PeerMessage};
use crate::transport::Inbound;

use super::{Cluster, NodeInner};

pub(super) struct Dispatcher(pub(super) std::sync::Weak<NodeInner>);

impl Inbound<PeerMessage> for Dispatcher {
    fn on_frame(&self, from: &NodeId, frame: PeerMessage) {
        let Some(inner) = self.0.upgrade() else { return };
        let cluster = Cluster { inner };
        if !matches!(frame, PeerMessage::Reply { .. } | PeerMessage::Membership(_) | PeerMessage::Events { .. }) {
            cluster.fence_if_lapsed();
        }
        match frame {
            PeerMessage::Membership(data) => {
                // Gossip is lossy by design (SWIM repeats and probes again): a full queue drops.
                if cluster.inner.gossip_tx.try_send((from.clone(), data)).is_err() {
                    metrics::counter!("shardline_gossip_dropped_total").increment(1);
                }
            }
            PeerMessage::Admin { req_id, query } => cluster.answer_admin(from, req_id, &query),
            frame => cluster.inner.types.on_frame(&cluster.inner.node, from, frame),
        }
    }

    fn on_link_down(&self, peer: &NodeId) {
        let Some(inner) = self.0.upgrade() else { return };
        inner.types.on_link_down(peer);
    }

    fn on_unsendable(&self, peer: &NodeId, frame: PeerMessage, error: TransportError) {
        let Some(inner) = self.0.upgrade() else { return };
        inner.types.on_unsendable(&inner.node, peer, frame, error);
    }

    fn on_undeliverable(&self, peer: &NodeId, frame: PeerMessage) {
        let Some(inner) = self.0.upgrade() else { return };
        inner.types.on_undeliverable(peer, frame);
    }
}

/// The membership provider's way to its peers: its data as [`PeerMessage::Membership`] on the node's
/// transport.
pub(super) struct GossipLink(pub(super) NodeTransport);

impl PeerLink for GossipLink {
    fn send(&self, node: &NodeId, addr: std::net::SocketAddr, data: Vec<u8>) -> Result<(), &'static str> {
        self.0.set_address(node, addr);
        self.0.send(node, PeerMessage::Membership(data)).map_err(|e| e.reason())
    }

    fn send_to_address(
        &self,
        addr: std::net::SocketAddr,
        data: Vec<u8>,
    ) -> BoxFuture<'static, Result<NodeId, TransportError>> {
        let transport = self.0.clone();
        Box::pin(async move { transport.send_to_address(addr, PeerMessage::Membership(data)).await })
    }

    fn identify(&self, addr: std::net::SocketAddr) -> BoxFuture<'static, Result<NodeId, TransportError>> {
        let transport = self.0.clone();
        Box::pin(async move { transport.identify(addr).await })
    }
}

pub(super) async fn watch_membership(cluster: Cluster, mut views: watch::Receiver<ClusterView>) {
    loop {
        // Marked seen here; applied as the newest there is (which may be newer still).
        views.borrow_and_update();
        cluster.apply_latest_view();
        if views.changed().await.is_err() {
            return;
        }
    }
}

pub(super) async fn sweep_pending(inner: std::sync::Weak<NodeInner>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(i) = inner.upgrade() else { return };
        i.node.pending().sweep();
    }
}
