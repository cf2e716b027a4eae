//! Load that proves exactly-once: callers deposit into accounts, each deposit resent with its
//! request id until it is answered, and every acknowledged deposit is remembered for the audit.

use std::time::{Duration, Instant};

use shardline_cli::{AccountCmd, Accounts};

/// One acknowledged deposit: its account and op, when its answer came (since the load began),
/// and whether an earlier attempt of it ended with its outcome unknown (a timeout, the node
/// gone), so that the resend that was answered may find it applied already.
pub struct Acked {
    pub account: u64,
    pub op: u64,
    pub answered: Duration,
    pub resent_after_unknown: bool,
}

/// Deposits of one caller into accounts `acct-0..accounts`, each resent with its request id
/// until it is answered.
pub async fn deposit_until_stopped(
    h: Accounts,
    caller: u64,
    accounts: u64,
    began: Instant,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<Acked> {
    let mut acked = Vec::new();
    let mut op = caller * 1_000_000;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        op += 1;
        let a = op % accounts;
        let rid = shardline::RequestId::new(format!("test-{op}"));
        let start = Instant::now();
        let mut unknown = false;
        loop {
            match h.ask_with_request_id(format!("acct-{a}"), AccountCmd::Deposit { op, amount: 1 }, rid.clone()).await {
                Ok(r) => {
                    assert!(r.applied);
                    acked.push(Acked { account: a, op, answered: began.elapsed(), resent_after_unknown: unknown });
                    break;
                }
                Err(e) => {
                    assert!(start.elapsed() < Duration::from_secs(60), "op {op} never answered: {e}");
                    unknown |= e.processed() != shardline::Processed::No;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    acked
}
