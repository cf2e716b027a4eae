//! Live heap bytes, counted by the binary's allocator while a benchmark asks for it.
//!
//! RSS says what the process holds from the OS, allocator fragmentation included: after a
//! million entities are created at full speed, it depends on how many short-lived entity tasks
//! were alive at once and how the allocator's arenas interleaved them. What an idle entity costs
//! is the bytes still allocated for it, which is this count. Off by default: then the allocator
//! adds one relaxed load per call.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// The system allocator, counting live bytes while [`start`] is on.
pub struct Counting;

static ON: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);

fn grew(by: i64) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// Only forwards to `System`, with the same layout, and counts: it adds no precondition.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ON.load(Ordering::Relaxed) {
            grew(layout.size() as i64);
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if ON.load(Ordering::Relaxed) {
            grew(layout.size() as i64);
        }
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ON.load(Ordering::Relaxed) {
            LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        }
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ON.load(Ordering::Relaxed) {
            grew(new_size as i64 - layout.size() as i64);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Starts counting from zero. Memory freed later that was allocated before counts as negative,
/// so measure a difference between two reads taken while counting.
pub fn start() {
    LIVE.store(0, Ordering::Relaxed);
    PEAK.store(0, Ordering::Relaxed);
    ON.store(true, Ordering::Relaxed);
}

/// Live bytes allocated since [`start`] minus those freed.
pub fn live() -> i64 {
    LIVE.load(Ordering::Relaxed)
}

/// The most live bytes at any moment since [`start`].
pub fn peak() -> i64 {
    PEAK.load(Ordering::Relaxed)
}
