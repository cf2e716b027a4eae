//! Layer 1: framed TCP between nodes, generic over the messages it carries: it encodes and
//! decodes them, and knows nothing else of them or of the layers above.
//!
//! Each node dials each peer it sends to and keeps that connection for all of its traffic to
//! that peer (every entity type, requests and replies). It reads whatever peers send on the
//! connections they dialed. So a pair of nodes has one connection per direction, and each is
//! FIFO: the only ordering the sharding protocol needs (see the design notes on why not one
//! shared socket).
//!
//! - **TLS**: with a [`TlsConfig`], every connection is TLS 1.3 with a certificate of the
//!   cluster's CA on both ends, and each end checks that the other's certificate is for the node
//!   name it claims (see [`tls`]). A connection that fails this is refused with one log line on
//!   the refusing node. Without one, connections are plain TCP: for development only.
//! - **Handshake**: the dialer sends `Hello` (the protocol versions it speaks, cluster name, its
//!   id, the id it expects); a mismatch is refused with a reason on both sides. The connection
//!   speaks the newest version both ends do, so nodes of two versions share a cluster while it is
//!   updated one node at a time (see [`PROTOCOL_VERSION`]).
//! - **Limits**: frames over `max_frame` bytes, undecodable frames and unknown kinds close that
//!   connection with a logged [`TransportError`]; the node keeps running. A frame this node
//!   cannot send (over `max_frame`, or unencodable) is refused before it is written and handed to
//!   [`Inbound::on_unsendable`], so the rest of its batch still goes out.
//! - **Back-pressure**: each peer has a bounded queue; [`Transport::send`] fails with
//!   [`SendError::Full`] instead of growing.
//! - **Coalescing**: the writer drains everything queued into one buffer per syscall. While the
//!   node owes frames it is about to queue ([`Transport::owe`]: the replies to asks its entities
//!   are handling), a writer woken by a lone frame lets the tasks that are ready run once before
//!   it writes, so the replies to one read's worth of asks leave in one write, not one each; with
//!   nothing owed (a lone ask) it writes at once.
//! - **Reconnect**: exponential backoff with jitter (1 s doubling to 30 s). While a peer cannot be
//!   reached, its queued and new frames are handed back at once as undeliverable, so the
//!   sharding layer can reroute them.

pub(crate) mod handshake;
mod link;
pub mod network;
mod peer;
pub mod tls;
pub mod wire;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use shardline_core::NodeId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use handshake::Greeting;
use link::Link;
use network::{Accepted, Bound};
use tracing::{debug, warn};

pub use network::{Connection, Listener, Network};
pub use peer::SendError;
pub use tls::{TlsConfig, TlsError};
pub use wire::{Payload, Wire, DEFAULT_MAX_FRAME, OLDEST_PROTOCOL, PROTOCOL_VERSION};

use crate::error::TransportError;

/// Settings of the transport.
#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// Cluster name; nodes of other clusters are refused.
    pub cluster: String,
    /// Largest frame accepted or sent (default 8 MiB).
    pub max_frame: usize,
    /// Frames queued per peer before `send` fails with `Full` (default 65,536).
    pub send_queue: usize,
    /// First reconnect delay (default 1 s), doubling up to `backoff_max` (default 30 s).
    pub backoff_initial: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// Time allowed for connect plus handshake (default 2 s).
    pub connect_timeout: Duration,
    /// Mutual TLS between nodes (default none: plain TCP, for development).
    pub tls: Option<TlsConfig>,
}

impl TransportConfig {
    /// Defaults for a cluster name.
    pub fn new(cluster: impl Into<String>) -> Self {
        TransportConfig {
            cluster: cluster.into(),
            max_frame: DEFAULT_MAX_FRAME,
            send_queue: 65_536,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(2),
            tls: None,
        }
    }
}

