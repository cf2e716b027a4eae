//! Phi-accrual failure detection (Hayashibara et al.), with Akka's defaults.
//!
//! Instead of a yes/no timeout, the detector keeps a window of heartbeat intervals and says how
//! surprising the current silence is: `phi = -log10(P(a heartbeat arrives later than now))`. A
//! phi of 8 means the chance the node is just slow is 10⁻⁸. Time is an argument (milliseconds).
//!
//! ```
//! use shardline_core::{PhiAccrualConfig, PhiAccrualDetector};
//! let mut fd = PhiAccrualDetector::new(PhiAccrualConfig::default());
//! for t in 0..10 {
//!     fd.heartbeat(t * 1_000);
//! }
//! assert!(fd.is_available(9_500));
//! assert!(!fd.is_available(30_000));
//! ```

use std::collections::VecDeque;

/// Settings of a phi-accrual detector. Defaults are Akka's.
#[derive(Clone, Debug, PartialEq)]
pub struct PhiAccrualConfig {
    /// Phi above which the node is considered unavailable (default 8.0).
    pub threshold: f64,
    /// Heartbeat intervals kept (default 1,000).
    pub max_sample_size: usize,
    /// Floor of the standard deviation, so a very regular sender is not declared dead at the
    /// first hiccup (default 100 ms).
    pub min_std_deviation_ms: f64,
    /// Extra silence tolerated on top of the mean interval, e.g. for GC pauses (default 3 s).
    pub acceptable_heartbeat_pause_ms: f64,
    /// Interval assumed before real samples exist (default 1 s).
    pub first_heartbeat_estimate_ms: f64,
}

impl Default for PhiAccrualConfig {
    fn default() -> Self {
        PhiAccrualConfig {
            threshold: 8.0,
            max_sample_size: 1_000,
            min_std_deviation_ms: 100.0,
            acceptable_heartbeat_pause_ms: 3_000.0,
            first_heartbeat_estimate_ms: 1_000.0,
        }
    }
}

/// A detector for one monitored node.
#[derive(Clone, Debug)]
pub struct PhiAccrualDetector {
    config: PhiAccrualConfig,
    intervals: VecDeque<f64>,
    sum: f64,
    sum_sq: f64,
    last: Option<u64>,
}

impl PhiAccrualDetector {
    /// A detector that has seen no heartbeat yet.
    pub fn new(config: PhiAccrualConfig) -> Self {
        PhiAccrualDetector { config, intervals: VecDeque::new(), sum: 0.0, sum_sq: 0.0, last: None }
    }

    /// The settings.
    pub fn config(&self) -> &PhiAccrualConfig {
        &self.config
    }

    fn push(&mut self, interval: f64) {
        if self.intervals.len() >= self.config.max_sample_size.max(1) {
            if let Some(old) = self.intervals.pop_front() {
                self.sum -= old;
                self.sum_sq -= old * old;
            }
        }
        self.intervals.push_back(interval);
        self.sum += interval;
        self.sum_sq += interval * interval;
    }

    /// A heartbeat arrived at `now`.
    pub fn heartbeat(&mut self, now: u64) {
        match self.last {
            None => {
                // Seed the window so the first silence is judged against the estimate.
                let mean = self.config.first_heartbeat_estimate_ms;
                let sd = mean / 4.0;
                self.push(mean - sd);
                self.push(mean + sd);
            }
            Some(last) if now >= last => self.push((now - last) as f64),
            Some(_) => {}
        }
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
    }

    /// Mean and standard deviation of the intervals (after the floor).
    pub fn stats(&self) -> (f64, f64) {
        let n = self.intervals.len().max(1) as f64;
        let mean = self.sum / n;
        let var = (self.sum_sq / n - mean * mean).max(0.0);
        (mean, var.sqrt().max(self.config.min_std_deviation_ms))
    }

    /// Suspicion at `now`: 0 before the first heartbeat, then growing with silence.
    pub fn phi(&self, now: u64) -> f64 {
        let Some(last) = self.last else { return 0.0 };
        let elapsed = now.saturating_sub(last) as f64;
        let (mean, sd) = self.stats();
        let mean = mean + self.config.acceptable_heartbeat_pause_ms;
        // Logistic approximation of the normal CDF tail.
        let y = (elapsed - mean) / sd;
        let e = (-y * (1.5976 + 0.070566 * y * y)).exp();
        let p_later = if elapsed > mean { e / (1.0 + e) } else { 1.0 - 1.0 / (1.0 + e) };
        let phi = -p_later.max(f64::MIN_POSITIVE).log10();
        if phi.is_finite() {
            phi.max(0.0)
        } else {
            f64::MAX
        }
    }

    /// Whether phi is below the threshold.
    pub fn is_available(&self, now: u64) -> bool {
        self.phi(now) < self.config.threshold
    }

    /// Whether any heartbeat has arrived.
    pub fn is_monitoring(&self) -> bool {
        self.last.is_some()
    }
}
