//! What `shardline demo --json` writes.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::load::Latency;

#[derive(Debug, Serialize)]
pub struct PhaseReport {
    pub name: String,
    pub acked: u64,
    pub failed: u64,
    pub ops_per_s: f64,
    pub latency_us: Latency,
    pub shards_moved: usize,
    /// -1 when the moved shards were not seen serving again.
    pub rehome_ms: f64,
    pub rehomed: bool,
    /// Why the moved shards were not seen serving again (the monitor ran out of time, say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rehome_error: Option<String>,
    pub errors: BTreeMap<String, u64>,
    pub ledger_checked: bool,
    /// Rolling restart: shards on nodes of the new version at the end of the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_version_shards: Option<usize>,
    /// Rolling restart: whether a node of the old version was given a shard during the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_version_gained: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct InvariantReport {
    pub lost_acked: u64,
    pub double_applied: u64,
    pub ledger_mismatches: u64,
    /// Reads of the recorded history placed in their account's log (see `shardline check`).
    pub reads_checked: u64,
    /// Reads that fit no place in it: stale, or from another owner's history.
    pub stale_reads: u64,
    /// Writes of the history checked against the audits after them.
    pub writes_checked: u64,
    /// What else the history check found: lost, doubled or refused-yet-applied writes, writes in
    /// an order real time rules out.
    pub history_violations: u64,
    /// Times a shard was hosted by two nodes at once, from the nodes' ownership log.
    pub ownership_overlaps: u64,
    pub checked_after: Vec<String>,
    pub note: String,
}

#[derive(Debug, Serialize)]
pub struct NodeReport {
    pub name: String,
    pub shards: usize,
}

#[derive(Debug, Serialize)]
pub struct DemoReport {
    /// The journal's kind: sqlite or postgres.
    pub store: String,
    pub nodes_started: u32,
    pub shards: u32,
    pub entities: u64,
    pub phases: Vec<PhaseReport>,
    /// The steady load run the same way against the same accounts kept in memory, right after
    /// the steady phase.
    pub in_memory: InMemoryReport,
    /// The steady phase's ops/s over the in-memory accounts' (what the journal leaves of the
    /// speed of memory).
    pub durable_ratio: f64,
    pub invariants: InvariantReport,
    pub nodes: Vec<NodeReport>,
}

/// The steady load against in-memory accounts (`memory-account`).
#[derive(Debug, Serialize)]
pub struct InMemoryReport {
    pub acked: u64,
    pub failed: u64,
    pub ops_per_s: f64,
    pub latency_us: Latency,
    pub errors: BTreeMap<String, u64>,
}
