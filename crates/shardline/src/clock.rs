//! The node's one clock: milliseconds since the node started, on tokio's time.
//!
//! The core's engines take time as a number of milliseconds; every driver of one node reads it
//! here, so their deadlines agree, and tests that pause tokio's time pause all of them at once.

use std::time::Duration;

use tokio::time::Instant;

/// Milliseconds since an origin, following tokio's time. Cheap to copy.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use shardline::Clock;
///
/// let clock = Clock::start();
/// tokio::time::sleep(Duration::from_millis(250)).await;
/// assert_eq!(clock.now_ms(), 250);
/// assert_eq!(clock.at(250), tokio::time::Instant::now());
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock whose time 0 is now.
    pub fn start() -> Self {
        Clock { origin: Instant::now() }
    }

    /// Milliseconds since time 0.
    pub fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis().min(u128::from(u64::MAX)) as u64
    }

    /// The instant of a time in milliseconds (for `sleep_until`).
    pub fn at(&self, ms: u64) -> Instant {
        self.origin + Duration::from_millis(ms)
    }
}
