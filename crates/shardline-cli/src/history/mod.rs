//! Histories of the account load and what is checked against them.
//!
//! A load driver records every operation it completes ([`Operation`], one JSON object per line):
//! when it was invoked and when it completed (wall clock, so that histories of several processes
//! on one machine merge), its outcome, and what it read. [`check`] then verifies, per account:
//!
//! - every acknowledged write is applied exactly once, and nothing answered "not applied" (or a
//!   declined withdrawal) is applied;
//! - the history is linearizable: there is one order of the account's writes (the order its
//!   audits list them in) in which every read, every write's reply and the real-time order of
//!   the operations fit (see [`linearizable`]).
//!
//! [`ownership`] checks the log nodes write when they start and stop hosting a shard: no shard
//! on two nodes at once.

pub mod linearizable;
pub mod ownership;
mod record;

pub use linearizable::{check, Findings};
pub use record::{now_ms, now_us, read_histories, HistoryError, HistoryWriter, Kind, Operation, Outcome};