/// Receives what the transport reads and notices. Called from transport tasks: implementations
/// must not block.
pub trait Inbound<M>: Send + Sync + 'static {
    /// A message from `from`.
    fn on_frame(&self, from: &NodeId, msg: M);
    /// The connection to `peer` broke, or `peer` connected to us again (so frames it sent
    /// earlier may be lost).
    fn on_link_down(&self, peer: &NodeId);
    /// A frame for `peer` could not be written at all: it was not delivered.
    fn on_undeliverable(&self, peer: &NodeId, msg: M);
    /// A frame for `peer` can never be sent: it cannot be encoded, or it is larger than
    /// `max_frame`. It was dropped (resending it would fail the same way); its sender must be
    /// told.
    fn on_unsendable(&self, peer: &NodeId, msg: M, error: TransportError);
}

pub(crate) struct Shared<M> {
    pub me: NodeId,
    /// Where this node listens (told to the peers it dials).
    pub listen: SocketAddr,
    pub config: TransportConfig,
    /// Where connections come from when not from TCP.
    pub network: Option<Arc<dyn Network>>,
    pub handler: OnceLock<Arc<dyn Inbound<M>>>,
    /// Its strong count, less one, is the number of frames owed ([`Owed`]).
    pub owed: Arc<()>,
    /// Writes to peers' sockets so far.
    #[cfg(test)]
    pub writes: std::sync::atomic::AtomicUsize,
}

impl<M> Shared<M> {
    /// Whether some task of this node is about to queue a frame.
    pub fn owes(&self) -> bool {
        Arc::strong_count(&self.owed) > 1
    }
}

/// A frame the node is about to queue (the reply to an ask one of its entities is handling),
/// owed for as long as this lives. Only a hint for the writers (see the module docs): nothing
/// waits for it, and one that is dropped without a frame costs at most one scheduler turn.
#[derive(Debug)]
pub struct Owed(
    // Held only to be counted (`Arc::strong_count`).
    #[allow(dead_code)] Arc<()>,
);

/// The node's transport: a listener and one writer per peer, carrying messages of type `M`.
pub struct Transport<M> {
    shared: Arc<Shared<M>>,
    peers: Arc<Mutex<HashMap<NodeId, peer::Peer<M>>>>,
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    /// Messages to this node itself: handled by their own task, in order, never re-entrantly.
    loopback: tokio::sync::mpsc::Sender<M>,
    loopback_rx: Arc<Mutex<Option<tokio::sync::mpsc::Receiver<M>>>>,
}

impl<M> Clone for Transport<M> {
    fn clone(&self) -> Self {
        Transport {
            shared: self.shared.clone(),
            peers: self.peers.clone(),
            tasks: self.tasks.clone(),
            loopback: self.loopback.clone(),
            loopback_rx: self.loopback_rx.clone(),
        }
    }
}

impl<M: Payload> Transport<M> {
    /// A transport for node `me` serving on a bound listener.
    #[cfg(any(test, feature = "test-support"))]
    pub fn new(
        me: NodeId,
        listener: &tokio::net::TcpListener,
        config: TransportConfig,
    ) -> Result<Transport<M>, std::io::Error> {
        Ok(Self::at(me, listener.local_addr()?, config, None))
    }

    /// A transport for node `me` listening at `listen` on `network` (TCP when None).
    pub(crate) fn at(
        me: NodeId,
        listen: SocketAddr,
        config: TransportConfig,
        network: Option<Arc<dyn Network>>,
    ) -> Transport<M> {
        let local_addr = listen;
        let (loopback, rx) = tokio::sync::mpsc::channel(config.send_queue.max(1));
        let shared = Arc::new(Shared {
            me,
            listen: local_addr,
            config,
            network,
            handler: OnceLock::new(),
            owed: Arc::new(()),
            #[cfg(test)]
            writes: Default::default(),
        });
        Transport {
            shared,
            peers: Arc::default(),
            tasks: Arc::default(),
            loopback,
            loopback_rx: Arc::new(Mutex::new(Some(rx))),
        }
    }

