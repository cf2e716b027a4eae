//! The shared driver: an engine behind a lock, fed by any task (frames, users' sends, the
//! results of spawned work), its commands carried out in order while the lock is held, and one
//! wake-up task that sleeps until the engine's next deadline on the cluster's clock.
//!
//! Carrying a command out under the lock keeps the engine's order: a command that fails
//! (a full send queue) is told to the engine before the next one runs. So no command may block;
//! one that waits (a shard's stop, a journal claim) spawns a task whose result is a new input.
//! The region and the coordinator run on it.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use shardline_core::Engine;
use tokio::sync::Notify;

/// The command type of a carrier's engine.
pub(crate) type CommandOf<C> = <<C as Carrier>::Engine as Engine>::Command;

/// What runs on a shared driver: the effects of one engine's commands.
pub(crate) trait Carrier: Send + Sync + Sized + 'static {
    /// The engine.
    type Engine: Engine + Send;
    /// What the lock guards: the engine and what the carrier keeps beside it.
    type State: Send;
    /// What an input's caller learns once its commands are carried out.
    type Settled;

    /// This carrier's driver.
    fn shared(&self) -> &Shared<Self>;
    /// The engine in `state`; None when there is none to drive (it could not be built).
    fn engine(state: &mut Self::State) -> Option<&mut Self::Engine>;
    /// The cluster's clock, in milliseconds.
    fn now_ms(&self) -> u64;
    /// Whether the engine may take inputs now; a refused input is not handled at all.
    fn accepts_input(&self) -> bool {
        true
    }
    /// Carries out one command, with the lock held.
    fn carry_out(self: &Arc<Self>, state: &mut Self::State, command: CommandOf<Self>, now: u64);
    /// After an input's commands, with the lock still held.
    fn settle(self: &Arc<Self>, state: &mut Self::State, now: u64) -> Self::Settled;
    /// Whether the engine is done for good: its wake-up task ends.
    fn finished(&self) -> bool {
        false
    }
}

/// An engine behind a lock, with its wake-up; see the module docs.
pub(crate) struct Shared<C: Carrier> {
    state: Mutex<C::State>,
    /// When the engine wants its next `handle_timeout`.
    at: Mutex<Option<u64>>,
    notify: Arc<Notify>,
}

impl<C: Carrier> Shared<C> {
    pub(crate) fn new(state: C::State) -> Self {
        Shared { state: Mutex::new(state), at: Mutex::new(None), notify: Arc::new(Notify::new()) }
    }

    /// Starts the wake-up task of `carrier`, which ends when the carrier is dropped or finished.
    pub(crate) fn start(carrier: &Arc<C>) {
        tokio::spawn(run(Arc::downgrade(carrier)));
    }

    /// The state, for reads that are not inputs.
    pub(crate) fn lock(&self) -> MutexGuard<'_, C::State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one input: `f` hands it to the engine, then the engine's commands are carried out and
    /// the wake-up moved to its next deadline. None when the carrier refuses inputs.
    pub(crate) fn input<R>(
        &self,
        carrier: &Arc<C>,
        f: impl FnOnce(&mut C::State, u64) -> R,
    ) -> Option<(R, C::Settled)> {
        if !carrier.accepts_input() {
            return None;
        }
        let now = carrier.now_ms();
        let mut st = self.lock();
        let r = f(&mut st, now);
        while let Some(cmd) = C::engine(&mut st).and_then(|e| e.poll_command()) {
            carrier.carry_out(&mut st, cmd, now);
        }
        let settled = carrier.settle(&mut st, now);
        self.request(C::engine(&mut st).and_then(|e| e.poll_timeout()));
        Some((r, settled))
    }

    /// Wakes the wake-up task at once (it then finds its carrier finished, or nothing due).
    pub(crate) fn poke(&self) {
        self.notify.notify_one();
    }

    /// The engine's next deadline after an input: the task is woken when it is earlier than the
    /// one it sleeps for.
    fn request(&self, next: Option<u64>) {
        let mut at = self.at.lock().unwrap_or_else(|e| e.into_inner());
        if next.is_some_and(|t| at.is_none_or(|cur| t < cur)) {
            *at = next;
            self.notify.notify_one();
        }
    }
}

/// The wake-up task of `carrier`. Holds no strong reference while it sleeps, so that a dropped
/// carrier ends it.
async fn run<C: Carrier>(carrier: Weak<C>) {
    loop {
        let Some(c) = carrier.upgrade() else { return };
        if c.finished() {
            return;
        }
        let at = *c.shared().at.lock().unwrap_or_else(|e| e.into_inner());
        let now = c.now_ms();
        let sleep = match at {
            Some(t) if t <= now => Duration::ZERO,
            Some(t) => Duration::from_millis(t - now),
            None => Duration::from_secs(1),
        };
        if sleep.is_zero() {
            // Due already: let other tasks run first, so that an engine whose deadline stays due
            // (a bug) costs a busy task, not a worker thread that never yields.
            drop(c);
            tokio::task::yield_now().await;
        } else {
            // A request made after this point leaves a permit: the wait below ends at once.
            let notify = c.shared().notify.clone();
            drop(c);
            let notified = notify.notified();
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = notified => continue,
            }
        }
        let Some(c) = carrier.upgrade() else { return };
        *c.shared().at.lock().unwrap_or_else(|e| e.into_inner()) = None;
        c.shared().input(&c, |st, now| {
            if let Some(e) = C::engine(st) {
                e.handle_timeout(now);
            }
        });
    }
}
