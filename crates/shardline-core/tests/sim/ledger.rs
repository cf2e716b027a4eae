//! What the checker knows about every application message: sent, excused (dropped by a fault
//! or refused with an error to its sender), processed — and the invariants over them.

use std::collections::HashMap;

use shardline_core::NodeId;

/// An application message in the simulation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserMsg {
    pub id: usize,
    pub sender: (NodeId, u32),
    pub entity: u32,
    pub seq: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Pending,
    Excused,
    Processed,
}

#[derive(Default)]
pub struct Ledger {
    status: Vec<Status>,
    last_seq: HashMap<((NodeId, u32), u32), u64>,
    pub violations: Vec<String>,
    pub processed: usize,
    pub excused: usize,
}

impl Ledger {
    pub fn sent(&mut self) -> usize {
        self.status.push(Status::Pending);
        self.status.len() - 1
    }

    /// Lost to a fault the sender can see (crash, broken link), or refused with an error.
    pub fn excuse(&mut self, m: &UserMsg, now: u64) {
        match self.status[m.id] {
            Status::Pending => {
                self.status[m.id] = Status::Excused;
                self.excused += 1;
            }
            Status::Excused => {}
            Status::Processed => self.violations.push(format!("t={now} harness: excused processed message {}", m.id)),
        }
    }

    /// I3 (at most once) and I4's order (per sender and entity).
    pub fn processed(&mut self, m: &UserMsg, node: &NodeId, now: u64) {
        match self.status[m.id] {
            Status::Processed => {
                self.violations.push(format!("t={now} I3: message {} processed twice (again on {node})", m.id))
            }
            Status::Excused => {
                self.violations.push(format!("t={now} harness: excused message {} processed on {node}", m.id))
            }
            Status::Pending => {}
        }
        self.status[m.id] = Status::Processed;
        self.processed += 1;
        let key = (m.sender.clone(), m.entity);
        if let Some(&last) = self.last_seq.get(&key) {
            if m.seq <= last {
                self.violations.push(format!(
                    "t={now} I4: entity e{} got seq {} from {}/{} after seq {last}",
                    m.entity, m.seq, m.sender.0, m.sender.1
                ));
            }
        }
        self.last_seq.insert(key, m.seq);
    }

    /// I4's delivery: after the quiet period nothing may be pending.
    pub fn check_all_settled(&mut self) {
        let lost: Vec<usize> =
            self.status.iter().enumerate().filter(|(_, s)| **s == Status::Pending).map(|(i, _)| i).collect();
        if !lost.is_empty() {
            let some: Vec<String> = lost.iter().take(5).map(|i| i.to_string()).collect();
            self.violations.push(format!("I4: {} messages never delivered (e.g. {})", lost.len(), some.join(", ")));
        }
    }

    pub fn total(&self) -> usize {
        self.status.len()
    }
}
