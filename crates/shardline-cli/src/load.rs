//! The load driver: concurrent callers, latency percentiles, a ledger of acknowledged
//! operations, and a monitor that measures how long shards take to serve again after a change.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use shardline::entity::Persist;
use shardline::{Error, NodeId, Processed};

use shardline::Attempts;
use shardline_cli::history::{now_us, HistoryWriter, Kind, Operation, Outcome};
use shardline_cli::{AccountCmd, AccountReply, Accounts};

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
}

/// p50 and p99 of samples (microseconds).
pub fn percentiles(samples: &mut [u32]) -> Latency {
    if samples.is_empty() {
        return Latency::default();
    }
    samples.sort_unstable();
    let at = |q: f64| f64::from(samples[((samples.len() as f64 - 1.0) * q).round() as usize]);
    Latency { p50: at(0.50), p99: at(0.99) }
}

/// Where callers send their asks: the handle of the driver's current incarnation. A driver that
/// its membership fences rejoins as a new incarnation (as `shardline node` does), with a new
/// handle; its callers pick it up at their next attempt.
#[derive(Clone)]
pub struct Route {
    current: Arc<Mutex<Accounts>>,
    /// Grows with every new handle, so that a caller reads the lock only when it changed.
    generation: Arc<AtomicU64>,
}

impl Route {
    pub fn new(accounts: Accounts) -> Self {
        Route { current: Arc::new(Mutex::new(accounts)), generation: Arc::new(AtomicU64::new(0)) }
    }

    /// Sends every later attempt through `accounts`.
    pub fn replace(&self, accounts: Accounts) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = accounts;
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The current incarnation's handle.
    pub fn current(&self) -> Accounts {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn caller(&self) -> Caller {
        Caller { route: self.clone(), seen: self.generation.load(Ordering::Acquire), accounts: self.current() }
    }
}

/// One caller's copy of the route's handle, refreshed when the route changes.
struct Caller {
    route: Route,
    seen: u64,
    accounts: Accounts,
}

impl Caller {
    fn accounts(&mut self) -> &Accounts {
        let generation = self.route.generation.load(Ordering::Acquire);
        if generation != self.seen {
            self.accounts = self.route.current();
            self.seen = generation;
        }
        &self.accounts
    }
}

/// What one phase of load produced.
#[derive(Debug, Default)]
pub struct PhaseLoad {
    pub acked: u64,
    pub failed: u64,
    pub errors: BTreeMap<String, u64>,
    pub latencies: Vec<u32>,
    pub elapsed: Duration,
}

/// Per account: operations acknowledged as applied, and those whose outcome is unknown.
#[derive(Default)]
pub struct Ledger {
    acked: HashMap<u64, Vec<(u64, i64)>>,
    unknown: HashMap<u64, Vec<(u64, i64)>>,
}

/// The ledger check's findings.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Invariants {
    pub lost_acked: u64,
    pub double_applied: u64,
    pub ledger_mismatches: u64,
}

