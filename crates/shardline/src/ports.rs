//! Loopback ports for the processes a run starts itself: nodes of the demo and the benchmarks,
//! and the servers tests start.
//!
//! A port is picked, released, and bound again by another process a moment later. Picked from the
//! kernel's ephemeral range (what binding port 0 gives), it can be taken in that moment as the
//! source port of any outgoing connection on the machine; so ports come from below that range,
//! each at most once per process, starting at a place that differs from process to process.

use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where the ports come from: under 32768, where Linux's ephemeral range starts by default, and
/// above the well-known ports of the servers a test machine runs.
const FIRST: u32 = 20_000;
const COUNT: u32 = 12_000;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A loopback port free right now, not one this process was given before, outside the range the
/// kernel picks source ports from.
///
/// ```
/// let port = shardline::ports::free_port().unwrap();
/// assert!((20_000..32_000).contains(&port));
/// std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
/// ```
pub fn free_port() -> io::Result<u16> {
    let start = std::process::id().wrapping_mul(2_654_435_761) % COUNT;
    for _ in 0..COUNT {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + (start + n) % COUNT) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(io::Error::new(io::ErrorKind::AddrNotAvailable, "no free loopback port between 20000 and 32000"))
}
