//! Keep-alives between lease members: what goes over the node's connections so that the lease
//! engine knows which peers it still reaches (see `shardline_core::lease::PeerChecks`).
//!
//! A ping carries the sender's listen address, so that a member answers a node that holds no
//! key yet (a new incarnation answers nothing before it heard from a member). Every ping is
//! answered with a pong; hearing either from a member counts as hearing from it.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use shardline_core::NodeId;
use tracing::{debug, warn};

use crate::membership::PeerLink;

/// One keep-alive message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum KeepAlive {
    /// Are you there? Answer to `addr`.
    Ping {
        /// The sender's listen address.
        addr: String,
    },
    /// Yes.
    Pong,
}

/// A keep-alive that cannot be read: logged and counted by the receiver, never taken for one.
#[derive(Debug, thiserror::Error)]
#[error("unreadable keep-alive from {from}: {reason}")]
pub(crate) struct BadKeepAlive {
    from: NodeId,
    reason: String,
}

/// Sends a ping to each member; one that cannot be queued is skipped (it counts as silence).
pub(super) fn ping_all(link: &dyn PeerLink, me: &str, to: &[(NodeId, String)]) {
    let Ok(ping) = postcard::to_allocvec(&KeepAlive::Ping { addr: me.to_string() }) else { return };
    for (node, addr) in to {
        match addr.parse::<SocketAddr>() {
            Ok(a) => {
                if let Err(reason) = link.send(node, a, ping.clone()) {
                    debug!(%node, reason, "keep-alive not sent");
                }
            }
            Err(e) => warn!(%node, %addr, error = %e, "member address unreadable: no keep-alive"),
        }
    }
}

/// Reads a keep-alive from `from`, answering a ping; `Ok` means `from` was heard.
pub(crate) fn receive(link: &dyn PeerLink, from: &NodeId, data: &[u8]) -> Result<(), BadKeepAlive> {
    let bad = |reason: String| BadKeepAlive { from: from.clone(), reason };
    match postcard::from_bytes::<KeepAlive>(data).map_err(|e| bad(e.to_string()))? {
        KeepAlive::Ping { addr } => {
            let a: SocketAddr =
                addr.parse().map_err(|e: std::net::AddrParseError| bad(format!("address {addr}: {e}")))?;
            let pong = postcard::to_allocvec(&KeepAlive::Pong).map_err(|e| bad(e.to_string()))?;
            if let Err(reason) = link.send(from, a, pong) {
                debug!(node = %from, reason, "keep-alive answer not sent");
            }
        }
        KeepAlive::Pong => {}
    }
    Ok(())
}
