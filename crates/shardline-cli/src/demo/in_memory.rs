//! The demo's floor: the steady load, run the same way against the same accounts kept in memory.
//!
//! Every node serves `memory-account` beside `account`: the same commands, decided and applied
//! by the same code (`MemoryAccount`), with nothing written. Run right after the steady phase,
//! on the same nodes, with the same callers, accounts and mix of operations, it says what the
//! journal costs the demo (the goal: the journaled accounts at half of it or more). An
//! in-memory account has no history to recover and no request ids to record, so an ask that
//! fails here is counted, not asked again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardline::EntityHandle;
use shardline_cli::{AccountCmd, MemoryAccount};

use crate::load::{error_kind, gather, AccountRange, PhaseLoad};

/// Runs `concurrency` callers of random deposits, withdrawals and balance reads (the steady
/// phase's mix) on `range` for `duration`.
pub async fn run(
    accounts: &EntityHandle<MemoryAccount>,
    range: AccountRange,
    concurrency: u64,
    duration: Duration,
    progress: impl Fn(u64, u64, Duration),
) -> PhaseLoad {
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let (accounts, stop, acked, failed) = (accounts.clone(), stop.clone(), acked.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            // The steady phase's callers' generator, seeded apart from theirs.
            let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ (w + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut op = w << 40;
            let (mut lat, mut errors) = (Vec::new(), BTreeMap::<String, u64>::new());
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                op += 1;
                let amount = (rng >> 20) as i64 % 100 + 1;
                let cmd = match (rng >> 8) % 10 {
                    0..=6 => AccountCmd::Deposit { op, amount },
                    7 | 8 => AccountCmd::Withdraw { op, amount },
                    _ => AccountCmd::Balance,
                };
                let t = Instant::now();
                match accounts.entity_ref(range.id(rng % range.count.max(1))).ask(cmd).await {
                    Ok(_) => {
                        lat.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        *errors.entry(error_kind(&e).to_string()).or_default() += 1;
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            (lat, errors)
        }));
    }
    gather(tasks, &stop, &acked, &failed, start, duration, progress).await
}