impl Ledger {
    /// Audits every account: acknowledged operations must be applied exactly once, nothing
    /// unknown to the ledger may be applied, and the balance must be the sum of what was applied.
    /// Each audit that is answered is recorded in `history`, if given.
    pub async fn audit(
        &self,
        route: &Route,
        range: AccountRange,
        concurrency: usize,
        history: Option<&Arc<HistoryWriter>>,
    ) -> Invariants {
        let next = Arc::new(AtomicU64::new(0));
        let total = Arc::new(Mutex::new(Invariants::default()));
        let mut tasks = Vec::new();
        let ledger = Arc::new(self.snapshot());
        for _ in 0..concurrency.max(1) {
            let (next, total, ledger, mut caller) = (next.clone(), total.clone(), ledger.clone(), route.caller());
            let history = history.cloned();
            tasks.push(tokio::spawn(async move {
                loop {
                    let a = next.fetch_add(1, Ordering::Relaxed);
                    if a >= range.count {
                        return;
                    }
                    // A read: asking again is harmless, so keep at it while the cluster settles.
                    let give_up = Instant::now() + RETRY_LIMIT;
                    let reply = loop {
                        let invoke_us = now_us();
                        let accounts = caller.accounts();
                        match accounts.ask_timeout(range.id(a), AccountCmd::Audit, Duration::from_secs(5)).await {
                            Ok(r) => {
                                if let Some(h) = &history {
                                    let _ = h.record(&record(range.id(a), Kind::Audit, 0, 0, None, invoke_us, Ok(&r)));
                                }
                                break Some(r);
                            }
                            Err(_) if Instant::now() < give_up => tokio::time::sleep(Duration::from_millis(50)).await,
                            Err(_) => break None,
                        }
                    };
                    let (acked, unknown) = ledger.get(&a).cloned().unwrap_or_default();
                    let mut inv = Invariants::default();
                    match reply {
                        None => inv.ledger_mismatches += 1,
                        Some(r) => {
                            let applied: HashSet<u64> = r.ops.iter().copied().collect();
                            inv.double_applied += (r.ops.len() - applied.len()) as u64;
                            inv.lost_acked += acked.iter().filter(|(op, _)| !applied.contains(op)).count() as u64;
                            let known: HashMap<u64, i64> = acked.iter().chain(unknown.iter()).copied().collect();
                            let sum: Option<i64> = applied.iter().map(|op| known.get(op).copied()).sum();
                            if sum != Some(r.balance) {
                                inv.ledger_mismatches += 1;
                            }
                        }
                    }
                    let mut t = total.lock().unwrap_or_else(|e| e.into_inner());
                    t.lost_acked += inv.lost_acked;
                    t.double_applied += inv.double_applied;
                    t.ledger_mismatches += inv.ledger_mismatches;
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let r = *total.lock().unwrap_or_else(|e| e.into_inner());
        r
    }

    #[allow(clippy::type_complexity)]
    fn snapshot(&self) -> HashMap<u64, (Vec<(u64, i64)>, Vec<(u64, i64)>)> {
        let mut m: HashMap<u64, (Vec<(u64, i64)>, Vec<(u64, i64)>)> = HashMap::new();
        for (a, v) in &self.acked {
            m.entry(*a).or_default().0.extend(v);
        }
        for (a, v) in &self.unknown {
            m.entry(*a).or_default().1.extend(v);
        }
        m
    }
}

/// The accounts one driver uses: `acct-{first}` … `acct-{first + count - 1}`. Drivers that share
/// a cluster use ranges of their own, so each audits only what it wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AccountRange {
    pub first: u64,
    pub count: u64,
}

impl AccountRange {
    /// The first `count` accounts (the demo's).
    pub fn first(count: u64) -> Self {
        AccountRange { first: 0, count }
    }

    /// The id of the account `a` places into the range.
    pub fn id(&self, a: u64) -> String {
        format!("acct-{}", self.first + a)
    }
}

pub fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Timeout(_) => "timeout",
        Error::Unavailable(_) => "unavailable",
        Error::Overloaded(_) => "overloaded",
        Error::Rejected(_) => "rejected",
        Error::ReplyLost(_) => "reply_lost",
        Error::OutcomeUnknown(_) => "outcome_unknown",
        Error::RequestExpired(_) => "request_expired",
    }
}

/// An operation as the history records it: answered, not applied, or of unknown outcome.
fn record(
    account: String,
    kind: Kind,
    op: u64,
    amount: i64,
    request_id: Option<&shardline::RequestId>,
    invoke_us: u64,
    result: Result<&AccountReply, &Error>,
) -> Operation {
    let write = matches!(kind, Kind::Deposit | Kind::Withdraw);
    let (outcome, reply) = match result {
        Ok(r) => (Outcome::Ok, Some(r)),
        Err(e) if e.processed() == Processed::No => (Outcome::NotApplied, None),
        Err(_) => (Outcome::Unknown, None),
    };
    Operation {
        account,
        kind,
        op,
        amount,
        request_id: request_id.map(|r| r.key().to_string()),
        invoke_us,
        complete_us: now_us(),
        outcome,
        applied: reply.filter(|_| write).map(|r| r.applied),
        balance: reply.map(|r| r.balance),
        ops: reply.filter(|_| kind == Kind::Audit).map(|r| r.ops.clone()),
    }
}

/// How long a caller keeps retrying one operation before it counts as failed.
const RETRY_LIMIT: Duration = Duration::from_secs(30);

/// Tells this run's request ids from those of an earlier run against the same journal.
fn run_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        format!("{t:x}-{}", std::process::id())
    })
}

