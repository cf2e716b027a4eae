//! The demo's accounts on the world, and their clients, on the proxy node: each asks with
//! request ids and retries as the demo's driver does, and reads; after the heal, one audits
//! every account until it answers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardline::entity::{EntitySettings, EventSourced, RequestId};
use shardline::journal::{InMemoryJournal, Journal};
use shardline::Attempts;
use shardline::{Error, Processed};
use shardline_cli::account::{AccountCmd, AccountEvent, AccountReply};
use shardline_cli::history::{Kind, Operation, Outcome as Answer};
use shardline_cli::{account_settings, Account};
use shardline_testkit::observed::WatchedHandle;
use shardline_testkit::schedule::HEAL_AT;
use shardline_testkit::world::{Answered, Slot, Workload};
use shardline_testkit::Rng;
use tokio::runtime::Runtime;
use tokio::time::Instant;

pub const ACCOUNTS: usize = 5;

pub fn account(i: usize) -> String {
    format!("acct-{i}")
}

type SimAccounts = WatchedHandle<Account>;

/// The accounts and their clients.
#[derive(Default)]
pub struct Accounts {
    pub record: Record,
}

impl Workload for Accounts {
    type Entity = Account;

    fn settings(&self, shards: u32) -> EntitySettings {
        account_settings(shards)
    }

    fn entities(&self) -> Vec<String> {
        (0..ACCOUNTS).map(account).collect()
    }

    fn spawn_clients(&self, rt: &Runtime, node: Slot<Account>, origin: Instant, seed: u64, answered: Answered) {
        spawn(rt, node, origin, seed, &self.record, answered)
    }
}

impl Accounts {
    /// The clients' history once the world stopped at `end_ms`: operations still in flight are
    /// of unknown outcome.
    pub fn history(&self, end_ms: u64) -> Vec<Operation> {
        let mut history = std::mem::take(&mut *self.record.history.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, mut o) in std::mem::take(&mut *self.record.in_flight.lock().unwrap_or_else(|e| e.into_inner())) {
            o.complete_us = end_ms * 1_000;
            history.push(o);
        }
        history
    }
}

