//! The deadlines of the asks waiting on this node: one sweep every [`TICK`] instead of a timer per
//! ask.
//!
//! Nearly every ask is answered long before its timeout, so its timer is set up and torn down
//! for nothing. A tokio timer does that through the runtime's timer driver (a lookup of the
//! runtime, a registration on the first wait, a removal when the reply wins, the driver's lock
//! both times), which was over a third of a local ask's time. Here an ask that has to wait takes a
//! slot in one of a few striped slabs under a short lock, and gives it back when it ends; a task
//! wakes every tick and wakes the asks whose deadline has passed.
//!
//! An ask does not even read the clock (a read was a twentieth of a local ask): its slot holds
//! the timeout, and the first sweep that sees the slot fixes the deadline from the sweep's own
//! reading, taken under the slab's lock and so after the ask took its slot. A deadline is thus
//! met up to two ticks (plus scheduling delay) late, never early.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

// The node's, so that a node on a paused clock (tests, a simulation) times its asks out on the
// clock its other drivers read.
use crate::clock::Clock;

/// How often deadlines are checked.
pub(crate) const TICK: Duration = Duration::from_millis(10);

const STRIPES: usize = 8;

/// The deadlines of this node's waiting asks. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Deadlines {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Clock,
    stripes: [Padded<Mutex<Slab>>; STRIPES],
}

/// A stripe on cache lines of its own. The stripes of different worker threads are locked by
/// different cores, and a 64-byte slab shared a line with its neighbour whenever the array was not
/// 64-aligned, so each lock taken on one core evicted the other's: local asks ran 10-20% slower.
/// 128, not 64: x86's adjacent-line prefetcher pulls lines in pairs.
#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

#[derive(Default)]
struct Slab {
    slots: Vec<Place>,
    free: Vec<u32>,
    waiting: usize,
}

/// A place in a slab: free, or held by one waiting ask.
enum Place {
    Free,
    /// Waiting; `waker` wakes the ask.
    Waiting {
        until: Until,
        waker: Waker,
    },
    /// The deadline passed; the ask has been woken to find out.
    Expired,
}

/// How long a waiting ask may wait.
#[derive(Clone, Copy)]
enum Until {
    /// This long (ms) from the first sweep that sees the slot, which comes after the ask began.
    After(u64),
    /// Until then (ms since the origin).
    At(u64),
}

/// Where a waiting ask's slot is.
#[derive(Clone, Copy)]
struct Key {
    stripe: usize,
    index: u32,
}

/// The deadline passed before the future finished.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Elapsed;

impl Deadlines {
    /// Starts the sweep on the current tokio runtime; it ends when the last clone is dropped.
    pub fn start(clock: Clock) -> Deadlines {
        let inner = Arc::new(Inner { clock, stripes: std::array::from_fn(|_| Padded::default()) });
        tokio::spawn(sweep(Arc::downgrade(&inner)));
        Deadlines { inner }
    }

    /// Runs `fut` until it finishes or `timeout` has passed, whichever comes first.
    pub fn within<F: Future + Unpin>(&self, timeout: Duration, fut: F) -> Within<'_, F> {
        // Rounded up, so that the deadline is never early.
        let ms = timeout.as_nanos().div_ceil(1_000_000).min(u128::from(u64::MAX)) as u64;
        Within { fut, deadlines: &self.inner, timeout_ms: ms, key: None }
    }

    /// Asks waiting now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.inner.stripes.iter().map(|s| lock(s).waiting).sum()
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn register(&self, timeout_ms: u64, waker: Waker) -> Key {
        let stripe = stripe_of_this_thread();
        let mut slab = lock(&self.stripes[stripe]);
        slab.waiting += 1;
        let slot = Place::Waiting { until: Until::After(timeout_ms), waker };
        let index = match slab.free.pop() {
            Some(i) => {
                slab.slots[i as usize] = slot;
                i
            }
            None => {
                slab.slots.push(slot);
                (slab.slots.len() - 1) as u32
            }
        };
        Key { stripe, index }
    }

    /// Gives the slot back; true when its deadline had passed.
    fn release(&self, key: Key) -> bool {
        let mut slab = lock(&self.stripes[key.stripe]);
        let Some(slot) = slab.slots.get_mut(key.index as usize) else { return false };
        let expired = match std::mem::replace(slot, Place::Free) {
            Place::Waiting { .. } => {
                slab.waiting -= 1;
                false
            }
            Place::Expired => true,
            Place::Free => return false,
        };
        slab.free.push(key.index);
        expired
    }

    /// Whether the deadline passed; if not, makes sure `waker` is the one woken.
    fn expired(&self, key: Key, waker: &Waker) -> bool {
        let mut slab = lock(&self.stripes[key.stripe]);
        match slab.slots.get_mut(key.index as usize) {
            Some(Place::Waiting { waker: w, .. }) => {
                if !w.will_wake(waker) {
                    *w = waker.clone();
                }
                false
            }
            _ => true,
        }
    }

    /// Fixes the deadlines of asks seen for the first time and wakes every ask whose deadline
    /// has passed; the wakes happen outside the locks.
    fn expire(&self) {
        let mut due = Vec::new();
        for stripe in &self.stripes {
            let mut slab = lock(stripe);
            if slab.waiting == 0 {
                continue;
            }
            // Read under the lock: every slot seen here was taken before this reading.
            let now = self.now_ms();
            let mut expired = 0;
            for slot in slab.slots.iter_mut() {
                let Place::Waiting { until, .. } = slot else { continue };
                let at = match *until {
                    Until::After(ms) => {
                        *until = Until::At(now.saturating_add(ms));
                        continue;
                    }
                    Until::At(at) => at,
                };
                if at <= now {
                    if let Place::Waiting { waker, .. } = std::mem::replace(slot, Place::Expired) {
                        due.push(waker);
                        expired += 1;
                    }
                }
            }
            slab.waiting -= expired;
        }
        for w in due {
            w.wake();
        }
    }
}

