//! The ownership checker of the multi-process tests: every node appends
//! `time_ms node type shard epoch start|stop` to one log, and no two nodes may have hosted the
//! same shard at overlapping times.

use std::collections::HashMap;
use std::path::Path;

/// Milliseconds since the Unix epoch (the log's clock).
pub fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

/// (from, to, node) of one node hosting one shard.
type Interval = (u128, u128, String);

/// One line of the ownership log: `(time, node, (type, shard), started)`.
type OwnershipEvent = (u128, String, (String, String), bool);

/// Reads the ownership log every node appends to.
pub fn ownership_events(log: &Path) -> Vec<OwnershipEvent> {
    let text = std::fs::read_to_string(log).expect("ownership log exists");
    text.lines()
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [t, node, ty, shard, _epoch, what] = f[..] else { panic!("bad ownership line: {line}") };
            let start = match what {
                "start" => true,
                "stop" => false,
                other => panic!("bad ownership event {other}"),
            };
            (t.parse().expect("a time in ms"), node.to_string(), (ty.to_string(), shard.to_string()), start)
        })
        .collect()
}

/// Proves no two nodes hosted the same shard at overlapping times. `killed` closes the
/// intervals of nodes (by name prefix `name#`) killed at that time.
pub fn check_ownership(log: &Path, killed: &[(String, u128)]) {
    // (type, shard) -> node -> intervals
    let mut open: HashMap<(String, String), HashMap<String, u128>> = HashMap::new();
    let mut intervals: HashMap<(String, String), Vec<Interval>> = HashMap::new();
    for (t, node, key, start) in ownership_events(log) {
        if start {
            open.entry(key).or_default().insert(node, t);
        } else if let Some(s) = open.entry(key.clone()).or_default().remove(&node) {
            intervals.entry(key).or_default().push((s, t, node));
        }
    }
    let end = now_ms();
    for (key, nodes) in open {
        for (node, s) in nodes {
            let name = node.split('#').next().unwrap_or("");
            let stop = killed.iter().filter(|(n, at)| n == name && *at >= s).map(|(_, at)| *at).min().unwrap_or(end);
            intervals.entry(key.clone()).or_default().push((s, stop, node));
        }
    }
    for (key, mut iv) in intervals {
        iv.sort();
        for w in iv.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "{key:?} hosted by {} until {} and by {} from {}",
                w[0].2,
                w[0].1,
                w[1].2,
                w[1].0
            );
        }
    }
}
