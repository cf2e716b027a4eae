//! The simulated network: byte streams between hosts, delivered by the world's step, with the
//! faults the world chooses.
//!
//! It behaves as TCP does, not as a datagram network: a connection delivers its bytes in order
//! or breaks, it never loses some and goes on. So message loss is what TCP makes of it, a delay
//! (a retransmission); a cut link holds the bytes until it heals (TCP keeps retransmitting) or
//! the world resets the connection; a crashed process's connections end (its kernel closes them)
//! and writes to it fail. Each stream has a window: a writer whose bytes are held stops.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use shardline::membership::BoxFuture;
use shardline::{Connection, Listener, Network};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use super::rng::Rng;

/// Bytes in flight per direction before a writer waits (a TCP window).
const WINDOW: usize = 256 * 1024;

/// One direction of a connection.
struct Pipe {
    from: IpAddr,
    to: IpAddr,
    /// Chunks on the wire, each with the time (ms) it may arrive.
    wire: VecDeque<(u64, Vec<u8>)>,
    in_flight: usize,
    /// Arrived, not read yet.
    arrived: VecDeque<u8>,
    /// The writer closed its end after what is on the wire.
    fin: bool,
    /// Reset: reads and writes fail.
    reset: bool,
    /// The reader is gone: writes fail.
    reader_gone: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

impl Pipe {
    fn new(from: IpAddr, to: IpAddr) -> Self {
        Pipe {
            from,
            to,
            wire: VecDeque::new(),
            in_flight: 0,
            arrived: VecDeque::new(),
            fin: false,
            reset: false,
            reader_gone: false,
            reader: None,
            writer: None,
        }
    }

