//! The writer for one peer: a bounded queue, a connection with backoff, coalesced writes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use shardline_core::NodeId;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{dial, wire, Payload, Shared};

/// Why a message was not queued. The message comes back.
#[derive(Debug)]
pub enum SendError<M> {
    /// The peer's queue is full.
    Full(Box<M>),
    /// No address is known for the peer.
    NoRoute(Box<M>),
}

impl<M> SendError<M> {
    /// The message that was not sent.
    pub fn into_frame(self) -> M {
        match self {
            SendError::Full(f) | SendError::NoRoute(f) => *f,
        }
    }

    /// Why, for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            SendError::Full(_) => "the peer's queue is full",
            SendError::NoRoute(_) => "no route to the peer",
        }
    }
}

pub(crate) struct Peer<M> {
    tx: mpsc::Sender<M>,
}

impl<M: Payload> Peer<M> {
    pub fn spawn(node: NodeId, addr: SocketAddr, shared: Arc<Shared<M>>) -> Peer<M> {
        let (tx, rx) = mpsc::channel(shared.config.send_queue.max(1));
        tokio::spawn(run(node, addr, shared, rx));
        Peer { tx }
    }

    pub fn sender(&self) -> mpsc::Sender<M> {
        self.tx.clone()
    }

    pub fn send(&self, frame: M) -> Result<(), SendError<M>> {
        self.tx.try_send(frame).map_err(|e| match e {
            mpsc::error::TrySendError::Full(f) => SendError::Full(Box::new(f)),
            mpsc::error::TrySendError::Closed(f) => SendError::NoRoute(Box::new(f)),
        })
    }
}

/// Small jitter source; timing only.
fn jitter(seed: &mut u64, max: Duration) -> Duration {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    Duration::from_millis(*seed % (max.as_millis() as u64 / 4 + 1))
}

async fn run<M: Payload>(node: NodeId, addr: SocketAddr, shared: Arc<Shared<M>>, mut rx: mpsc::Receiver<M>) {
    let mut backoff = shared.config.backoff_initial;
    let mut seed = node.incarnation ^ 0x9E37_79B9_7F4A_7C15 ^ u64::from(addr.port());
    let mut buf = Vec::with_capacity(64 * 1024);
    // Wait for the first frame before dialing.
    let Some(mut first) = rx.recv().await else { return };
    loop {
        let attempt = tokio::time::timeout(shared.config.connect_timeout, dial(addr, Some(&node), &shared)).await;
        let mut stream = match attempt {
            Ok(Ok((s, _))) => {
                backoff = shared.config.backoff_initial;
                debug!(peer = %node, %addr, "connected");
                s
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e,
                    _ => super::TransportError::HandshakeTimeout,
                };
                info!(peer = %node, %addr, %error, "cannot reach peer");
                if !give_back_until(&node, &shared, &mut rx, Some(first), backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(shared.config.backoff_max) + jitter(&mut seed, backoff);
                match rx.recv().await {
                    Some(f) => first = f,
                    None => return,
                }
                continue;
            }
        };
        // Connected: write `first`, then everything that comes, coalescing what is queued.
        let mut next = Some(first);
        let failed = loop {
            let frame = match next.take() {
                Some(f) => f,
                None => match rx.recv().await {
                    Some(f) => f,
                    None => return,
                },
            };
            buf.clear();
            let max = shared.config.max_frame;
            if let Err(e) = wire::append_message(&frame, &mut buf, max) {
                unsendable(&node, &shared, frame, e);
                continue;
            }
            while buf.len() < 256 * 1024 {
                match rx.try_recv() {
                    Ok(f) => {
                        if let Err(e) = wire::append_message(&f, &mut buf, max) {
                            unsendable(&node, &shared, f, e);
                        }
                    }
                    Err(_) => break,
                }
            }
            if let Err(e) = stream.write_all(&buf).await {
                break e;
            }
        };
        info!(peer = %node, error = %failed, "connection lost");
        if let Some(h) = shared.handler.get() {
            h.on_link_down(&node);
        }
        match rx.recv().await {
            Some(f) => first = f,
            None => return,
        }
    }
}

/// A frame that can never be sent: logged, counted, and handed to the node to tell its sender.
fn unsendable<M: Payload>(node: &NodeId, shared: &Shared<M>, frame: M, error: super::TransportError) {
    warn!(peer = %node, %error, "frame cannot be sent: dropped, its sender is told");
    metrics::counter!("shardline_transport_unsendable_frames_total").increment(1);
    if let Some(h) = shared.handler.get() {
        h.on_unsendable(node, frame, error);
    }
}

/// Hands frames back as undeliverable (the first one, then whatever arrives) for `wait`, then
/// reports the link down. Returns false when the peer was forgotten.
async fn give_back_until<M: Payload>(
    node: &NodeId,
    shared: &Shared<M>,
    rx: &mut mpsc::Receiver<M>,
    first: Option<M>,
    wait: Duration,
) -> bool {
    let Some(h) = shared.handler.get() else { return true };
    if let Some(f) = first {
        h.on_undeliverable(node, f);
    }
    h.on_link_down(node);
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => return true,
            f = rx.recv() => match f {
                Some(f) => h.on_undeliverable(node, f),
                None => return false,
            },
        }
    }
}
