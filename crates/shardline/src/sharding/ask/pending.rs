//! Asks waiting for a reply from another node, by request id.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use tokio::sync::oneshot;

use crate::error::Error;

trait Waiting: Send {
    fn complete(self: Box<Self>, result: Result<Vec<u8>, Error>);
    fn abandoned(&self) -> bool;
}

struct Typed<R>(oneshot::Sender<Result<R, Error>>);

impl<R: DeserializeOwned + Send + 'static> Waiting for Typed<R> {
    fn complete(self: Box<Self>, result: Result<Vec<u8>, Error>) {
        let r = result.and_then(|bytes| {
            postcard::from_bytes(&bytes).map_err(|e| Error::ReplyLost(format!("cannot decode the reply: {e}")))
        });
        let _ = self.0.send(r);
    }
    fn abandoned(&self) -> bool {
        self.0.is_closed()
    }
}

const STRIPES: usize = 16;

/// Waiting asks, striped to keep lock contention low.
pub(crate) struct Pending {
    next: AtomicU64,
    stripes: [Mutex<HashMap<u64, Box<dyn Waiting>>>; STRIPES],
}

impl Pending {
    pub fn new() -> Self {
        Pending { next: AtomicU64::new(1), stripes: std::array::from_fn(|_| Mutex::new(HashMap::new())) }
    }

    fn stripe(&self, id: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Box<dyn Waiting>>> {
        self.stripes[(id as usize) % STRIPES].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a reply channel; returns its request id.
    pub fn register<R: DeserializeOwned + Send + 'static>(&self, tx: oneshot::Sender<Result<R, Error>>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.stripe(id).insert(id, Box::new(Typed(tx)));
        id
    }

    /// Completes an ask (ignored when it already timed out).
    pub fn complete(&self, id: u64, result: Result<Vec<u8>, Error>) {
        let w = self.stripe(id).remove(&id);
        if let Some(w) = w {
            w.complete(result);
        }
    }

    /// Drops asks whose caller gave up (timed out); returns how many remain.
    pub fn sweep(&self) -> usize {
        let mut left = 0;
        for s in &self.stripes {
            let mut m = s.lock().unwrap_or_else(|e| e.into_inner());
            m.retain(|_, w| !w.abandoned());
            left += m.len();
        }
        left
    }
}
