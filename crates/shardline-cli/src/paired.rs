//! Closed-loop load (`drive`), and the runtime measured against its floor in alternating slices
//! (`Paired`): the measuring every bench scenario and the standalone floors share.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::load::{percentiles, Latency};

/// Closed-loop load: `workers` callers for `d`; returns (ops/s, latency).
pub(crate) async fn drive<S, F, Fut>(workers: u64, d: Duration, state: S, call: F) -> (f64, Latency)
where
    S: Clone + Send + 'static,
    F: Fn(S, u64, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = (S, bool)> + Send,
{
    let (ops, mut lat) = drive_raw(workers, d, state, Arc::new(call)).await;
    (ops, percentiles(&mut lat))
}

/// Like [`drive`], with every latency sample (microseconds).
///
/// Each caller owns a clone of `state`, which it lends to each call and gets back with the call's
/// success: a call clones nothing shared and the callers share no counter, since an atomic every
/// caller bumps on every call costs more than some of what is measured.
pub(crate) async fn drive_raw<S, F, Fut>(workers: u64, d: Duration, state: S, call: Arc<F>) -> (f64, Vec<u32>)
where
    S: Clone + Send + 'static,
    F: Fn(S, u64, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = (S, bool)> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (call, stop, mut state) = (call.clone(), stop.clone(), state.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut rng = (w + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let t = Instant::now();
                let (back, ok) = call(state, w, rng).await;
                state = back;
                if ok {
                    lat.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                }
            }
            lat
        }));
    }
    tokio::time::sleep(d).await;
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for t in tasks {
        if let Ok(l) = t.await {
            lat.extend(l);
        }
    }
    let ops = lat.len() as f64 / start.elapsed().as_secs_f64();
    (ops, lat)
}

/// How long each slice of a [`paired`] measurement lasts.
pub(crate) const SLICE: Duration = Duration::from_millis(500);

/// The runtime and its floor measured in alternating slices, so that both see the same machine:
/// on these machines the speed of both drifts by 2x from one second to the next, and a ratio of
/// two runs measured seconds apart reads that drift as much as the runtime.
pub(crate) struct Paired {
    /// Medians of the slices' rates.
    pub(crate) ops: f64,
    pub(crate) floor_ops: f64,
    /// Over every sample of every slice.
    pub(crate) lat: Latency,
    pub(crate) floor_lat: Latency,
    /// Runtime over floor, slice by slice (each pair of neighbouring slices), and their median.
    pub(crate) ratios: Vec<f64>,
    pub(crate) ratio: f64,
}

impl Paired {
    /// Medians of the slices' rates for a duration of `d` per side (at least two slices each);
    /// which side goes first alternates from round to round.
    pub(crate) async fn run<S, F, Fut, T, G, Gut>(workers: u64, d: Duration, runtime: (S, F), floor: (T, G)) -> Paired
    where
        S: Clone + Send + 'static,
        F: Fn(S, u64, u64) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = (S, bool)> + Send,
        T: Clone + Send + 'static,
        G: Fn(T, u64, u64) -> Gut + Send + Sync + 'static,
        Gut: std::future::Future<Output = (T, bool)> + Send,
    {
        let rounds = (d.as_millis() / SLICE.as_millis()).max(2) as usize;
        let (rs, rf) = (runtime.0, Arc::new(runtime.1));
        let (fs, ff) = (floor.0, Arc::new(floor.1));
        let (mut ops, mut floor_ops, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let (mut lat, mut floor_lat) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let (a, b) = if round % 2 == 0 {
                let a = drive_raw(workers, SLICE, rs.clone(), rf.clone()).await;
                (a, drive_raw(workers, SLICE, fs.clone(), ff.clone()).await)
            } else {
                let b = drive_raw(workers, SLICE, fs.clone(), ff.clone()).await;
                (drive_raw(workers, SLICE, rs.clone(), rf.clone()).await, b)
            };
            ratios.push(a.0 / b.0.max(1.0));
            ops.push(a.0);
            floor_ops.push(b.0);
            lat.extend(a.1);
            floor_lat.extend(b.1);
        }
        Paired {
            ops: median(&ops),
            floor_ops: median(&floor_ops),
            lat: percentiles(&mut lat),
            floor_lat: percentiles(&mut floor_lat),
            ratio: median(&ratios),
            ratios,
        }
    }
}

pub(crate) fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
