//! The checks of a recorded history, per account.
//!
//! An account is a log of operations: its audits list every applied operation in order, so the
//! order of its writes is not searched for but read off its longest audit (every other audit
//! must be a prefix of it, or two owners wrote two histories). What is left to decide is where
//! each read falls in that log, and that is exact and fast: a read may see the state after the
//! `k`-th write when
//!
//! - every write answered before the read was sent is among the first `k` (and so is every write
//!   listed by an audit that completed before the read was sent: reads never go back);
//! - no write sent after the read completed is;
//! - the balance after `k` writes is the one it read (an audit: `k` is its length).
//!
//! Reads are placed in the order they completed, each at the smallest `k` that fits. Constraints
//! between reads only ever bound a later read from below by an earlier one, so the smallest
//! choice never rules out a placement another choice would allow: when no `k` fits, no order
//! does, and the read is stale. Writes answered with a balance are reads of their own position.
//! The log order must also respect real time: a write answered before another was sent comes
//! first. That is the whole of linearizability for a log whose order is known (the general
//! problem is NP-complete only because the order must be searched for).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use super::record::{Kind, Operation, Outcome};

/// What a check found. Every count but the `*_checked` ones is a violation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Findings {
    /// Writes whose effect was checked against an audit that came after them.
    pub writes_checked: u64,
    /// Reads (balances, audits, declined withdrawals, the balance a write answered) placed.
    pub reads_checked: u64,
    /// Acknowledged writes missing from an audit sent after their answer.
    pub lost_acked: u64,
    /// Operations applied more than once.
    pub double_applied: u64,
    /// Operations applied though answered "not applied" (or declined), or never sent.
    pub applied_not_applied: u64,
    /// Reads that fit no place in the log: stale, or from another history.
    pub stale_reads: u64,
    /// Writes in an order real time rules out, or applied before they were sent.
    pub order_violations: u64,
    /// The first violations, described.
    pub details: Vec<String>,
}

impl Findings {
    /// Whether nothing was violated.
    pub fn holds(&self) -> bool {
        self.lost_acked == 0
            && self.double_applied == 0
            && self.applied_not_applied == 0
            && self.stale_reads == 0
            && self.order_violations == 0
    }

    fn note(&mut self, what: String) {
        if self.details.len() < 20 {
            self.details.push(what);
        }
    }

    fn add(&mut self, other: Findings) {
        self.writes_checked += other.writes_checked;
        self.reads_checked += other.reads_checked;
        self.lost_acked += other.lost_acked;
        self.double_applied += other.double_applied;
        self.applied_not_applied += other.applied_not_applied;
        self.stale_reads += other.stale_reads;
        self.order_violations += other.order_violations;
        for d in other.details {
            self.note(d);
        }
    }
}

/// Checks a history (of any number of accounts and drivers).
pub fn check(history: &[Operation]) -> Findings {
    let mut by_account: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for op in history {
        by_account.entry(op.account.as_str()).or_default().push(op);
    }
    let mut findings = Findings::default();
    for (account, ops) in by_account {
        findings.add(check_account(account, &ops));
    }
    findings
}

/// A read to place: when it was sent and answered, and what it saw.
struct Read {
    invoke: u64,
    complete: u64,
    /// The balance it saw.
    balance: i64,
    /// Where it must fall, if that is known (an audit's length, a write's own position).
    exactly: Option<usize>,
    what: String,
}

