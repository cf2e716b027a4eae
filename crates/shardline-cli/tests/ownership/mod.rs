//! The ownership checks of the multi-process tests, on the checker `shardline check` uses: every
//! node appends `time_ms node type shard epoch start|stop` to one log, and no two nodes may have
//! hosted the same shard at overlapping times.

use std::path::Path;

use shardline_cli::history::ownership;

/// Milliseconds since the Unix epoch (the log's clock).
pub fn now_ms() -> u128 {
    shardline_cli::history::now_ms()
}

/// One line of the ownership log: `(time, node, (type, shard), started)`.
type OwnershipEvent = (u128, String, (String, String), bool);

/// Reads the ownership log every node appends to.
pub fn ownership_events(log: &Path) -> Vec<OwnershipEvent> {
    ownership::read_log(log)
        .expect("a readable ownership log")
        .into_iter()
        .map(|e| (e.at_ms, e.node, (e.type_key, e.shard), e.start))
        .collect()
}

/// Proves no two nodes hosted the same shard at overlapping times. `killed` closes the
/// intervals of nodes (by name prefix `name#`) killed at that time.
pub fn check_ownership(log: &Path, killed: &[(String, u128)]) {
    let events = ownership::read_log(log).expect("a readable ownership log");
    let found = ownership::overlaps(&events, killed, now_ms());
    assert!(found.is_empty(), "{}", found.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"));
}
