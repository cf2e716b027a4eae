//! The exporter: a bounded queue of closed spans, and one thread that posts them in batches.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::layer::Exported;
use crate::{json, OtlpConfig, OtlpError};

enum Msg {
    Span(Box<Exported>),
    /// Send what is queued, then answer.
    Flush(SyncSender<()>),
}

/// Where the layer puts closed spans. Never blocks: a full queue loses the span, counted.
pub(crate) struct Queue {
    tx: SyncSender<Msg>,
    lost: Arc<Lost>,
}

/// Spans lost: since the exporter last said so, and in all.
#[derive(Default)]
struct Lost {
    untold: AtomicU64,
    total: AtomicU64,
}

impl Lost {
    fn add(&self, n: u64) {
        self.untold.fetch_add(n, Ordering::Relaxed);
        self.total.fetch_add(n, Ordering::Relaxed);
    }
}

impl Queue {
    pub fn push(&self, span: Exported) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(Msg::Span(Box::new(span)))
        {
            // Told by the exporter at its next request, not here: a log line per lost span
            // would be a flood exactly when the exporter is behind.
            self.lost.add(1);
            metrics::counter!("shardline_otlp_spans_lost_total", "reason" => "queue_full").increment(1);
        }
    }
}

/// Flushes the exporter: explicitly with [`flush`](Self::flush), or when dropped (waiting up to
/// the request timeout).
pub struct OtlpGuard {
    tx: SyncSender<Msg>,
    timeout: Duration,
    lost: Arc<Lost>,
}

impl OtlpGuard {
    /// Spans lost so far: to a full queue, or in requests the collector did not take.
    pub fn lost(&self) -> u64 {
        self.lost.total.load(Ordering::Relaxed)
    }

    /// Posts every span closed so far, waiting up to `within` (blocking the calling thread). A
    /// batch the collector did not take is not an error here: it is logged and counted in
    /// [`lost`](Self::lost).
    pub fn flush(&self, within: Duration) -> Result<(), OtlpError> {
        let (done, wait) = mpsc::sync_channel(1);
        let deadline = Instant::now() + within;
        // The queue may be full: keep offering the flush until the deadline.
        let mut msg = Msg::Flush(done);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return Err(OtlpError::FlushTimeout(within)),
            }
        }
        wait.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .map_err(|_| OtlpError::FlushTimeout(within))
    }
}

impl Drop for OtlpGuard {
    fn drop(&mut self) {
        if let Err(e) = self.flush(self.timeout) {
            warn!(error = %e, "spans not exported at shutdown");
        }
    }
}

pub(crate) fn start(config: OtlpConfig) -> Result<(Queue, OtlpGuard), OtlpError> {
    let (tx, rx) = mpsc::sync_channel(config.queue.max(1));
    let lost = Arc::new(Lost::default());
    let guard = OtlpGuard { tx: tx.clone(), timeout: config.timeout, lost: lost.clone() };
    let counted = lost.clone();
    std::thread::Builder::new()
        .name("shardline-otlp".into())
        .spawn(move || run(config, rx, counted))
        .map_err(OtlpError::Thread)?;
    Ok((Queue { tx, lost }, guard))
}

fn run(mut config: OtlpConfig, rx: Receiver<Msg>, lost: Arc<Lost>) {
    // A zero interval would turn the wait below into a spin.
    config.interval = config.interval.max(Duration::from_millis(1));
    let mut batch: Vec<Exported> = Vec::with_capacity(config.batch);
    let mut oldest: Option<Instant> = None;
    loop {
        let wait = oldest.map_or(config.interval, |t| config.interval.saturating_sub(t.elapsed()));
        let flush = match rx.recv_timeout(wait) {
            Ok(Msg::Span(s)) => {
                batch.push(*s);
                oldest.get_or_insert_with(Instant::now);
                if batch.len() < config.batch {
                    continue;
                }
                None
            }
            Ok(Msg::Flush(done)) => Some(done),
            Err(RecvTimeoutError::Timeout) => None,
            // Every sender is gone (the guard and the layer): send the rest, and end.
            Err(RecvTimeoutError::Disconnected) => {
                send(&config, &mut batch, &lost);
                return;
            }
        };
        send(&config, &mut batch, &lost);
        oldest = None;
        if let Some(done) = flush {
            let _ = done.send(());
        }
    }
}

/// Posts `batch` (emptied either way); a failure is logged and counted with the spans it lost.
fn send(config: &OtlpConfig, batch: &mut Vec<Exported>, lost: &Lost) {
    let dropped = lost.untold.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        warn!(spans = dropped, "the exporter's queue was full: spans lost");
    }
    if batch.is_empty() {
        return;
    }
    let body = json::traces(&config.service, batch);
    if let Err(e) = post(config, body.as_bytes()) {
        warn!(collector = %config.authority, spans = batch.len(), error = %e, "spans not exported");
        lost.total.fetch_add(batch.len() as u64, Ordering::Relaxed);
        metrics::counter!("shardline_otlp_spans_lost_total", "reason" => "collector").increment(batch.len() as u64);
    }
    batch.clear();
}

/// One HTTP/1.1 POST of a JSON body; Ok on a 2xx answer.
fn post(config: &OtlpConfig, body: &[u8]) -> std::io::Result<()> {
    let other = |m: String| std::io::Error::other(m);
    // Every address the name resolves to, in turn: `localhost` may be ::1 first while the
    // collector listens on 127.0.0.1.
    let mut failed = other(format!("{} resolves to no address", config.authority));
    let mut connected = None;
    for addr in config.authority.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, config.timeout) {
            Ok(s) => {
                connected = Some(s);
                break;
            }
            Err(e) => failed = e,
        }
    }
    let mut s = connected.ok_or(failed)?;
    s.set_write_timeout(Some(config.timeout))?;
    s.set_read_timeout(Some(config.timeout))?;
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        config.path,
        config.authority,
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    // The status line is all that is read: "HTTP/1.1 200 OK".
    let mut answer = Vec::new();
    let mut chunk = [0u8; 512];
    while !answer.contains(&b'\n') && answer.len() < 1024 {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&answer);
    let line = line.lines().next().unwrap_or("");
    match line.split_whitespace().nth(1) {
        Some(code) if code.starts_with('2') && code.len() == 3 => Ok(()),
        _ => Err(other(format!("the collector answered {line:?}"))),
    }
}
