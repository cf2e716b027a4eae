//! The demo's entity: an event-sourced bank account that remembers which operations it applied,
//! so the demo driver can audit it against its own ledger (lost, doubled, or wrong), after moves
//! and crashes alike.

use serde::{Deserialize, Serialize};
use shardline::entity::EventSourced;
use shardline::{Entity, EntityContext, EntityId};

/// What an account is asked to do. Operations carry an id unique in the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum AccountCmd {
    /// Adds `amount`.
    Deposit { op: u64, amount: i64 },
    /// Takes `amount` out when the balance allows it.
    Withdraw { op: u64, amount: i64 },
    /// Reads the balance.
    Balance,
    /// Reads the balance and every applied operation id.
    Audit,
}

/// The answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AccountReply {
    /// Balance after the command.
    pub balance: i64,
    /// Whether the operation was applied (a withdrawal over the balance is declined).
    pub applied: bool,
    /// For `Audit`: ids of every applied operation, in order.
    pub ops: Vec<u64>,
}

/// What an account persists.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum AccountEvent {
    /// `amount` came in by operation `op`.
    Deposited { op: u64, amount: i64 },
    /// `amount` went out by operation `op`.
    Withdrew { op: u64, amount: i64 },
}

/// A bank account: event-sourced, so its balance survives moves and crashes.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Account {
    balance: i64,
    ops: Vec<u64>,
}

impl EventSourced for Account {
    type Command = AccountCmd;
    type Event = AccountEvent;
    type Reply = AccountReply;
    const EVENT_TYPE: &'static str = "account";

    fn empty(_id: &EntityId) -> Self {
        Account::default()
    }

    fn apply(&mut self, event: &AccountEvent) {
        match *event {
            AccountEvent::Deposited { op, amount } => {
                self.balance += amount;
                self.ops.push(op);
            }
            AccountEvent::Withdrew { op, amount } => {
                self.balance -= amount;
                self.ops.push(op);
            }
        }
    }

    fn decide(&self, cmd: AccountCmd) -> (Vec<AccountEvent>, AccountReply) {
        let event = match cmd {
            AccountCmd::Deposit { op, amount } => AccountEvent::Deposited { op, amount },
            AccountCmd::Withdraw { op, amount } if amount <= self.balance => AccountEvent::Withdrew { op, amount },
            AccountCmd::Withdraw { .. } | AccountCmd::Balance => {
                return (Vec::new(), AccountReply { balance: self.balance, applied: false, ops: Vec::new() })
            }
            AccountCmd::Audit => {
                return (Vec::new(), AccountReply { balance: self.balance, applied: false, ops: self.ops.clone() })
            }
        };
        let balance = match event {
            AccountEvent::Deposited { amount, .. } => self.balance + amount,
            AccountEvent::Withdrew { amount, .. } => self.balance - amount,
        };
        (vec![event], AccountReply { balance, applied: true, ops: Vec::new() })
    }
}

/// The same account kept in memory only: the same commands, decided and applied the same way,
/// with nothing written. The floor of `bench --scenario durable-ask`, which measures what the
/// journal costs on top.
#[derive(Debug, Default)]
pub struct MemoryAccount(Account);

impl Entity for MemoryAccount {
    type Message = AccountCmd;
    type Reply = AccountReply;

    fn new(_id: &EntityId) -> Self {
        MemoryAccount::default()
    }

    async fn handle(&mut self, _ctx: &mut EntityContext, cmd: AccountCmd) -> AccountReply {
        let (events, reply) = self.0.decide(cmd);
        for e in &events {
            self.0.apply(e);
        }
        reply
    }
}

/// A small entity for benchmarks: it answers with what it got and counts messages.
#[derive(Debug, Default)]
pub struct Echo {
    n: u64,
}

impl Entity for Echo {
    type Message = u64;
    type Reply = u64;

    fn new(_id: &EntityId) -> Self {
        Echo::default()
    }

    async fn handle(&mut self, _ctx: &mut EntityContext, msg: u64) -> u64 {
        self.n += 1;
        msg
    }
}
