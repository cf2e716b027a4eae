//! The physical floors the ask benches compare against: for local asks, a task per entity behind
//! a channel ([`LocalFloor`]); for remote asks, a bare TCP echo server in another process, and two
//! bare clients of it.
//!
//! The strongest floor is the bare version of what the runtime itself does: every caller shares
//! one connection, each request carries an id, one writer task coalesces whatever requests are
//! waiting into one write, and one reader task hands each reply to its caller by id
//! ([`Multiplexed`]). One connection per caller, each in ping-pong ([`PingPong`]), is the slowest
//! way to use sockets under load and is kept as a second figure only; a single caller in
//! ping-pong is the floor of one ask's latency.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// Bytes after the length prefix of every request and reply: the size of an ask of a `u64`.
pub const PAYLOAD: usize = 48;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Connects to `addr`, retrying for a few seconds while the server process starts.
async fn connect(addr: &str) -> Result<TcpStream, BoxError> {
    let mut tries = 0;
    loop {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(_) if tries < 100 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The local floor: one task per entity behind a bounded channel, answering on a oneshot, doing
/// the `Echo` entity's work (count, answer with the message).
pub struct LocalFloor {
    mailboxes: Vec<mpsc::Sender<(u64, oneshot::Sender<u64>)>>,
}

impl LocalFloor {
    /// `n` entities' tasks, started.
    pub fn start(n: u64) -> Arc<LocalFloor> {
        let mut mailboxes = Vec::new();
        for _ in 0..n.max(1) {
            let (tx, mut rx) = mpsc::channel::<(u64, oneshot::Sender<u64>)>(1024);
            tokio::spawn(async move {
                let mut count = 0u64;
                while let Some((m, reply)) = rx.recv().await {
                    count = std::hint::black_box(count + 1);
                    let _ = reply.send(m);
                }
            });
            mailboxes.push(tx);
        }
        Arc::new(LocalFloor { mailboxes })
    }

    /// One ask of the entity `rng` picks.
    pub async fn call(&self, rng: u64) -> bool {
        let (tx, rx) = oneshot::channel();
        let to = &self.mailboxes[(rng % self.mailboxes.len() as u64) as usize];
        to.send((rng, tx)).await.is_ok() && rx.await.is_ok()
    }
}

/// A frame of `PAYLOAD` bytes that starts with `id`.
fn frame(id: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&(PAYLOAD as u32).to_be_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.resize(out.len() + PAYLOAD - 8, 7);
}

/// One connection per caller, each used in ping-pong.
pub struct PingPong {
    conns: Vec<tokio::sync::Mutex<TcpStream>>,
}

impl PingPong {
    /// `callers` connections to the echo server at `addr`.
    pub async fn connect(addr: &str, callers: u64) -> Result<PingPong, BoxError> {
        let mut conns = Vec::new();
        for _ in 0..callers {
            conns.push(tokio::sync::Mutex::new(connect(addr).await?));
        }
        Ok(PingPong { conns })
    }

    /// One request and its reply on caller `w`'s connection.
    pub async fn call(&self, w: u64) -> bool {
        let Some(c) = self.conns.get(w as usize) else { return false };
        let mut s = c.lock().await;
        let mut buf = Vec::with_capacity(PAYLOAD + 4);
        frame(w, &mut buf);
        if s.write_all(&buf).await.is_err() {
            return false;
        }
        s.read_exact(&mut buf).await.is_ok()
    }
}

/// Every caller on one connection: requests tagged with an id, written in batches by one writer
/// task, replies handed back by one reader task.
pub struct Multiplexed {
    requests: mpsc::Sender<u64>,
    waiting: Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>,
    next: AtomicU64,
}

impl Multiplexed {
    /// One connection to the echo server at `addr`, with its writer and reader tasks.
    pub async fn connect(addr: &str) -> Result<Multiplexed, BoxError> {
        let (read, mut write) = connect(addr).await?.into_split();
        let (requests, mut rx) = mpsc::channel::<u64>(65_536);
        let waiting: Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>> = Arc::default();
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(64 * 1024);
            while let Some(id) = rx.recv().await {
                buf.clear();
                frame(id, &mut buf);
                while let Ok(id) = rx.try_recv() {
                    frame(id, &mut buf);
                }
                if write.write_all(&buf).await.is_err() {
                    return;
                }
            }
        });
        let answered = waiting.clone();
        tokio::spawn(async move {
            let mut read = BufReader::with_capacity(64 * 1024, read);
            let mut body = [0u8; PAYLOAD];
            loop {
                let mut len = [0u8; 4];
                if read.read_exact(&mut len).await.is_err() || u32::from_be_bytes(len) as usize != PAYLOAD {
                    break;
                }
                if read.read_exact(&mut body).await.is_err() {
                    break;
                }
                let mut id = [0u8; 8];
                id.copy_from_slice(&body[..8]);
                let tx = answered.lock().unwrap_or_else(|e| e.into_inner()).remove(&u64::from_le_bytes(id));
                if let Some(tx) = tx {
                    let _ = tx.send(());
                }
            }
            // The connection is gone: every caller still waiting hears so instead of hanging.
            answered.lock().unwrap_or_else(|e| e.into_inner()).clear();
        });
        Ok(Multiplexed { requests, waiting, next: AtomicU64::new(0) })
    }

    /// One request and its reply.
    pub async fn call(&self) -> bool {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        self.requests.send(id).await.is_ok() && rx.await.is_ok()
    }
}

/// The floors' server: echoes length-prefixed frames, writing every reply it has when no more
/// requests are waiting in its read buffer (one write per request in ping-pong, one per batch
/// when multiplexed), as the runtime's writer does.
pub async fn echo_server(bind: &str) -> i32 {
    let l = match TcpListener::bind(bind).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot bind {bind}: {e}");
            return 1;
        }
    };
    loop {
        let Ok((s, _)) = l.accept().await else { continue };
        let _ = s.set_nodelay(true);
        tokio::spawn(async move {
            let (read, mut write) = s.into_split();
            let mut read = BufReader::with_capacity(64 * 1024, read);
            let mut out = Vec::with_capacity(64 * 1024);
            let mut body = Vec::new();
            loop {
                let mut len = [0u8; 4];
                if read.read_exact(&mut len).await.is_err() {
                    return;
                }
                let n = u32::from_be_bytes(len) as usize;
                if n > 1 << 20 {
                    return;
                }
                body.resize(n, 0);
                if read.read_exact(&mut body).await.is_err() {
                    return;
                }
                out.extend_from_slice(&len);
                out.extend_from_slice(&body);
                if read.buffer().is_empty() || out.len() >= 64 * 1024 {
                    if write.write_all(&out).await.is_err() {
                        return;
                    }
                    out.clear();
                }
            }
        });
    }
}
