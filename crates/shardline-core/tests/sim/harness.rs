//! What the simulated worlds share about running schedules: which ones a run covers, on two
//! threads, a panic in one reported as a violation of its seed, and how failures are printed.
//!
//! A run of a `*_schedules*` test covers the schedules `B, B+1, …` (wrapping) from a base seed
//! `B` drawn fresh every run (printed), so every run covers schedules no earlier run did.
//! `SHARDLINE_SIM_BASE_SEED=B` pins it, to run a whole run again. `SHARDLINE_SIM_SCHEDULES=N`
//! raises the number of schedules; it never goes below [`FLOOR`]. One schedule is replayed with
//! its trace by the world's replay test (`sim_replay`, `sim_lease_replay`, `sim_gossip_replay`)
//! with `SHARDLINE_SIM_SEED=<seed>`; without it, a replay test does nothing.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The fewest schedules a `*_schedules*` test runs per world, whatever the environment says.
pub const FLOOR: u64 = 10_000;

/// One simulated world: its test binary and its replay test, for the commands printed.
pub struct World {
    /// The test target (`--test <bin>`).
    pub bin: &'static str,
    /// The `*_schedules*` test.
    pub schedules: &'static str,
    /// The replay test.
    pub replay: &'static str,
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(e) => panic!("{name}={v:?} is not a number: {e}"),
    }
}

/// A seed nobody chose: the OS-seeded keys of a `RandomState`, the time and the process id.
fn fresh_seed() -> u64 {
    let mut h = RandomState::new().build_hasher();
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.write_u32(std::process::id());
    h.finish()
}

/// The seed `SHARDLINE_SIM_SEED` names, for a replay test.
pub fn replay_seed() -> Option<u64> {
    env_u64("SHARDLINE_SIM_SEED")
}

/// The schedules one run of a `*_schedules*` test covers: `count` seeds from `base`.
pub struct Run {
    pub world: World,
    pub base: u64,
    pub count: u64,
}

impl Run {
    /// A fresh base seed (or `SHARDLINE_SIM_BASE_SEED`), and `SHARDLINE_SIM_SCHEDULES`
    /// schedules, never fewer than [`FLOOR`]. Prints both.
    pub fn from_env(world: World) -> Run {
        let base = env_u64("SHARDLINE_SIM_BASE_SEED").unwrap_or_else(fresh_seed);
        let asked = env_u64("SHARDLINE_SIM_SCHEDULES");
        let count = asked.unwrap_or(FLOOR).max(FLOOR);
        if asked.is_some_and(|n| n < FLOOR) {
            println!("{}: SHARDLINE_SIM_SCHEDULES is below the floor of {FLOOR}: running {FLOOR}", world.bin);
        }
        println!(
            "{}: base seed {base}, {count} schedules (this run again: SHARDLINE_SIM_BASE_SEED={base} \
             SHARDLINE_SIM_SCHEDULES={count} cargo test -p shardline-core --release --test {} {} -- --nocapture)",
            world.bin, world.bin, world.schedules
        );
        Run { world, base, count }
    }

    /// Runs every schedule of the run; see [`run_seeds`].
    pub fn run<S: Default + Send>(
        &self,
        run: impl Fn(u64) -> (Vec<String>, S) + Sync,
        add: impl Fn(&mut S, S) + Sync,
    ) -> (Vec<(u64, String)>, S, Duration) {
        let started = Instant::now();
        let (failures, totals) = run_seeds(self.base, self.count, run, add);
        let took = started.elapsed();
        let rate = self.count as f64 / took.as_secs_f64().max(1e-9);
        println!("{}: {} schedules in {:.1} s ({rate:.0} schedules/s)", self.world.bin, self.count, took.as_secs_f64());
        (failures, totals, took)
    }

    /// Prints every failing seed with the command that replays it.
    pub fn report(&self, failures: &[(u64, String)]) {
        for (seed, v) in failures {
            println!("  seed {seed}: {v}");
            println!("    replay: {}", replay_command(&self.world, *seed));
        }
    }
}

/// Runs a test that must catch something (a broken engine, a rare path) on schedules nobody
/// chose: batches of `batch` schedules from a fresh base seed each (printed), until `found` says
/// a batch showed it or `cap` schedules ran. Returns every batch's result, the last one first. A
/// fixed seed list would show the catch once and for all; fresh seeds show it again on every
/// run, and the cap keeps a rare catch from failing by bad luck.
pub fn until_found<T>(
    test: &str,
    batch: u64,
    cap: u64,
    mut run: impl FnMut(u64, u64) -> T,
    found: impl Fn(&T) -> bool,
) -> Vec<T> {
    let mut out = Vec::new();
    let mut ran = 0;
    while ran < cap {
        let base = fresh_seed();
        let r = run(base, batch);
        ran += batch;
        let done = found(&r);
        println!("{test}: {batch} schedules from base seed {base}: found {done}");
        out.insert(0, r);
        if done {
            break;
        }
    }
    out
}

/// The command that replays one schedule of `world` with its trace.
pub fn replay_command(world: &World, seed: u64) -> String {
    format!(
        "SHARDLINE_SIM_SEED={seed} cargo test -p shardline-core --release --test {} {} -- --nocapture",
        world.bin, world.replay
    )
}

/// Runs the schedules of seeds `first_seed, first_seed + 1, …` (`count` of them, wrapping) on two
/// threads: `run` returns a schedule's violations and its counters, which `add` sums. A schedule
/// that panics fails with the panic's message as its violation. Returns each failing seed with its
/// first violation, in seed order, and the summed counters.
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
                let seed = first_seed.wrapping_add(i);
                let (violations, counters) = match catch_unwind(AssertUnwindSafe(|| run(seed))) {
                    Ok(r) => r,
                    Err(panic) => (vec![format!("panic: {}", panic_message(&*panic))], S::default()),
                };
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

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}
