//! Running many schedules: each on a thread of its own (a world's thread-locals start empty),
//! spread over the cores, with a watchdog for a world that stops advancing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A base seed drawn fresh for this run: schedules differ from one run to the next, and each
/// one is replayed from its printed seed.
pub fn fresh_base() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    h.finish()
}

/// Runs `f` on a thread of its own, with room for a world's stack; a panic is its text.
pub fn on_own_thread<T: Send + 'static>(seed: u64, f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    std::thread::Builder::new()
        .name(format!("sim-{seed}"))
        .stack_size(16 << 20)
        .spawn(f)
        .map_err(|e| e.to_string())
        .and_then(|t| t.join().map_err(|p| panic_text(&p)))
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// How long (real time) one schedule may run before the watchdog calls it stuck: a schedule
/// takes about a second; one whose world stops advancing never ends.
const STUCK_AFTER: Duration = Duration::from_secs(120);

/// Runs `one` on the seeds `base`, `base + 1`, … (`n` of them) over the cores, and returns
/// each seed's result, in seed order; a worker's panic is raised here. A schedule that stops advancing ends the process, naming its seed and
/// `replay(seed)`: a node's task that never waits keeps its runtime from parking, so its paused
/// clock never moves and the world's step never returns (on a real clock, the same loop spins
/// a core), and the stuck thread cannot be stopped.
pub fn run_seeds<T: Send>(
    n: u64,
    base: u64,
    one: impl Fn(u64) -> T + Sync,
    replay: impl Fn(u64) -> String + Sync,
) -> Vec<(u64, T)> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).min(4) as u64;
    // What each worker runs, and since when: the watchdog's view.
    let running: Vec<Mutex<Option<(u64, Instant)>>> = (0..workers).map(|_| Mutex::new(None)).collect();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_secs(1));
                for r in &running {
                    if let Some((seed, since)) = *r.lock().unwrap_or_else(|e| e.into_inner()) {
                        if since.elapsed() > STUCK_AFTER {
                            println!("  seed {seed}: stuck: its world did not advance for {STUCK_AFTER:?} (a task that never waits)");
                            println!("    replay: {}", replay(seed));
                            std::process::exit(1);
                        }
                    }
                }
            }
        });
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (running, one) = (&running[w as usize], &one);
                s.spawn(move || {
                    let mut out = Vec::new();
                    let mut i = w;
                    while i < n {
                        let seed = base.wrapping_add(i);
                        *running.lock().unwrap_or_else(|e| e.into_inner()) = Some((seed, Instant::now()));
                        out.push((seed, one(seed)));
                        i += workers;
                    }
                    *running.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    out
                })
            })
            .collect();
        let mut results = Vec::new();
        let mut panicked = None;
        for h in handles {
            match h.join() {
                Ok(r) => results.extend(r),
                Err(p) => panicked = Some(p),
            }
        }
        done.store(true, Ordering::Release);
        // A worker that panicked lost its results: a report without them would pass.
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
        results.sort_by_key(|(seed, _)| *seed);
        results
    })
}
