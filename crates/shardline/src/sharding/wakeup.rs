//! The one timer shape of the engine drivers: an engine says when it next wants
//! `handle_timeout` (its `poll_timeout`), and one task per engine sleeps until then on the
//! cluster's clock (tokio's time), woken early when the engine asks for an earlier time.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;

/// When an engine wants its next `handle_timeout`.
#[derive(Default)]
pub(crate) struct Wakeup {
    at: Mutex<Option<u64>>,
    notify: Arc<Notify>,
}

impl Wakeup {
    /// The engine's next deadline (`poll_timeout`) after an input: the timer task is woken when
    /// it is earlier than the one it sleeps for.
    pub(crate) fn request(&self, next: Option<u64>) {
        let mut at = self.at.lock().unwrap_or_else(|e| e.into_inner());
        if next.is_some_and(|t| at.is_none_or(|cur| t < cur)) {
            *at = next;
            self.notify.notify_one();
        }
    }

    /// Wakes the timer task at once (it then finds its driver stopped, or nothing due).
    pub(crate) fn poke(&self) {
        self.notify.notify_one();
    }
}

/// What a timer task needs of its driver.
pub(crate) trait Timed: Send + Sync + 'static {
    /// The driver's wake-up.
    fn wakeup(&self) -> &Wakeup;
    /// The cluster's clock, in milliseconds.
    fn now_ms(&self) -> u64;
    /// Whether the driver stopped (the task ends).
    fn stopped(&self) -> bool;
    /// The deadline came: call the engine's `handle_timeout`.
    fn fire(self: &Arc<Self>);
}

/// Runs the timer of `driver` until it is dropped or stopped. Holds no strong reference while it
/// sleeps, so that a dropped driver ends its task.
pub(crate) async fn run<T: Timed>(driver: Weak<T>) {
    loop {
        let Some(d) = driver.upgrade() else { return };
        if d.stopped() {
            return;
        }
        let at = *d.wakeup().at.lock().unwrap_or_else(|e| e.into_inner());
        let now = d.now_ms();
        let sleep = match at {
            Some(t) if t <= now => Duration::ZERO,
            Some(t) => Duration::from_millis(t - now),
            None => Duration::from_secs(1),
        };
        if sleep.is_zero() {
            // Due already: let other tasks run first, so that an engine whose deadline stays due
            // (a bug) costs a busy task, not a worker thread that never yields.
            drop(d);
            tokio::task::yield_now().await;
        } else {
            // A request made after this point leaves a permit: the wait below ends at once.
            let notify = d.wakeup().notify.clone();
            drop(d);
            let notified = notify.notified();
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = notified => continue,
            }
        }
        let Some(d) = driver.upgrade() else { return };
        *d.wakeup().at.lock().unwrap_or_else(|e| e.into_inner()) = None;
        d.fire();
    }
}
