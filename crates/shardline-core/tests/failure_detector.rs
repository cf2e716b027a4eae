//! Phi accrual on simulated heartbeat series (virtual time, milliseconds).

use shardline_core::{PhiAccrualConfig, PhiAccrualDetector};

fn beats(fd: &mut PhiAccrualDetector, start: u64, interval: impl Fn(u64) -> u64, n: u64) -> u64 {
    let mut t = start;
    for i in 0..n {
        fd.heartbeat(t);
        t += interval(i);
    }
    t - interval(n - 1)
}

#[test]
fn defaults_are_akkas() {
    let c = PhiAccrualConfig::default();
    assert_eq!(c.threshold, 8.0);
    assert_eq!(c.max_sample_size, 1_000);
    assert_eq!(c.min_std_deviation_ms, 100.0);
    assert_eq!(c.acceptable_heartbeat_pause_ms, 3_000.0);
    assert_eq!(c.first_heartbeat_estimate_ms, 1_000.0);
}

#[test]
fn steady_heartbeats_keep_phi_low_and_silence_raises_it() {
    let mut fd = PhiAccrualDetector::new(PhiAccrualConfig::default());
    let last = beats(&mut fd, 0, |_| 1_000, 100);
    assert!(fd.phi(last + 1_000) < 1.0);
    assert!(fd.is_available(last + 3_500));
    // Phi grows monotonically with silence and crosses the threshold a few seconds past the pause.
    let mut prev = 0.0;
    let mut crossed = None;
    for dt in (0..20_000).step_by(100) {
        let p = fd.phi(last + dt);
        assert!(p >= prev, "phi must not decrease with silence");
        prev = p;
        if crossed.is_none() && p >= 8.0 {
            crossed = Some(dt);
        }
    }
    let crossed = crossed.expect("a long silence is detected");
    assert!((4_000..6_000).contains(&crossed), "detected after {crossed} ms");
}

#[test]
fn jitter_widens_tolerance() {
    let cfg = PhiAccrualConfig { acceptable_heartbeat_pause_ms: 0.0, ..PhiAccrualConfig::default() };
    let mut steady = PhiAccrualDetector::new(cfg.clone());
    let mut jittery = PhiAccrualDetector::new(cfg);
    let a = beats(&mut steady, 0, |_| 1_000, 200);
    let b = beats(&mut jittery, 0, |i| if i % 2 == 0 { 400 } else { 1_600 }, 200);
    assert!(jittery.stats().1 > steady.stats().1 * 3.0);
    assert!(
        jittery.phi(b + 2_000) < steady.phi(a + 2_000),
        "the same silence is less surprising from a jittery sender"
    );
}

#[test]
fn pause_past_threshold_then_resume() {
    let mut fd = PhiAccrualDetector::new(PhiAccrualConfig::default());
    let last = beats(&mut fd, 0, |_| 1_000, 50);
    assert!(!fd.is_available(last + 10_000), "paused 10 s: unavailable");
    fd.heartbeat(last + 10_000);
    assert!(fd.is_available(last + 10_500), "a heartbeat makes it available again");
    let again = beats(&mut fd, last + 11_000, |_| 1_000, 50);
    assert!(fd.phi(again + 1_000) < 1.0);
}

#[test]
fn before_any_heartbeat_phi_is_zero_and_window_is_bounded() {
    let cfg = PhiAccrualConfig { max_sample_size: 10, ..PhiAccrualConfig::default() };
    let mut fd = PhiAccrualDetector::new(cfg);
    assert_eq!(fd.phi(1_000_000), 0.0);
    assert!(!fd.is_monitoring());
    beats(&mut fd, 0, |_| 5_000, 20);
    beats(&mut fd, 95_000, |_| 100, 30);
    let (mean, _) = fd.stats();
    assert!((mean - 100.0).abs() < 1.0, "old intervals leave the window: mean {mean}");
    fd.heartbeat(10); // a heartbeat from the past is ignored
    assert!(fd.phi(u64::MAX).is_finite());
}