fn check_account(account: &str, ops: &[&Operation]) -> Findings {
    let mut f = Findings::default();
    let writes: HashMap<u64, &Operation> =
        ops.iter().filter(|o| matches!(o.kind, Kind::Deposit | Kind::Withdraw)).map(|o| (o.op, *o)).collect();
    let audits: Vec<(&Operation, &Vec<u64>)> = ops
        .iter()
        .filter(|o| o.kind == Kind::Audit && o.outcome == Outcome::Ok)
        .filter_map(|o| o.ops.as_ref().map(|l| (*o, l)))
        .collect();
    // The log: the longest audit; every other audit must be a prefix of it.
    let Some(log) = audits.iter().map(|(_, l)| *l).max_by_key(|l| l.len()) else {
        return f;
    };
    let mut seen = HashSet::new();
    for op in log {
        if !seen.insert(*op) {
            f.double_applied += 1;
            f.note(format!("{account}: operation {op} applied twice"));
        }
    }
    let signed = |w: &Operation| if w.kind == Kind::Withdraw { -w.amount } else { w.amount };
    let mut position: HashMap<u64, usize> = HashMap::new();
    let mut balance_after = vec![0i64];
    let mut known = true;
    for (i, op) in log.iter().enumerate() {
        position.entry(*op).or_insert(i + 1);
        match writes.get(op) {
            Some(w) => {
                let last = balance_after.last().copied().unwrap_or(0);
                balance_after.push(last + signed(w));
            }
            None => {
                known = false;
                f.applied_not_applied += 1;
                f.note(format!("{account}: operation {op} applied but never sent"));
            }
        }
    }
    // Writes against the audits after them.
    for w in writes.values() {
        let applied = w.outcome == Outcome::Ok && w.applied == Some(true);
        let refused = w.outcome == Outcome::NotApplied || (w.outcome == Outcome::Ok && w.applied == Some(false));
        if refused && position.contains_key(&w.op) {
            f.applied_not_applied += 1;
            f.note(format!("{account}: operation {} applied though answered not applied", w.op));
        }
        if !applied {
            continue;
        }
        let later: Vec<&Vec<u64>> =
            audits.iter().filter(|(a, _)| a.invoke_us > w.complete_us).map(|(_, l)| *l).collect();
        if later.is_empty() {
            continue;
        }
        f.writes_checked += 1;
        if later.iter().any(|l| !l.contains(&w.op)) {
            f.lost_acked += 1;
            f.note(format!("{account}: acknowledged operation {} missing from a later audit", w.op));
        }
    }
    // The log's order against real time: nothing applied before it was sent, or before a write
    // that was sent after it was answered.
    let mut latest_invoke = 0u64;
    for op in log {
        let Some(w) = writes.get(op) else { continue };
        if w.outcome == Outcome::Ok && w.complete_us < latest_invoke {
            f.order_violations += 1;
            f.note(format!("{account}: operation {op} answered before an operation ahead of it in the log was sent"));
        }
        latest_invoke = latest_invoke.max(w.invoke_us);
    }
    for (a, list) in &audits {
        if let Some(op) = list.iter().find(|op| writes.get(op).is_some_and(|w| w.invoke_us > a.complete_us)) {
            f.order_violations += 1;
            f.note(format!("{account}: an audit listed operation {op} before it was sent"));
        }
    }
    if !known {
        // A write of unknown amount: balances past it cannot be computed.
        return f;
    }
    let mut reads: Vec<Read> = Vec::new();
    for o in ops {
        if o.outcome != Outcome::Ok {
            continue;
        }
        let Some(balance) = o.balance else { continue };
        let read = |exactly, what| Read { invoke: o.invoke_us, complete: o.complete_us, balance, exactly, what };
        match o.kind {
            Kind::Balance => reads.push(read(None, "a balance".into())),
            Kind::Audit => {
                let Some(list) = &o.ops else { continue };
                if list.len() > log.len() || list[..] != log[..list.len()] {
                    f.stale_reads += 1;
                    f.note(format!("{account}: an audit of {} operations is not a prefix of the longest", list.len()));
                    continue;
                }
                reads.push(read(Some(list.len()), format!("an audit of {} operations", list.len())));
            }
            Kind::Deposit | Kind::Withdraw if o.applied == Some(false) => {
                reads.push(read(None, format!("declined withdrawal {}", o.op)))
            }
            Kind::Deposit | Kind::Withdraw => {
                if let Some(p) = position.get(&o.op) {
                    reads.push(read(Some(*p), format!("the answer of operation {}", o.op)));
                }
            }
        }
    }
    place_reads(account, log, &writes, &balance_after, reads, &mut f);
    f
}

