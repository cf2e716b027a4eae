//! Asks by outcome, and the latency of a sample of them, kept per thread and summed when read.
//!
//! A counter that every ask bumps is a cache line that both cores write on every ask: a shared
//! atomic per ask cost the local ask more than some of what it measures (see the design notes,
//! "Speed"). Here each thread counts in its own cells, which only it writes (a load and a store,
//! no locked instruction), and a scrape sums every thread's cells. Only one ask in
//! `SAMPLE_EVERY` (64) reads the clock for its latency, since two clock reads were a tenth of a
//! local ask.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::error::Error;

/// One ask in this many is timed.
pub(crate) const SAMPLE_EVERY: u32 = 64;

/// Upper bounds of the latency buckets, in microseconds (the last bucket is unbounded).
pub(crate) const BUCKETS_US: [u64; 12] =
    [50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000, 10_000_000];

/// The outcomes asks are counted by, in the order of [`AskStats::outcomes`].
pub(crate) const OUTCOMES: [&str; 8] =
    ["ok", "timeout", "unavailable", "overloaded", "rejected", "reply_lost", "outcome_unknown", "request_expired"];

/// What a node's asks did, summed over its threads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AskStats {
    /// Asks per outcome, in the order of [`AskStats::OUTCOMES`].
    pub outcomes: [u64; OUTCOMES.len()],
    /// Timed asks per latency bucket (not cumulative), in the order of [`AskStats::BUCKETS_US`],
    /// then the unbounded one.
    pub buckets: [u64; BUCKETS_US.len() + 1],
    /// Sum of the timed asks' latencies, microseconds.
    pub sum_us: u64,
}

impl AskStats {
    /// One ask in this many is timed.
    pub const SAMPLE_EVERY: u32 = SAMPLE_EVERY;
    /// Upper bounds of the latency buckets, microseconds.
    pub const BUCKETS_US: [u64; 12] = BUCKETS_US;
    /// The outcomes, in the order of [`AskStats::outcomes`].
    pub const OUTCOMES: [&'static str; 8] = OUTCOMES;

    /// Timed asks.
    pub fn timed(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// One thread's cells. Written by that thread only; read by scrapes.
#[derive(Default)]
struct Cells {
    outcomes: [AtomicU64; OUTCOMES.len()],
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

/// Every thread's cells; a thread that ended keeps its counts here.
static THREADS: Mutex<Vec<Arc<Cells>>> = Mutex::new(Vec::new());

thread_local! {
    static MINE: Arc<Cells> = {
        let cells = Arc::new(Cells::default());
        THREADS.lock().unwrap_or_else(|e| e.into_inner()).push(cells.clone());
        cells
    };
    static TICK: Cell<u32> = const { Cell::new(0) };
}

/// Adds one to a cell only this thread writes: no locked instruction needed.
fn bump(c: &AtomicU64, by: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed);
}

/// The start of an ask, when this one is to be timed.
pub(crate) fn start() -> Option<Instant> {
    TICK.with(|t| {
        let n = t.get().wrapping_add(1);
        t.set(n);
        (n % SAMPLE_EVERY == 0).then(Instant::now)
    })
}

/// Counts an ask's outcome, and its latency if it was timed. The future may end on another
/// thread than it started on; it counts where it ends.
pub(crate) fn finish<T>(started: Option<Instant>, result: &Result<T, Error>) {
    let outcome = match result {
        Ok(_) => 0,
        Err(Error::Timeout(_)) => 1,
        Err(Error::Unavailable(_)) => 2,
        Err(Error::Overloaded(_)) => 3,
        Err(Error::Rejected(_)) => 4,
        Err(Error::ReplyLost(_)) => 5,
        Err(Error::OutcomeUnknown(_)) => 6,
        Err(Error::RequestExpired(_)) => 7,
    };
    MINE.with(|c| {
        bump(&c.outcomes[outcome], 1);
        if let Some(t) = started {
            let us = t.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
            let bucket = BUCKETS_US.iter().position(|b| us <= *b).unwrap_or(BUCKETS_US.len());
            bump(&c.buckets[bucket], 1);
            bump(&c.sum_us, us);
        }
    });
}

/// The sums over every thread so far.
pub(crate) fn read() -> AskStats {
    let mut s = AskStats::default();
    for c in THREADS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        for (sum, cell) in s.outcomes.iter_mut().zip(&c.outcomes) {
            *sum += cell.load(Ordering::Relaxed);
        }
        for (sum, cell) in s.buckets.iter_mut().zip(&c.buckets) {
            *sum += cell.load(Ordering::Relaxed);
        }
        s.sum_us += c.sum_us.load(Ordering::Relaxed);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn outcomes_and_sampled_latencies_are_summed_over_threads() {
        let before = read();
        let threads: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(|| {
                    for i in 0..SAMPLE_EVERY * 2 {
                        let started = start();
                        let r: Result<(), Error> =
                            if i % 4 == 0 { Err(Error::Timeout(Duration::from_secs(1))) } else { Ok(()) };
                        finish(started, &r);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let after = read();
        // Other tests of this binary may ask meanwhile: at least what these threads did.
        let asks = u64::from(SAMPLE_EVERY) * 2 * 3;
        assert!(after.outcomes[0] - before.outcomes[0] >= asks * 3 / 4);
        assert!(after.outcomes[1] - before.outcomes[1] >= asks / 4);
        assert!(after.timed() - before.timed() >= 6, "two timed asks per thread");
    }
}