    /// Stops accepting, closes inbound connections and drops every writer.
    pub fn shutdown(&self) {
        for t in self.tasks.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            t.abort();
        }
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The bound address.
    #[cfg(any(test, feature = "test-support"))]
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.listen
    }

    /// This node.
    pub fn me(&self) -> &NodeId {
        &self.shared.me
    }

    /// Starts accepting connections; frames go to `handler`.
    #[cfg(any(test, feature = "test-support"))]
    pub fn start(&self, listener: tokio::net::TcpListener, handler: Arc<dyn Inbound<M>>) {
        self.serve_from(Bound::Tcp(listener), handler)
    }

    /// Starts accepting connections from `listener`; frames go to `handler`.
    pub(crate) fn serve_from(&self, mut listener: Bound, handler: Arc<dyn Inbound<M>>) {
        let _ = self.shared.handler.set(handler);
        let transport = self.clone();
        let tasks = self.tasks.clone();
        let accept = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, remote)) => {
                        let transport = transport.clone();
                        let t = tokio::spawn(async move {
                            if let Err(e) = serve(stream, remote, &transport).await {
                                debug!(%remote, error = %e, "inbound connection closed");
                            }
                        });
                        let mut tasks = tasks.lock().unwrap_or_else(|e| e.into_inner());
                        tasks.retain(|t| !t.is_finished());
                        tasks.push(t.abort_handle());
                    }
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).push(accept.abort_handle());
        if let Some(mut rx) = self.loopback_rx.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let shared = self.shared.clone();
            let lo = tokio::spawn(async move {
                while let Some(f) = rx.recv().await {
                    if let Some(h) = shared.handler.get() {
                        h.on_frame(&shared.me, f);
                    }
                }
            });
            self.tasks.lock().unwrap_or_else(|e| e.into_inner()).push(lo.abort_handle());
        }
    }

    /// Where to reach `node`. Creates its writer on first use.
    pub fn set_address(&self, node: &NodeId, addr: SocketAddr) {
        if node == &self.shared.me {
            return;
        }
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.entry(node.clone()).or_insert_with(|| peer::Peer::spawn(node.clone(), addr, self.shared.clone()));
    }

    /// Whether a writer exists for `node`.
    #[cfg(any(test, feature = "test-support"))]
    pub fn knows(&self, node: &NodeId) -> bool {
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).contains_key(node)
    }

    /// Drops the writer of a node that left or died, and reports the link down: a frame the
    /// writer wrote just before the peer died may be lost without any write failing (a drain
    /// marker, say), and nothing else would ever tell the sender. Frames for it from now on come
    /// back at once as undeliverable.
    pub fn forget(&self, node: &NodeId) {
        let removed = self.peers.lock().unwrap_or_else(|e| e.into_inner()).remove(node);
        if removed.is_some() {
            if let Some(h) = self.shared.handler.get() {
                h.on_link_down(node);
            }
        }
    }

    /// Marks a frame as owed until the returned guard is dropped: see [`Owed`].
    pub fn owe(&self) -> Owed {
        Owed(self.shared.owed.clone())
    }

    /// Queues a message for `to` (this node included).
    pub fn send(&self, to: &NodeId, frame: M) -> Result<(), SendError<M>> {
        if to == &self.shared.me {
            return self.loopback.try_send(frame).map_err(|e| match e {
                tokio::sync::mpsc::error::TrySendError::Full(f) => SendError::Full(Box::new(f)),
                tokio::sync::mpsc::error::TrySendError::Closed(f) => SendError::NoRoute(Box::new(f)),
            });
        }
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        match peers.get(to) {
            Some(p) => p.send(frame),
            None => Err(SendError::NoRoute(Box::new(frame))),
        }
    }

    /// Queues a frame for `to`, waiting in a task for room when its queue is full. For small
    /// protocol frames (drain markers, their answers, bounces) that must not be lost to a
    /// momentary burst: they are bounded by the messages that caused them. A frame for a peer
    /// that is gone comes back as undeliverable.
    pub fn send_when_ready(&self, to: &NodeId, frame: M) {
        let tx = if to == &self.shared.me {
            Some(self.loopback.clone())
        } else {
            self.peers.lock().unwrap_or_else(|e| e.into_inner()).get(to).map(|p| p.sender())
        };
        let shared = self.shared.clone();
        let to = to.clone();
        tokio::spawn(async move {
            let unsent = match tx {
                Some(tx) => tx.send(frame).await.err().map(|e| e.0),
                None => Some(frame),
            };
            if let (Some(frame), Some(h)) = (unsent, shared.handler.get()) {
                h.on_undeliverable(&to, frame);
            }
        });
    }

    /// Sends one message to an address whose node is not known yet (e.g. a seed), on a
    /// short-lived connection. Returns the node that answered.
    pub async fn send_to_address(&self, addr: SocketAddr, msg: M) -> Result<NodeId, TransportError> {
        let timeout = self.shared.config.connect_timeout;
        let (mut stream, node, _) = tokio::time::timeout(timeout, dial(addr, None, &self.shared))
            .await
            .map_err(|_| TransportError::HandshakeTimeout)??;
        let mut buf = Vec::new();
        wire::append_message(&msg, None, &mut buf, self.shared.config.max_frame)?;
        stream.write_all(&buf).await?;
        stream.flush().await?;
        // TLS: say goodbye, so that the peer reads the message rather than a truncated stream.
        let _ = stream.shutdown().await;
        Ok(node)
    }

    /// Which node listens at `addr`: dials it and completes the handshake, sending nothing else.
    /// A refused connection comes back as [`TransportError::Io`] of kind `ConnectionRefused`:
    /// the host answered that nothing listens there.
    pub async fn identify(&self, addr: SocketAddr) -> Result<NodeId, TransportError> {
        let timeout = self.shared.config.connect_timeout;
        let (mut stream, node, _) = tokio::time::timeout(timeout, dial(addr, None, &self.shared))
            .await
            .map_err(|_| TransportError::HandshakeTimeout)??;
        let _ = stream.shutdown().await;
        Ok(node)
    }
}