/// Places every read at the smallest position that fits (see the module docs).
fn place_reads(
    account: &str,
    log: &[u64],
    writes: &HashMap<u64, &Operation>,
    balance_after: &[i64],
    mut reads: Vec<Read>,
    f: &mut Findings,
) {
    // Positions by the balance after them, ascending.
    let mut at_balance: HashMap<i64, Vec<usize>> = HashMap::new();
    for (k, b) in balance_after.iter().enumerate() {
        at_balance.entry(*b).or_default().push(k);
    }
    // Acknowledged writes by when they were answered, with their positions: the lower bound of a
    // read is the furthest of those answered before it was sent.
    let mut answered: Vec<(u64, usize)> = log
        .iter()
        .enumerate()
        .filter_map(|(i, op)| writes.get(op).filter(|w| w.outcome == Outcome::Ok).map(|w| (w.complete_us, i + 1)))
        .collect();
    answered.sort_unstable();
    let answered_max: Vec<usize> = answered
        .iter()
        .scan(0, |m, (_, k)| {
            *m = (*m).max(*k);
            Some(*m)
        })
        .collect();
    // Writes by when they were sent: the upper bound of a read is just before the first one in
    // the log sent after it completed.
    let mut sent: Vec<(u64, usize)> =
        log.iter().enumerate().filter_map(|(i, op)| writes.get(op).map(|w| (w.invoke_us, i + 1))).collect();
    sent.sort_unstable();
    let mut sent_min_from: Vec<usize> = vec![log.len() + 1; sent.len() + 1];
    for i in (0..sent.len()).rev() {
        sent_min_from[i] = sent_min_from[i + 1].min(sent[i].1);
    }
    reads.sort_by_key(|r| (r.complete, r.invoke));
    // Reads placed so far, in the order they completed, with the furthest position up to each.
    let mut placed: Vec<(u64, usize)> = Vec::new();
    for r in reads {
        f.reads_checked += 1;
        let lower_writes = match answered.partition_point(|(t, _)| *t < r.invoke) {
            0 => 0,
            n => answered_max[n - 1],
        };
        let lower_reads = match placed.partition_point(|(t, _)| *t < r.invoke) {
            0 => 0,
            n => placed[n - 1].1,
        };
        let lower = lower_writes.max(lower_reads);
        let upper = sent_min_from[sent.partition_point(|(t, _)| *t <= r.complete)] - 1;
        let fits = |k: usize| k >= lower && k <= upper && balance_after.get(k) == Some(&r.balance);
        let k = match r.exactly {
            Some(k) => fits(k).then_some(k),
            None => at_balance
                .get(&r.balance)
                .and_then(|ks| ks.get(ks.partition_point(|k| *k < lower)))
                .copied()
                .filter(|k| fits(*k)),
        };
        let k = match k {
            Some(k) => k,
            None => {
                f.stale_reads += 1;
                f.note(format!(
                    "{account}: {} read {} at no place it can fall (after {lower} to {upper} of {} writes)",
                    r.what,
                    r.balance,
                    log.len()
                ));
                lower
            }
        };
        let furthest = placed.last().map_or(k, |(_, m)| (*m).max(k));
        placed.push((r.complete, furthest));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(op: u64, kind: Kind, amount: i64, t: (u64, u64), outcome: Outcome, balance: Option<i64>) -> Operation {
        Operation {
            account: "a".into(),
            kind,
            op,
            amount,
            request_id: Some(format!("r{op}")),
            invoke_us: t.0,
            complete_us: t.1,
            outcome,
            applied: (outcome == Outcome::Ok).then_some(balance.is_some()),
            balance,
            ops: None,
        }
    }

    fn deposit(op: u64, amount: i64, t: (u64, u64), balance: i64) -> Operation {
        write(op, Kind::Deposit, amount, t, Outcome::Ok, Some(balance))
    }

    fn balance(t: (u64, u64), b: i64) -> Operation {
        Operation {
            account: "a".into(),
            kind: Kind::Balance,
            op: 0,
            amount: 0,
            request_id: None,
            invoke_us: t.0,
            complete_us: t.1,
            outcome: Outcome::Ok,
            applied: None,
            balance: Some(b),
            ops: None,
        }
    }

    fn audit(t: (u64, u64), ops: &[u64], b: i64) -> Operation {
        Operation { kind: Kind::Audit, ops: Some(ops.to_vec()), ..balance(t, b) }
    }

    #[test]
    fn a_linearizable_history_holds() {
        let h = vec![
            deposit(1, 10, (0, 10), 10),
            balance((5, 12), 0), // concurrent with the deposit: may see before it
            deposit(2, 5, (11, 20), 15),
            balance((13, 25), 10), // concurrent with deposit 2
            balance((26, 30), 15),
            audit((40, 50), &[1, 2], 15),
        ];
        let f = check(&h);
        assert!(f.holds(), "{f:?}");
        assert_eq!(f.writes_checked, 2);
        assert_eq!(f.reads_checked, 6, "3 balances, an audit, 2 write answers");
    }

    #[test]
    fn a_stale_read_is_caught() {
        let h = vec![deposit(1, 10, (0, 10), 10), balance((11, 12), 0), audit((40, 50), &[1], 10)];
        let f = check(&h);
        assert_eq!(f.stale_reads, 1, "{f:?}");
    }

    #[test]
    fn a_read_that_goes_back_is_caught() {
        // Each read alone could fall before or after the deposit (it is concurrent with both),
        // but the second was sent after the first saw the deposit.
        let h =
            vec![deposit(1, 10, (0, 100), 10), balance((1, 10), 10), balance((20, 30), 0), audit((200, 210), &[1], 10)];
        assert_eq!(check(&h).stale_reads, 1);
    }

    #[test]
    fn lost_doubled_and_refused_writes_are_caught() {
        let h = vec![
            deposit(1, 10, (0, 10), 10),
            deposit(2, 5, (11, 20), 15),
            write(3, Kind::Deposit, 7, (21, 30), Outcome::NotApplied, None),
            audit((40, 50), &[1, 3, 3], 24),
        ];
        let f = check(&h);
        assert_eq!(f.lost_acked, 1, "operation 2: {f:?}");
        assert_eq!(f.double_applied, 1, "operation 3 twice: {f:?}");
        assert_eq!(f.applied_not_applied, 1, "operation 3 was answered not applied: {f:?}");
    }

    #[test]
    fn a_log_against_real_time_and_diverging_audits_are_caught() {
        let h = vec![
            deposit(1, 10, (0, 10), 10),
            deposit(2, 5, (20, 30), 15),
            audit((40, 50), &[2, 1], 15),
            audit((60, 70), &[1], 10),
        ];
        let f = check(&h);
        assert_eq!(f.order_violations, 1, "{f:?}");
        assert!(f.stale_reads >= 1, "the audit [1] is no prefix of [2, 1]: {f:?}");
    }

    #[test]
    fn a_wrong_answer_of_a_write_is_caught() {
        // Deposit 2 answered as if deposit 1 had not happened: decided on a stale state.
        let h = vec![deposit(1, 10, (0, 10), 10), deposit(2, 5, (11, 20), 5), audit((40, 50), &[1, 2], 15)];
        assert_eq!(check(&h).stale_reads, 1);
    }

    #[test]
    fn an_unknown_outcome_may_or_may_not_be_applied() {
        let h = vec![
            write(1, Kind::Deposit, 10, (0, 10), Outcome::Unknown, None),
            write(2, Kind::Deposit, 10, (0, 10), Outcome::Unknown, None),
            audit((40, 50), &[2], 10),
        ];
        assert!(check(&h).holds());
    }
}