    fn wake(&mut self) {
        if let Some(w) = self.reader.take() {
            w.wake();
        }
        if let Some(w) = self.writer.take() {
            w.wake();
        }
    }
}

type PipeRef = Arc<Mutex<Pipe>>;

/// Where a listener's accepted connections go.
type Accepts = mpsc::UnboundedSender<(Box<dyn Connection>, SocketAddr)>;

fn lock(p: &PipeRef) -> MutexGuard<'_, Pipe> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the world controls.
struct State {
    now_ms: u64,
    rng: Rng,
    /// `(from, to)`: nothing from `from` reaches `to`.
    cut: HashSet<(IpAddr, IpAddr)>,
    /// Extra delay of every chunk, up to this many ms (loss turned into retransmissions).
    jitter_ms: u64,
    listeners: HashMap<SocketAddr, Accepts>,
    pipes: Vec<PipeRef>,
    next_port: u16,
}

/// The network of one simulated world.
#[derive(Clone)]
pub struct SimNet {
    state: Arc<Mutex<State>>,
}

impl SimNet {
    /// A network whose delays are drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        SimNet {
            state: Arc::new(Mutex::new(State {
                now_ms: 0,
                rng: Rng::new(seed),
                cut: HashSet::new(),
                jitter_ms: 0,
                listeners: HashMap::new(),
                pipes: Vec::new(),
                next_port: 40_000,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The network as host `ip` sees it.
    pub fn host(&self, ip: IpAddr) -> Arc<dyn Network> {
        Arc::new(HostNet { ip, net: self.clone() })
    }

    /// Holds the bytes from `from` to `to` until [`heal_all`](Self::heal_all).
    pub fn cut(&self, from: IpAddr, to: IpAddr) {
        self.lock().cut.insert((from, to));
    }

    /// Ends every cut.
    pub fn heal_all(&self) {
        self.lock().cut.clear();
    }

    /// Whether bytes from `from` to `to` are held.
    pub fn is_cut(&self, from: IpAddr, to: IpAddr) -> bool {
        self.lock().cut.contains(&(from, to))
    }

    /// Every chunk on the wire takes up to `ms` longer (0: none).
    pub fn set_jitter(&self, ms: u64) {
        self.lock().jitter_ms = ms;
    }

    /// Resets every connection between `a` and `b` (either way): both ends see an error.
    pub fn reset_between(&self, a: IpAddr, b: IpAddr) {
        let st = self.lock();
        for p in &st.pipes {
            let mut p = lock(p);
            if (p.from == a && p.to == b) || (p.from == b && p.to == a) {
                p.reset = true;
                p.wire.clear();
                p.in_flight = 0;
                p.wake();
            }
        }
    }

    /// A host's listeners are gone (its process ended).
    pub fn unbind(&self, ip: IpAddr) {
        self.lock().listeners.retain(|a, _| a.ip() != ip);
    }

    /// Moves the network to `now_ms`: delivers what may arrive on links that are not cut.
    pub fn advance(&self, now_ms: u64) {
        let mut st = self.lock();
        st.now_ms = now_ms;
        let cut = st.cut.clone();
        st.pipes.retain(|pipe| {
            let mut p = lock(pipe);
            if !cut.contains(&(p.from, p.to)) {
                let mut delivered = false;
                while p.wire.front().is_some_and(|(at, _)| *at <= now_ms) {
                    if let Some((_, chunk)) = p.wire.pop_front() {
                        p.in_flight -= chunk.len();
                        p.arrived.extend(chunk);
                        delivered = true;
                    }
                }
                if delivered || (p.fin && p.wire.is_empty()) {
                    p.wake();
                }
            }
            drop(p);
            // Kept while an end holds it.
            Arc::strong_count(pipe) > 1
        });
    }

    /// When a chunk written now from `from` to `to` may arrive.
    fn arrival(&self, st: &mut State, last: Option<u64>) -> u64 {
        let jitter = if st.jitter_ms > 0 { st.rng.below(st.jitter_ms + 1) } else { 0 };
        let at = st.now_ms + 1 + st.rng.below(3) + jitter;
        // In order: never before the chunk written before it.
        last.map_or(at, |l| at.max(l))
    }
}

/// The network seen from one host.
struct HostNet {
    ip: IpAddr,
    net: SimNet,
}

impl Network for HostNet {
    fn bind(&self, addr: &str) -> BoxFuture<'static, io::Result<Box<dyn Listener>>> {
        let net = self.net.clone();
        let ip = self.ip;
        let wanted: Result<SocketAddr, _> = addr.parse();
        Box::pin(async move {
            let wanted = wanted.map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let mut st = net.lock();
            let port = if wanted.port() == 0 {
                st.next_port += 1;
                st.next_port
            } else {
                wanted.port()
            };
            let addr = SocketAddr::new(ip, port);
            if st.listeners.contains_key(&addr) {
                return Err(io::Error::new(io::ErrorKind::AddrInUse, addr.to_string()));
            }
            let (tx, rx) = mpsc::unbounded_channel();
            st.listeners.insert(addr, tx);
            drop(st);
            Ok(Box::new(SimListener { addr, rx, net }) as Box<dyn Listener>)
        })
    }

    fn connect(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<Box<dyn Connection>>> {
        let net = self.net.clone();
        let me = self.ip;
        Box::pin(async move {
            // A SYN over a cut link is retried until the link heals or the caller gives up.
            while net.is_cut(me, addr.ip()) || net.is_cut(addr.ip(), me) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            let mut st = net.lock();
            let Some(tx) = st.listeners.get(&addr).cloned() else {
                return Err(io::Error::new(io::ErrorKind::ConnectionRefused, addr.to_string()));
            };
            st.next_port += 1;
            let local = SocketAddr::new(me, st.next_port);
            let out: PipeRef = Arc::new(Mutex::new(Pipe::new(me, addr.ip())));
            let back: PipeRef = Arc::new(Mutex::new(Pipe::new(addr.ip(), me)));
            st.pipes.push(out.clone());
            st.pipes.push(back.clone());
            let mine = SimStream { net: net.clone(), out: out.clone(), inbound: back.clone() };
            let theirs = SimStream { net: net.clone(), out: back, inbound: out };
            drop(st);
            tx.send((Box::new(theirs), local))
                .map_err(|_| io::Error::new(io::ErrorKind::ConnectionRefused, addr.to_string()))?;
            Ok(Box::new(mine) as Box<dyn Connection>)
        })
    }
}

struct SimListener {
    addr: SocketAddr,
    rx: mpsc::UnboundedReceiver<(Box<dyn Connection>, SocketAddr)>,
    net: SimNet,
}

impl Drop for SimListener {
    /// The port is free again (a node of the same host restarts on it).
    fn drop(&mut self) {
        self.rx.close();
        let mut st = self.net.lock();
        if st.listeners.get(&self.addr).is_some_and(|tx| tx.is_closed()) {
            st.listeners.remove(&self.addr);
        }
    }
}

impl Listener for SimListener {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }

    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Box<dyn Connection>, SocketAddr)>> {
        Box::pin(async move {
            self.rx.recv().await.ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "listener closed"))
        })
    }
}

/// One end of a connection.
struct SimStream {
    net: SimNet,
    out: PipeRef,
    inbound: PipeRef,
}

impl AsyncRead for SimStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut p = lock(&self.inbound);
        if p.reset {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        if !p.arrived.is_empty() {
            let n = buf.remaining().min(p.arrived.len());
            let (a, b) = p.arrived.as_slices();
            let from_a = n.min(a.len());
            buf.put_slice(&a[..from_a]);
            buf.put_slice(&b[..n - from_a]);
            p.arrived.drain(..n);
            return Poll::Ready(Ok(()));
        }
        if p.fin && p.wire.is_empty() {
            return Poll::Ready(Ok(()));
        }
        p.reader = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let mut st = self.net.lock();
        let mut p = lock(&self.out);
        if p.reset {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        if p.reader_gone || p.fin {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if p.in_flight >= WINDOW {
            p.writer = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = buf.len().min(WINDOW - p.in_flight);
        let last = p.wire.back().map(|(at, _)| *at);
        let at = self.net.arrival(&mut st, last);
        p.wire.push_back((at, buf[..n].to_vec()));
        p.in_flight += n;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.out).fin = true;
        Poll::Ready(Ok(()))
    }
}

impl Drop for SimStream {
    fn drop(&mut self) {
        // The kernel closes the socket: what was written still arrives, then the end; the other
        // side's writes fail from now on.
        let mut out = lock(&self.out);
        out.fin = true;
        out.wake();
        drop(out);
        let mut inbound = lock(&self.inbound);
        inbound.reader_gone = true;
        inbound.reader = None;
        inbound.wake();
    }
}