/// Dials `addr` and completes the handshake as the dialer.
pub(crate) async fn dial<M: Payload>(
    addr: SocketAddr,
    expect: Option<&NodeId>,
    shared: &Shared<M>,
) -> Result<(Link, NodeId, u32), TransportError> {
    let mut stream = match &shared.network {
        None => {
            let tcp = TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            Link::dial(tcp, shared.config.tls.as_ref()).await?
        }
        Some(network) => Link::Other(network.connect(addr).await?),
    };
    let hello = Wire::<M>::Hello {
        protocol: OLDEST_PROTOCOL,
        cluster: shared.config.cluster.clone(),
        from: shared.me.clone(),
        listen: shared.listen,
        to: expect.cloned(),
        newest: PROTOCOL_VERSION,
    };
    let mut buf = Vec::new();
    hello.encode_into(&mut buf)?;
    stream.write_all(&buf).await?;
    let answer = read_frame::<M, _>(&mut stream, shared.config.max_frame).await?;
    match handshake::accept_answer(answer, expect, |name| stream.check_peer(name)) {
        Ok((node, protocol)) => {
            debug!(%addr, peer = %node, protocol, "connected");
            Ok((stream, node, protocol))
        }
        Err(e @ TransportError::NotCertified { .. }) => {
            warn!(%addr, error = %e, "refusing connection");
            metrics::counter!("shardline_transport_refused_total").increment(1);
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// Reads one length-prefixed frame, enforcing the size limit before allocating.
pub(crate) async fn read_frame<M: Payload, R: AsyncReadExt + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Wire<M>, TransportError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(TransportError::FrameTooLarge { len, max });
    }
    // Grown as the bytes arrive, not allocated as announced: a peer that announces the largest
    // frame and then sends nothing holds no more memory than it sent (twice at most). A frame up
    // to 64 KiB, all the usual ones, is one allocation and one read, as before.
    const STEP: usize = 64 * 1024;
    let mut body = Vec::new();
    while body.len() < len {
        let start = body.len();
        body.resize(start + (len - start).min(STEP.max(start)), 0);
        r.read_exact(&mut body[start..]).await?;
    }
    Wire::decode(&body)
}

/// Serves one inbound connection: handshake as the acceptor, then read frames until it closes.
async fn serve<M: Payload>(
    accepted: Accepted,
    remote: SocketAddr,
    transport: &Transport<M>,
) -> Result<(), TransportError> {
    let shared = &*transport.shared;
    // Logged and counted, but for a probe that connects and closes (a port check): no peer to
    // refuse.
    let refused = |e: TransportError| {
        if !matches!(&e, TransportError::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof) {
            warn!(%remote, error = %e, "refusing connection");
            metrics::counter!("shardline_transport_refused_total").increment(1);
        }
        e
    };
    let timeout = shared.config.connect_timeout;
    let mut stream = tokio::time::timeout(timeout, Link::accept(accepted, shared.config.tls.as_ref()))
        .await
        .map_err(|_| refused(TransportError::HandshakeTimeout))?
        .map_err(refused)?;
    let hello = tokio::time::timeout(timeout, read_frame::<M, _>(&mut stream, shared.config.max_frame))
        .await
        .map_err(|_| refused(TransportError::HandshakeTimeout))?
        .map_err(|e| refused(handshake::unreadable_hello(e)))?;
    let checked = handshake::accept_hello(hello, &shared.me, &shared.config.cluster, |name| stream.check_peer(name));
    let mut buf = Vec::new();
    let Greeting { from, listen, by_address, protocol } = match checked {
        Ok(g) => g,
        Err((from, e)) => {
            match from {
                Some(peer) => warn!(%remote, %peer, error = %e, "refusing connection"),
                None => warn!(%remote, error = %e, "refusing connection"),
            }
            metrics::counter!("shardline_transport_refused_total").increment(1);
            Wire::<M>::Refuse { reason: e.to_string() }.encode_into(&mut buf)?;
            let _ = stream.write_all(&buf).await;
            let _ = stream.flush().await;
            return Err(e);
        }
    };
    debug!(%remote, peer = %from, protocol, "accepted");
    Wire::<M>::HelloOk { node: shared.me.clone(), protocol: Some(protocol) }.encode_into(&mut buf)?;
    stream.write_all(&buf).await?;
    stream.flush().await?;
    let Some(handler) = shared.handler.get() else { return Ok(()) };
    // A new connection from a peer means its previous one (if any) broke. Not so for a dial by
    // address (a seed, or a member held down): that short-lived connection is not the peer's
    // connection and leaves it as it was.
    if !by_address {
        handler.on_link_down(&from);
        // A peer that dials this node as a member may ask before membership has told this node
        // where it listens (it just joined): without a writer the answers would have nowhere to
        // go. An address membership gave already is kept.
        transport.set_address(&from, listen);
    }
    let mut reader = tokio::io::BufReader::with_capacity(64 * 1024, stream);
    loop {
        match read_frame::<M, _>(&mut reader, shared.config.max_frame).await {
            Ok(Wire::Message(msg)) => handler.on_frame(&from, msg),
            Ok(other) => {
                let e = TransportError::Decode(format!("{} after the handshake", other.kind()));
                warn!(peer = %from, error = %e, "closing connection");
                metrics::counter!("shardline_transport_bad_frames_total").increment(1);
                return Err(e);
            }
            Err(TransportError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => {
                warn!(peer = %from, error = %e, "closing connection");
                metrics::counter!("shardline_transport_bad_frames_total").increment(1);
                return Err(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame larger than one read step arrives whole; one cut short is an end of stream, not a
    /// frame.
    #[tokio::test]
    async fn frames_are_read_whole_in_steps_and_a_cut_one_is_an_error() {
        let big = vec![7u8; 200 * 1024 + 3];
        let mut buf = Vec::new();
        wire::append_message(&big, None, &mut buf, DEFAULT_MAX_FRAME).unwrap();
        match read_frame::<Vec<u8>, _>(&mut buf.as_slice(), DEFAULT_MAX_FRAME).await.unwrap() {
            Wire::Message(m) => assert_eq!(m, big),
            other => panic!("{}", other.kind()),
        }
        let cut = &buf[..buf.len() - 1];
        let err = read_frame::<Vec<u8>, _>(&mut &cut[..], DEFAULT_MAX_FRAME).await.unwrap_err();
        assert!(matches!(&err, TransportError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof), "{err:?}");
    }
}