/// Account → op ids in its journal, in order.
pub fn read_journal(journal: &InMemoryJournal) -> BTreeMap<String, Vec<u64>> {
    let rt = tokio::runtime::Builder::new_current_thread().build().ok();
    let mut out = BTreeMap::new();
    let Some(rt) = rt else { return out };
    for i in 0..ACCOUNTS {
        let a = account(i);
        let events = rt.block_on(journal.read(&format!("account|{a}"), 1));
        let ops = match events {
            Ok(events) => events
                .iter()
                .filter_map(|e| postcard::from_bytes::<<Account as EventSourced>::Event>(&e.event.payload).ok())
                .map(|e| match e {
                    AccountEvent::Deposited { op, .. } | AccountEvent::Withdrew { op, .. } => op,
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        out.insert(a, ops);
    }
    out
}

/// The clients' history: operations that ended, and those still in flight by key.
#[derive(Clone, Default)]
pub struct Record {
    pub history: Arc<Mutex<Vec<Operation>>>,
    pub in_flight: Arc<Mutex<BTreeMap<u64, Operation>>>,
}

const CLIENTS: usize = 4;

/// The clients, on the proxy node: each asks with request ids and retries as the demo's
/// driver does, and reads; after the heal, one audits every account until it answers.
fn spawn(rt: &Runtime, slot: Slot<Account>, origin: Instant, seed: u64, record: &Record, answered: Answered) {
    let mut rng = Rng::new(seed ^ 0xC11E);
    let next_op = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let finished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for c in 0..CLIENTS {
        let finished = finished.clone();
        let slot = slot.clone();
        let history = record.history.clone();
        let mut rng = Rng::new(rng.next());
        let next_op = next_op.clone();
        let in_flight = record.in_flight.clone();
        rt.spawn(async move {
            let now_us = move || (Instant::now() - origin).as_micros() as u64;
            while now_us() < HEAL_AT * 1_000 {
                // The proxy node's current incarnation (it rejoins when fenced).
                let accounts = wait_for_accounts(&slot).await;
                let a = account(rng.below(ACCOUNTS as u64) as usize);
                let op = next_op.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let key = op;
                let amount = 1 + rng.below(50) as i64;
                let (cmd, kind) = match rng.below(10) {
                    0..=5 => (AccountCmd::Deposit { op, amount }, Kind::Deposit),
                    6 => (AccountCmd::Withdraw { op, amount }, Kind::Withdraw),
                    7 | 8 => (AccountCmd::Balance, Kind::Balance),
                    _ => (AccountCmd::Audit, Kind::Audit),
                };
                let write = matches!(kind, Kind::Deposit | Kind::Withdraw);
                let rid = write.then(|| RequestId::new(format!("c{c}-{op}")));
                let invoke_us = now_us();
                let (op, amount) = if write { (op, amount) } else { (0, 0) };
                // Until it ends, it is in flight: a run that stops first records it as of
                // unknown outcome.
                let unknown = Err(Error::OutcomeUnknown("in flight when the run ended".into()));
                let o = operation(a.clone(), kind, op, amount, rid.as_ref(), invoke_us, u64::MAX, &unknown);
                in_flight.lock().unwrap_or_else(|e| e.into_inner()).insert(key, o);
                let r = ask_retrying(&accounts, &a, cmd, rid.clone()).await;
                if let Err(e) = &r {
                    tracing::info!(op, account = %a, error = %e, processed = ?e.processed(), "client: ask failed");
                }
                in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                let o = operation(a, kind, op, amount, rid.as_ref(), invoke_us, now_us(), &r);
                history.lock().unwrap_or_else(|e| e.into_inner()).push(o);
                tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
            }
            finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
    }
    let history = record.history.clone();
    rt.spawn(async move {
        let now_us = move || (Instant::now() - origin).as_micros() as u64;
        // Audits after the last write has ended: they list every write, so every read
        // has a place in the log.
        while now_us() < HEAL_AT * 1_000 || finished.load(std::sync::atomic::Ordering::Relaxed) < CLIENTS {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for i in 0..ACCOUNTS {
            let a = account(i);
            loop {
                let accounts = wait_for_accounts(&slot).await;
                let invoke_us = now_us();
                let r = accounts.ask(&a, AccountCmd::Audit).await;
                let ok = r.is_ok();
                let o = operation(a.clone(), Kind::Audit, 0, 0, None, invoke_us, now_us(), &r);
                history.lock().unwrap_or_else(|e| e.into_inner()).push(o);
                if ok {
                    answered.lock().unwrap_or_else(|e| e.into_inner()).insert(a.clone(), now_us() / 1_000);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
}

async fn wait_for_accounts(slot: &Slot<Account>) -> SimAccounts {
    loop {
        let node = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((_, accounts)) = node {
            return accounts;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asks, resending the same request id while the answer may be lost (as the demo's driver does).
async fn ask_retrying(
    accounts: &SimAccounts,
    id: &str,
    cmd: AccountCmd,
    rid: Option<RequestId>,
) -> Result<AccountReply, Error> {
    let mut tries = 0;
    let mut attempts = Attempts::default();
    loop {
        let r = match &rid {
            Some(rid) => accounts.ask_with_request_id(id, cmd.clone(), rid.clone()).await,
            None => accounts.ask(id, cmd.clone()).await,
        };
        match r {
            Err(e) if tries < 3 && (rid.is_some() || e.processed() == Processed::No) && retryable(&e) => {
                attempts.failed(&e);
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200 << tries)).await;
            }
            r => return r.map_err(|e| attempts.verdict(e)),
        }
    }
}

fn retryable(e: &Error) -> bool {
    !matches!(e, Error::Rejected(_) | Error::RequestExpired(_))
}

#[allow(clippy::too_many_arguments)]
fn operation(
    account: String,
    kind: Kind,
    op: u64,
    amount: i64,
    rid: Option<&RequestId>,
    invoke_us: u64,
    complete_us: u64,
    r: &Result<AccountReply, Error>,
) -> Operation {
    let write = matches!(kind, Kind::Deposit | Kind::Withdraw);
    let (outcome, reply) = match r {
        Ok(r) => (Answer::Ok, Some(r)),
        Err(e) if e.processed() == Processed::No => (Answer::NotApplied, None),
        Err(_) => (Answer::Unknown, None),
    };
    Operation {
        account,
        kind,
        op,
        amount,
        request_id: rid.map(|r| r.key().to_string()),
        invoke_us,
        complete_us,
        outcome,
        applied: reply.filter(|_| write).map(|r| r.applied),
        balance: reply.map(|r| r.balance),
        ops: reply.filter(|_| kind == Kind::Audit).map(|r| r.ops.clone()),
    }
}
