//! The floors as programs of their own. `shardline floor local|remote` runs one floor alone in a
//! fresh process and prints its rate; the ask benches run it before and after their paired run,
//! so that the runtime's figure can be read against the floor measured beside it in the bench's
//! process and against the same floor with a process to itself. The two floors differ by what
//! the bench's process also carries (a node's background tasks, its heap, the other side's
//! callers between slices); the design notes say by how much.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::floors::{LocalFloor, Multiplexed};
use crate::load::Latency;
use crate::paired::drive;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a fresh process runs its floor before measuring it: its first half second reads
/// about 0.6x of the rest (threads, heap and caches still cold), and the bench's own floor is
/// measured warm.
const WARM_UP: Duration = Duration::from_secs(1);

/// A floor a standalone process runs.
enum Floor<'a> {
    /// The local floor over this many entities.
    Local(u64),
    /// The multiplexed remote floor against the echo server at this address.
    Remote(&'a str),
    /// Not a floor: why.
    Wrong(String),
}

impl<'a> Floor<'a> {
    fn of(kind: &str, addr: Option<&'a str>, entities: u64) -> Floor<'a> {
        match (kind, addr) {
            ("local", _) => Floor::Local(entities),
            ("remote", Some(addr)) => Floor::Remote(addr),
            ("remote", None) => Floor::Wrong("the remote floor needs --addr of an echo server".into()),
            (other, _) => Floor::Wrong(format!("unknown floor {other} (local, remote)")),
        }
    }

    /// Runs the floor for [`WARM_UP`], unmeasured, then for `d`.
    async fn run(self, callers: u64, d: Duration) -> Result<(f64, Latency), BoxError> {
        match self {
            Floor::Local(n) => {
                let floor = LocalFloor::start(n);
                let call = |f: Arc<LocalFloor>, _, rng| async move {
                    let ok = f.call(rng).await;
                    (f, ok)
                };
                drive(callers, WARM_UP, floor.clone(), call).await;
                Ok(drive(callers, d, floor, call).await)
            }
            Floor::Remote(addr) => {
                let mux = Arc::new(Multiplexed::connect(addr).await?);
                let call = |m: Arc<Multiplexed>, _, _| async move {
                    let ok = m.call().await;
                    (m, ok)
                };
                drive(callers, WARM_UP, mux.clone(), call).await;
                Ok(drive(callers, d, mux, call).await)
            }
            Floor::Wrong(why) => Err(why.into()),
        }
    }
}

/// `shardline floor`: runs one floor for `duration_ms` and prints its rate as JSON.
pub async fn run(kind: &str, addr: Option<&str>, callers: u64, entities: u64, duration_ms: u64) -> i32 {
    let d = Duration::from_millis(duration_ms);
    match Floor::of(kind, addr, entities).run(callers.max(1), d).await {
        Ok((ops, lat)) => {
            println!("{}", json!({ "floor": kind, "callers": callers, "ops_per_s": ops, "latency_us": lat }));
            0
        }
        Err(e) => {
            eprintln!("floor {kind} failed: {e}");
            1
        }
    }
}

/// The rate of a floor run by `shardline floor` in a process of its own for `d`.
pub async fn measure(
    kind: &str,
    addr: Option<&str>,
    callers: u64,
    entities: u64,
    d: Duration,
) -> Result<f64, BoxError> {
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["floor", kind, "--callers", &callers.to_string(), "--entities", &entities.to_string()]);
    cmd.args(["--duration-ms", &d.as_millis().to_string()]);
    if let Some(addr) = addr {
        cmd.args(["--addr", addr]);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
    if !out.status.success() {
        return Err(format!("the standalone {kind} floor failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("the standalone {kind} floor printed no JSON: {e}"))?;
    v["ops_per_s"].as_f64().ok_or_else(|| format!("the standalone {kind} floor printed no ops_per_s: {v}").into())
}

/// A standalone floor measured before and after the paired run (`d` each), their mean.
pub async fn around<T>(
    kind: &str,
    addr: Option<&str>,
    callers: u64,
    entities: u64,
    d: Duration,
    paired: impl std::future::Future<Output = T>,
) -> Result<(T, f64), BoxError> {
    let before = measure(kind, addr, callers, entities, d).await?;
    let out = paired.await;
    let after = measure(kind, addr, callers, entities, d).await?;
    Ok((out, (before + after) / 2.0))
}
