//! What arrives from peers for the sharding layer, handed to the region or coordinator it is
//! for; and what could not be sent, handed back to whoever waits for it.

use shardline_core::{NodeId, RegionMessage};
use tracing::warn;

use super::message::{send_reply, PeerMessage};
use super::node::Node;
use super::refusal::Refusal;
use super::types::Types;
use crate::error::TransportError;

impl Types {
    /// A frame of the sharding layer from `from` (the node layer keeps membership data and
    /// admin questions for itself).
    pub fn on_frame(&self, node: &Node, from: &NodeId, frame: PeerMessage) {
        match frame {
            PeerMessage::ToCoordinator { type_key, msg } => {
                if let Some(c) = self.coordinator(&type_key) {
                    c.on_frame(from, msg);
                }
            }
            PeerMessage::ToRegion { type_key, msg } => match self.region(&type_key) {
                Some(r) => r.on_coordinator_frame(from, msg),
                None => {
                    tracing::debug!(%type_key, peer = %from, "coordinator message for an entity type not registered here")
                }
            },
            PeerMessage::Region { type_key, msg } => match self.region(&type_key) {
                Some(r) => r.on_region_frame(from, msg),
                None => {
                    warn!(%type_key, peer = %from, "message for an unknown entity type");
                    if let RegionMessage::Forward { msg, .. } = msg {
                        if let Some(addr) = msg.reply {
                            let err = Refusal::UnknownType(&type_key, node.id()).error();
                            send_reply(node.transport(), &addr.node, addr.req_id, Err(err));
                        }
                    }
                }
            },
            PeerMessage::Reply { req_id, result } => node.pending().complete(req_id, result),
            PeerMessage::Events { type_key, events } => {
                for e in events {
                    node.publish_relayed(&type_key, e);
                }
            }
            PeerMessage::Membership(_) | PeerMessage::Admin { .. } => {}
        }
    }

    /// The connection to `peer` broke.
    pub fn on_link_down(&self, peer: &NodeId) {
        for r in self.regions() {
            r.on_link_down(peer);
        }
    }

    /// A frame that cannot be written (too large, cannot be encoded): never processed.
    pub fn on_unsendable(&self, node: &Node, peer: &NodeId, frame: PeerMessage, error: TransportError) {
        match frame {
            // Never written, so never processed: the asker may resend (a smaller message).
            PeerMessage::Region { msg: RegionMessage::Forward { msg, .. }, .. }
            | PeerMessage::Region { msg: RegionMessage::Bounce { msg, .. }, .. } => {
                if let Some(addr) = msg.reply {
                    let err = Refusal::Unsendable(&msg.entity, error.to_string()).error();
                    send_reply(node.transport(), &addr.node, addr.req_id, Err(err));
                } else {
                    warn!(peer = %peer, entity = %msg.entity, %error, "a told message cannot be sent: dropped");
                }
            }
            // The entity ran: its asker learns that the reply, not the message, was lost.
            PeerMessage::Reply { req_id, result: Ok(_) } => {
                let err = Refusal::ReplyUnsendable(error.to_string()).error();
                send_reply(node.transport(), peer, req_id, Err(err));
            }
            // Protocol frames are repeated on timers; the writer logged and counted this one.
            _ => {}
        }
    }

    /// A frame the transport could not deliver to `peer` (no connection): a region's message
    /// goes back to its region, which routes it again.
    pub fn on_undeliverable(&self, peer: &NodeId, frame: PeerMessage) {
        if let PeerMessage::Region { type_key, msg } = frame {
            if let Some(r) = self.region(&type_key) {
                r.on_undeliverable(peer, msg);
            }
        }
    }
}