/// Asks until the command is answered or [`RETRY_LIMIT`] has passed, resending with the same
/// request id: a command that ran but whose answer was lost (a timeout, a node killed after the
/// write) is not applied again, and its recorded reply comes back. Counts each error met.
async fn ask_retrying(
    caller: &mut Caller,
    id: String,
    cmd: AccountCmd,
    request_id: Option<shardline::RequestId>,
    errors: &mut BTreeMap<String, u64>,
) -> Result<shardline_cli::AccountReply, Error> {
    let give_up = Instant::now() + RETRY_LIMIT;
    let mut backoff = Duration::from_millis(10);
    let mut attempts = Attempts::default();
    loop {
        let accounts = caller.accounts();
        let timeout = accounts.entity_handle().default_ask_timeout();
        match accounts.ask_persist(&id, Persist { request_id: request_id.clone(), command: cmd.clone() }, timeout).await
        {
            Ok(r) => return Ok(r),
            Err(e) => {
                *errors.entry(error_kind(&e).to_string()).or_default() += 1;
                if Instant::now() >= give_up {
                    return Err(attempts.verdict(e));
                }
                attempts.failed(&e);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// Runs `concurrency` callers of random deposits, withdrawals and balance reads for `duration`;
/// a caller retries an unanswered operation with its request id (see [`ask_retrying`]), so an
/// operation counts as failed only when it stayed unanswered for [`RETRY_LIMIT`].
/// `progress` is called about once a second with (acked, failed) so far. Every operation is
/// recorded in `history`, if given: from its first send to its last answer, as one.
#[allow(clippy::too_many_arguments)]
pub async fn run_accounts(
    route: &Route,
    range: AccountRange,
    concurrency: u64,
    duration: Duration,
    ledger: &Arc<Mutex<Ledger>>,
    next_op: &Arc<AtomicU64>,
    history: Option<&Arc<HistoryWriter>>,
    progress: impl Fn(u64, u64, Duration),
) -> PhaseLoad {
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let (mut caller, stop, acked, failed, ledger, next_op) =
            (route.caller(), stop.clone(), acked.clone(), failed.clone(), ledger.clone(), next_op.clone());
        let history = history.cloned();
        tasks.push(tokio::spawn(async move {
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (w + 1).wrapping_mul(0x2545_F491_4F6C_DD1D);
            let mut lat = Vec::new();
            let mut errors: BTreeMap<String, u64> = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let a = rng % range.count.max(1);
                let op = next_op.fetch_add(1, Ordering::Relaxed);
                let amount = (rng >> 20) as i64 % 100 + 1;
                let (cmd, signed, kind) = match (rng >> 8) % 10 {
                    0..=6 => (AccountCmd::Deposit { op, amount }, amount, Kind::Deposit),
                    7 | 8 => (AccountCmd::Withdraw { op, amount }, -amount, Kind::Withdraw),
                    _ => (AccountCmd::Balance, 0, Kind::Balance),
                };
                // Reads change nothing, so only writes carry a request id (and get recorded).
                let request_id = (signed != 0).then(|| shardline::RequestId::new(format!("{}-{op}", run_tag())));
                let t = Instant::now();
                let invoke_us = now_us();
                let r = ask_retrying(&mut caller, range.id(a), cmd, request_id.clone(), &mut errors).await;
                let us = t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                if let Some(h) = &history {
                    let (op, amount) = if kind == Kind::Balance { (0, 0) } else { (op, amount) };
                    // A failure to record is kept by the writer, whose flush reports it.
                    let _ =
                        h.record(&record(range.id(a), kind, op, amount, request_id.as_ref(), invoke_us, r.as_ref()));
                }
                match r {
                    Ok(reply) => {
                        lat.push(us);
                        acked.fetch_add(1, Ordering::Relaxed);
                        if reply.applied {
                            ledger
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .acked
                                .entry(a)
                                .or_default()
                                .push((op, signed));
                        }
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        // Not processed: nothing to account for. Otherwise it ran or may have run
                        // (and a withdrawal may have been refused): the audit allows either.
                        if signed != 0 && e.processed() != Processed::No {
                            ledger
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .unknown
                                .entry(a)
                                .or_default()
                                .push((op, signed));
                        }
                    }
                }
            }
            (lat, errors)
        }));
    }
    gather(tasks, &stop, &acked, &failed, start, duration, progress).await
}

/// What each caller of a load measured: its latencies, and its failures by kind.
pub type CallerLoad = (Vec<u32>, BTreeMap<String, u64>);

/// Lets `tasks` (callers counting into `acked` and `failed`, until `stop` is set) run for
/// `duration` from `start`, calling `progress` about four times a second, then stops them and
/// adds up what they measured.
pub async fn gather(
    tasks: Vec<tokio::task::JoinHandle<CallerLoad>>,
    stop: &AtomicBool,
    acked: &AtomicU64,
    failed: &AtomicU64,
    start: Instant,
    duration: Duration,
    progress: impl Fn(u64, u64, Duration),
) -> PhaseLoad {
    let deadline = start + duration;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250).min(deadline.saturating_duration_since(Instant::now()))).await;
        progress(acked.load(Ordering::Relaxed), failed.load(Ordering::Relaxed), start.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    let mut out = PhaseLoad::default();
    for t in tasks {
        if let Ok((lat, errors)) = t.await {
            out.latencies.extend(lat);
            for (k, v) in errors {
                *out.errors.entry(k).or_default() += v;
            }
        }
    }
    out.elapsed = start.elapsed();
    out.acked = acked.load(Ordering::Relaxed);
    out.failed = failed.load(Ordering::Relaxed);
    out
}

/// Watches where shards live (as a node's region knows it) and measures how long after an
/// event every moved shard answers again.
pub struct HomeMonitor {
    stop: Arc<AtomicBool>,
    /// Shards moved so far: what a monitor that times out still reports.
    moved: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<(usize, Option<Duration>)>,
}

/// A phase whose moved shards all serve again.
#[derive(Debug, Clone, Copy)]
pub struct Rehomed {
    /// Shards that moved.
    pub moved: usize,
    /// How long after the event every moved shard answered (None: none moved).
    pub served_after: Option<Duration>,
}

/// Why a phase's moved shards were not seen serving again.
#[derive(Debug, thiserror::Error)]
pub enum RehomeError {
    /// When the limit ran out, shards were still moving or a moved shard did not answer.
    #[error("the moves had not settled, or a moved shard did not answer, within {limit:?} ({moved} shards moved)")]
    TimedOut {
        /// Shards that had moved by then.
        moved: usize,
        /// The limit.
        limit: Duration,
    },
    /// The monitor ended without a result.
    #[error("the re-home monitor failed: {0}")]
    Failed(String),
}

impl HomeMonitor {
    /// Starts watching from `event` on.
    pub fn start(accounts: &Accounts, probes: Arc<Vec<String>>, event: Instant) -> HomeMonitor {
        let stop = Arc::new(AtomicBool::new(false));
        let moved_count = Arc::new(AtomicUsize::new(0));
        let (accounts, stop2, moved_count2) = (accounts.clone(), stop.clone(), moved_count.clone());
        let task = tokio::spawn(async move {
            let before = accounts.entity_handle().shard_homes();
            let mut last = before.clone();
            let mut moved: HashSet<usize> = HashSet::new();
            let mut dirty = false;
            let mut serving: Option<Duration> = None;
            loop {
                let homes = accounts.entity_handle().shard_homes();
                if homes != last {
                    for (i, (a, b)) in homes.iter().zip(&last).enumerate() {
                        if a != b && a.is_some() && before.get(i) != Some(a) {
                            moved.insert(i);
                        }
                    }
                    moved_count2.store(moved.len(), Ordering::Relaxed);
                    last = homes.clone();
                    dirty = true;
                }
                let all_homed = homes.iter().all(Option::is_some);
                // Probed at once, not after a quiet spell (which only added itself to the figure):
                // a probe answers once its shard serves, and a change while probing probes again.
                if dirty && all_homed {
                    // Every moved shard must answer.
                    let mut asks = Vec::new();
                    for &s in &moved {
                        let (accounts, id) = (accounts.clone(), probes[s].clone());
                        asks.push(tokio::spawn(async move {
                            accounts.ask_timeout(id, AccountCmd::Balance, Duration::from_secs(1)).await.is_ok()
                        }));
                    }
                    let mut ok = true;
                    for a in asks {
                        ok &= a.await.unwrap_or(false);
                    }
                    if ok && accounts.entity_handle().shard_homes() == homes {
                        serving = Some(event.elapsed());
                        dirty = false;
                    }
                }
                if stop2.load(Ordering::Relaxed) && !dirty {
                    return (moved.len(), serving);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        HomeMonitor { stop, moved: moved_count, task }
    }

    /// Stops watching once the last change was served, waiting at most `limit` for it. A
    /// monitor that runs out of time is an error, never a phase with nothing moved.
    pub async fn finish(mut self, limit: Duration) -> Result<Rehomed, RehomeError> {
        self.stop.store(true, Ordering::Relaxed);
        match tokio::time::timeout(limit, &mut self.task).await {
            Ok(Ok((moved, served_after))) => Ok(Rehomed { moved, served_after }),
            Ok(Err(e)) => Err(RehomeError::Failed(e.to_string())),
            Err(_) => {
                // Left running, it would probe the shards for ever.
                self.task.abort();
                Err(RehomeError::TimedOut { moved: self.moved.load(Ordering::Relaxed), limit })
            }
        }
    }
}

impl RehomeError {
    /// Shards that had moved when the monitor gave up (0 when it failed).
    pub fn moved(&self) -> usize {
        match self {
            RehomeError::TimedOut { moved, .. } => *moved,
            RehomeError::Failed(_) => 0,
        }
    }
}

/// One entity id per shard, to probe that every shard answers.
pub fn probe_ids(shards: u32) -> Vec<String> {
    let mut ids = vec![String::new(); shards as usize];
    let mut missing = shards as usize;
    let mut k = 0u64;
    while missing > 0 {
        let id = format!("probe-{k}");
        let s = shardline::ShardId(shardline_core::shard_of(&id, shards).0);
        if ids[s.0 as usize].is_empty() {
            ids[s.0 as usize] = id;
            missing -= 1;
        }
        k += 1;
    }
    ids
}

/// Shards per node name, from a region's view of homes.
pub fn shards_per_node(homes: &[Option<NodeId>]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for h in homes.iter().flatten() {
        *m.entry(h.name.to_string()).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A monitor whose shards never serve again reports it, with what had moved.
    #[tokio::test]
    async fn a_monitor_that_runs_out_of_time_says_so() {
        let m = HomeMonitor {
            stop: Arc::default(),
            moved: Arc::new(AtomicUsize::new(3)),
            task: tokio::spawn(std::future::pending()),
        };
        match m.finish(Duration::from_millis(10)).await {
            Err(e @ RehomeError::TimedOut { moved: 3, .. }) => assert_eq!(e.moved(), 3),
            other => panic!("a monitor that never finished: {other:?}"),
        }
    }
}
