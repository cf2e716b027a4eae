//! The demo's entity: a bank account that remembers which operations it applied, so the demo
//! driver can audit it against its own ledger (lost, doubled, or wrong).

use serde::{Deserialize, Serialize};
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

/// A bank account.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Account {
    balance: i64,
    ops: Vec<u64>,
}

impl Entity for Account {
    type Message = AccountCmd;
    type Reply = AccountReply;

    fn new(_id: &EntityId) -> Self {
        Account::default()
    }

    async fn handle(&mut self, _ctx: &mut EntityContext, msg: AccountCmd) -> AccountReply {
        let applied = match msg {
            AccountCmd::Deposit { op, amount } => {
                self.balance += amount;
                self.ops.push(op);
                true
            }
            AccountCmd::Withdraw { op, amount } if amount <= self.balance => {
                self.balance -= amount;
                self.ops.push(op);
                true
            }
            AccountCmd::Withdraw { .. } => false,
            AccountCmd::Balance => false,
            AccountCmd::Audit => return AccountReply { balance: self.balance, applied: false, ops: self.ops.clone() },
        };
        AccountReply { balance: self.balance, applied, ops: Vec::new() }
    }

    fn hand_over(&self) -> Option<Vec<u8>> {
        postcard::to_allocvec(self).ok()
    }

    fn take_over(_id: &EntityId, data: &[u8]) -> Option<Self> {
        postcard::from_bytes(data).ok()
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
