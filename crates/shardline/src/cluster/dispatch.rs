//! What arrives from peers, handed to the region, coordinator or membership it is for; what
//! could not be sent, handed back to whoever waits for it; and the node's two background
//! tasks, which apply membership views and sweep asks past their deadline.

use std::time::Duration;

use shardline_core::NodeId;
use tokio::sync::watch;
use tracing::warn;

use crate::error::Error;
use crate::error::TransportError;
use crate::membership::ClusterView;
use crate::membership::{BoxFuture, PeerLink};
use crate::sharding::message::{send_reply, NodeTransport, PeerMessage};
use crate::transport::Inbound;

use super::{Cluster, NodeInner};

pub(super) struct Dispatcher(pub(super) std::sync::Weak<NodeInner>);

impl Inbound<PeerMessage> for Dispatcher {
    fn on_frame(&self, from: &NodeId, frame: PeerMessage) {
        let Some(inner) = self.0.upgrade() else { return };
        let cluster = Cluster { inner };
        if !matches!(frame, PeerMessage::Reply { .. } | PeerMessage::Gossip(_) | PeerMessage::Events { .. }) {
            cluster.fence_if_lapsed();
        }
        match frame {
            PeerMessage::Gossip(data) => {
                // Gossip is lossy by design (SWIM repeats and probes again): a full queue drops.
                if cluster.inner.gossip_tx.try_send((from.clone(), data)).is_err() {
                    metrics::counter!("shardline_gossip_dropped_total").increment(1);
                }
            }
            PeerMessage::ToCoordinator { type_key, msg } => {
                let c = cluster.inner.coordinators.lock().unwrap_or_else(|e| e.into_inner()).get(&type_key).cloned();
                if let Some(c) = c {
                    c.on_frame(from, msg);
                }
            }
            PeerMessage::ToRegion { type_key, msg } => match cluster.region(&type_key) {
                Some(r) => r.on_coordinator_frame(from, msg),
                None => {
                    tracing::debug!(%type_key, peer = %from, "coordinator message for an entity type not registered here")
                }
            },
            PeerMessage::Region { type_key, msg } => match cluster.region(&type_key) {
                Some(r) => r.on_region_frame(from, msg),
                None => {
                    warn!(%type_key, peer = %from, "message for an unknown entity type");
                    if let shardline_core::RegionMessage::Forward { msg, .. } = msg {
                        if let Some(addr) = msg.reply {
                            let err = Error::Rejected(format!(
                                "entity type {type_key} is not registered on {}",
                                cluster.inner.node.id()
                            ));
                            send_reply(cluster.transport(), &addr.node, addr.req_id, Err(err));
                        }
                    }
                }
            },
            PeerMessage::Reply { req_id, result } => cluster.inner.node.pending().complete(req_id, result),
            PeerMessage::Events { type_key, events } => {
                for e in events {
                    cluster.inner.node.publish_relayed(&type_key, e);
                }
            }
            PeerMessage::Admin { req_id, query } => cluster.answer_admin(from, req_id, &query),
        }
    }

    fn on_link_down(&self, peer: &NodeId) {
        let Some(inner) = self.0.upgrade() else { return };
        for r in (Cluster { inner }).regions() {
            r.on_link_down(peer);
        }
    }

    fn on_unsendable(&self, peer: &NodeId, frame: PeerMessage, error: crate::TransportError) {
        let Some(inner) = self.0.upgrade() else { return };
        let cluster = Cluster { inner };
        match frame {
            // Never written, so never processed: the asker may resend (a smaller message).
            PeerMessage::Region { msg: shardline_core::RegionMessage::Forward { msg, .. }, .. }
            | PeerMessage::Region { msg: shardline_core::RegionMessage::Bounce { msg, .. }, .. } => {
                if let Some(addr) = msg.reply {
                    let err = Error::Rejected(format!("message to {} cannot be sent: {error}", msg.entity));
                    send_reply(cluster.transport(), &addr.node, addr.req_id, Err(err));
                } else {
                    warn!(peer = %peer, entity = %msg.entity, %error, "a told message cannot be sent: dropped");
                }
            }
            // The entity ran: its asker learns that the reply, not the message, was lost.
            PeerMessage::Reply { req_id, result: Ok(_) } => {
                let err = Error::ReplyLost(format!("the reply cannot be sent: {error}"));
                send_reply(cluster.transport(), peer, req_id, Err(err));
            }
            // Protocol frames are repeated on timers; the writer logged and counted this one.
            _ => {}
        }
    }

    fn on_undeliverable(&self, peer: &NodeId, frame: PeerMessage) {
        let Some(inner) = self.0.upgrade() else { return };
        let cluster = Cluster { inner };
        if let PeerMessage::Region { type_key, msg } = frame {
            if let Some(r) = cluster.region(&type_key) {
                r.on_undeliverable(peer, msg);
            }
        }
    }
}

/// The membership provider's way to its peers: its data as [`PeerMessage::Gossip`] on the node's
/// transport.
pub(super) struct GossipLink(pub(super) NodeTransport);

impl PeerLink for GossipLink {
    fn send(&self, node: &NodeId, addr: std::net::SocketAddr, data: Vec<u8>) -> Result<(), &'static str> {
        self.0.set_address(node, addr);
        self.0.send(node, PeerMessage::Gossip(data)).map_err(|e| e.reason())
    }

    fn send_to_address(
        &self,
        addr: std::net::SocketAddr,
        data: Vec<u8>,
    ) -> BoxFuture<'static, Result<NodeId, TransportError>> {
        let transport = self.0.clone();
        Box::pin(async move { transport.send_to_address(addr, PeerMessage::Gossip(data)).await })
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
