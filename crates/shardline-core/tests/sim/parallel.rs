//! Runs many seeded schedules on two threads; shared by the simulation worlds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Runs the schedules of seeds `first_seed..first_seed + count`: `run` returns a schedule's
/// violations and its counters, which `add` sums. Returns each failing seed with its first
/// violation, in seed order, and the summed counters.
pub fn run_seeds<S: Default + Send>(
    first_seed: u64,
    count: u64,
    run: impl Fn(u64) -> (Vec<String>, S) + Sync,
    add: impl Fn(&mut S, S) + Sync,
) -> (Vec<(u64, String)>, S) {
    let next = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    let totals = Mutex::new(S::default());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let seed = first_seed + i;
                let (violations, counters) = run(seed);
                add(&mut totals.lock().unwrap_or_else(|e| e.into_inner()), counters);
                if let Some(first) = violations.into_iter().next() {
                    failures.lock().unwrap_or_else(|e| e.into_inner()).push((seed, first));
                }
            });
        }
    });
    let mut f = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    f.sort();
    (f, totals.into_inner().unwrap_or_else(|e| e.into_inner()))
}
