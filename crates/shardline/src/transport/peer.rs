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
        let (mut stream, protocol) = match attempt {
            Ok(Ok((s, _, protocol))) => {
                backoff = shared.config.backoff_initial;
                debug!(peer = %node, %addr, protocol, "connected");
                (s, protocol)
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
            let traces = writes_trailers(protocol);
            if let Err(e) = append(&frame, traces, &mut buf, max) {
                unsendable(&node, &shared, frame, e);
                continue;
            }
            if gather(&node, &shared, &mut rx, &mut buf, traces) == 0 && shared.owes() {
                // Tasks about to queue more (the other replies to one read's asks) are ready to
                // run: let them, once, so that they leave with this frame.
                tokio::task::yield_now().await;
                gather(&node, &shared, &mut rx, &mut buf, traces);
            }
            if let Err(e) = stream.write_all(&buf).await {
                break e;
            }
            // TLS keeps what it could not write yet; plain TCP has nothing to flush.
            if let Err(e) = stream.flush().await {
                break e;
            }
            #[cfg(test)]
            shared.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// Whether a connection that agreed on `protocol` carries traces in its frames' trailers: never
/// to a node of version 3 or 4, so that it reads exactly what it wrote.
fn writes_trailers(protocol: u32) -> bool {
    protocol >= wire::TRAILER_PROTOCOL
}

/// Appends one message's frame to `buf`, with its trace in the trailer when the connection
/// `traces` ([`writes_trailers`]). A message that fits only without its trailer goes without
/// it: a trace is never why a message is not sent.
fn append<M: Payload>(frame: &M, traces: bool, buf: &mut Vec<u8>, max: usize) -> Result<(), super::TransportError> {
    let Some(trace) = frame.trace().filter(|_| traces) else {
        return wire::append_message(frame, None, buf, max);
    };
    match wire::append_message(frame, Some(&trace), buf, max) {
        Err(super::TransportError::FrameTooLarge { .. }) => wire::append_message(frame, None, buf, max),
        done => done,
    }
}

/// Appends what is queued to `buf`, up to a write's worth; returns how many frames it took.
fn gather<M: Payload>(
    node: &NodeId,
    shared: &Shared<M>,
    rx: &mut mpsc::Receiver<M>,
    buf: &mut Vec<u8>,
    traces: bool,
) -> usize {
    let mut taken = 0;
    while buf.len() < 256 * 1024 {
        let Ok(f) = rx.try_recv() else { break };
        taken += 1;
        if let Err(e) = append(&f, traces, buf, shared.config.max_frame) {
            unsendable(node, shared, f, e);
        }
    }
    taken
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use tokio::net::TcpListener;

    use super::super::{read_frame, Transport, TransportConfig, Wire, PROTOCOL_VERSION};
    use super::*;
    use crate::trace::TraceContext;

    /// A message that carries a trace.
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Traced(Vec<u8>);

    impl Payload for Traced {
        fn trace(&self) -> Option<TraceContext> {
            Some(TraceContext { trace_id: [7; 16], span_id: [8; 8], flags: 1 })
        }
    }

    /// Versions 3 and 4 get no trailer, 5 does; a message that fits only without its trailer is
    /// sent without it.
    #[test]
    fn trailers_go_only_to_nodes_of_version_5_and_never_cost_a_message() {
        assert_eq!([3, 4, 5, 6].map(writes_trailers), [false, false, true, true]);
        let msg = Traced(vec![1; 10]);
        let (mut bare, mut traced) = (Vec::new(), Vec::new());
        append(&msg, false, &mut bare, usize::MAX).unwrap();
        append(&msg, true, &mut traced, usize::MAX).unwrap();
        assert_eq!(traced.len(), bare.len() + 25);
        assert_eq!(&traced[4..bare.len()], &bare[4..]);
        let mut tight = Vec::new();
        append(&msg, true, &mut tight, bare.len() - 4).unwrap();
        assert_eq!(tight, bare);
    }

    /// A peer that completes the handshake as `me`, then reads everything it is sent.
    async fn sink(me: NodeId) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            read_frame::<(), _>(&mut s, 1 << 20).await.unwrap();
            let mut buf = Vec::new();
            Wire::<()>::HelloOk { node: me, protocol: Some(PROTOCOL_VERSION) }.encode_into(&mut buf).unwrap();
            s.write_all(&buf).await.unwrap();
            let mut sink = [0u8; 4096];
            while tokio::io::AsyncReadExt::read(&mut s, &mut sink).await.is_ok_and(|n| n > 0) {}
        });
        addr
    }

    /// Ten tasks, ready at once, each queue one frame to one peer (as the replies to one read's
    /// asks do); with `owed`, each owes its frame until it has queued it. Returns how many writes
    /// carried them.
    async fn burst(owed: bool) -> usize {
        let peer = NodeId::new("peer", 1);
        let addr = sink(peer.clone()).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let t: Transport<()> = Transport::new(NodeId::new("me", 1), &listener, TransportConfig::new("test")).unwrap();
        t.set_address(&peer, addr);
        // Connected, and the writer idle again.
        t.send(&peer, ()).unwrap();
        while t.shared.writes.load(Ordering::Relaxed) < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let tasks: Vec<_> = (0..10)
            .map(|_| {
                let (t, peer, owes) = (t.clone(), peer.clone(), owed.then(|| t.owe()));
                tokio::spawn(async move {
                    t.send(&peer, ()).unwrap();
                    drop(owes);
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        while t.shared.writes.load(Ordering::Relaxed) < 2 || t.shared.owes() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Whatever is still queued is written by now.
        tokio::time::sleep(Duration::from_millis(50)).await;
        t.shared.writes.load(Ordering::Relaxed) - 1
    }

    // One worker: a woken task runs next (tokio's LIFO slot), so the writer woken by the first
    // frame runs before the nine tasks about to queue theirs, as it does under load.
    #[test]
    fn frames_owed_by_ready_tasks_leave_in_one_write() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        // The yield lasts until the worker next polls for I/O, which it also does every so many
        // tasks: at most once among ten. The one worker shares the machine with the other tests,
        // which may take its core away in the middle of a burst: the best of five bursts counts
        // (without owing, every burst writes frame by frame, so the check still fails then).
        let owed = (0..5).map(|_| rt.block_on(burst(true))).min().unwrap_or(usize::MAX);
        assert!(owed <= 2, "owed frames wait for the ready tasks' and leave with them: {owed} writes");
        let alone = (0..5).map(|_| rt.block_on(burst(false))).max().unwrap_or(0);
        assert!(alone > 2, "nothing owed: each frame leaves at once, alone: {alone} writes");
    }
}