fn lock(m: &Mutex<Slab>) -> MutexGuard<'_, Slab> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Spreads threads over the stripes: asks on different worker threads rarely share a lock.
fn stripe_of_this_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

async fn sweep(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        inner.expire();
    }
}

/// A future with a deadline; see [`Deadlines::within`].
pub(crate) struct Within<'a, F> {
    fut: F,
    deadlines: &'a Inner,
    timeout_ms: u64,
    key: Option<Key>,
}

impl<F: Future + Unpin> Future for Within<'_, F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Poll::Ready(out) = Pin::new(&mut this.fut).poll(cx) {
            if let Some(key) = this.key.take() {
                this.deadlines.release(key);
            }
            return Poll::Ready(Ok(out));
        }
        match this.key {
            // The first wait: only now is a slot worth taking.
            None => {
                if this.timeout_ms == 0 {
                    return Poll::Ready(Err(Elapsed));
                }
                this.key = Some(this.deadlines.register(this.timeout_ms, cx.waker().clone()));
            }
            Some(key) => {
                if this.deadlines.expired(key, cx.waker()) {
                    this.key = None;
                    this.deadlines.release(key);
                    return Poll::Ready(Err(Elapsed));
                }
            }
        }
        Poll::Pending
    }
}

impl<F> Drop for Within<'_, F> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.deadlines.release(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;
    use tokio::time::Instant;

    #[tokio::test]
    async fn a_reply_in_time_is_returned_and_its_slot_given_back() {
        let d = Deadlines::start(Clock::start());
        let (tx, rx) = oneshot::channel();
        let waiter = {
            let d = d.clone();
            tokio::spawn(async move { d.within(Duration::from_secs(5), rx).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(d.waiting(), 1, "the waiting ask holds a slot");
        tx.send(7).unwrap();
        assert_eq!(waiter.await.unwrap(), Ok(Ok(7)));
        assert_eq!(d.waiting(), 0);
    }

    // On a paused clock: the time read is the runtime's, exact, not the machine's.
    #[tokio::test(start_paused = true)]
    async fn a_late_reply_times_out_not_before_the_deadline() {
        let d = Deadlines::start(Clock::start());
        let (_tx, rx) = oneshot::channel::<u32>();
        let start = Instant::now();
        let r = d.within(Duration::from_millis(50), rx).await;
        assert_eq!(r, Err(Elapsed));
        assert!(start.elapsed() >= Duration::from_millis(50), "never early: {:?}", start.elapsed());
        // Found by the sweep that follows the deadline: at most two ticks late.
        assert!(start.elapsed() <= Duration::from_millis(50) + 2 * TICK, "late: {:?}", start.elapsed());
        assert_eq!(d.waiting(), 0);
    }

    #[tokio::test]
    async fn a_zero_timeout_ends_at_the_first_wait() {
        let d = Deadlines::start(Clock::start());
        let (tx, rx) = oneshot::channel();
        tx.send(3).unwrap();
        assert_eq!(d.within(Duration::ZERO, rx).await, Ok(Ok(3)), "a reply already there is taken");
        let (_tx, rx) = oneshot::channel::<u32>();
        assert_eq!(d.within(Duration::ZERO, rx).await, Err(Elapsed));
        assert_eq!(d.waiting(), 0);
    }

    #[tokio::test]
    async fn an_abandoned_ask_gives_its_slot_back() {
        let d = Deadlines::start(Clock::start());
        let (_tx, rx) = oneshot::channel::<u32>();
        let waiter = {
            let d = d.clone();
            tokio::spawn(async move { d.within(Duration::from_secs(5), rx).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(d.waiting(), 1);
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(d.waiting(), 0);
        // The freed slot is reused.
        let (tx, rx) = oneshot::channel();
        tx.send(1).unwrap();
        assert_eq!(d.within(Duration::from_secs(5), rx).await, Ok(Ok(1)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_asks_at_once_each_end_by_reply_or_deadline() {
        let d = Deadlines::start(Clock::start());
        let mut tasks = Vec::new();
        for i in 0..1_000u32 {
            let d = d.clone();
            tasks.push(tokio::spawn(async move {
                let (tx, rx) = oneshot::channel();
                if i % 2 == 0 {
                    tokio::spawn(async move {
                        tokio::task::yield_now().await;
                        let _ = tx.send(i);
                    });
                    d.within(Duration::from_secs(10), rx).await.map(|r| r.ok())
                } else {
                    let _keep = tx;
                    d.within(Duration::from_millis(20), rx).await.map(|r| r.ok())
                }
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            let r = t.await.unwrap();
            if i % 2 == 0 {
                assert_eq!(r, Ok(Some(i as u32)));
            } else {
                assert_eq!(r, Err(Elapsed));
            }
        }
        assert_eq!(d.waiting(), 0);
    }
}
