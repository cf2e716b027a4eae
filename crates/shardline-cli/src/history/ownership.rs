//! The ownership log: every node appends `time_ms node type shard epoch start|stop` when it
//! starts or stops hosting a shard (`shardline node --ownership-log`), and no shard may be
//! hosted by two nodes at overlapping times. A node killed with `kill -9` writes no stop: its
//! intervals end at its kill.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One line of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnershipEvent {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u128,
    /// The node, as `name#incarnation` or `name`.
    pub node: String,
    /// The entity type.
    pub type_key: String,
    /// The shard.
    pub shard: String,
    /// Started (true) or stopped hosting.
    pub start: bool,
}

/// A shard hosted by two nodes at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// Entity type and shard.
    pub shard: (String, String),
    /// The node that hosted it first, and until when.
    pub first: (String, u128),
    /// The node that started hosting it before that, and when.
    pub second: (String, u128),
}

impl std::fmt::Display for Overlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} hosted by {} until {} and by {} from {}",
            self.shard, self.first.0, self.first.1, self.second.0, self.second.1
        )
    }
}

/// Why the log cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    /// The file cannot be read.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        error: std::io::Error,
    },
    /// A line is not `time_ms node type shard epoch start|stop`.
    #[error("{path}, line {line}: {text:?} is not `time_ms node type shard epoch start|stop`")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Its number, from 1.
        line: usize,
        /// The line.
        text: String,
    },
}

/// Reads an ownership log.
pub fn read_log(path: &Path) -> Result<Vec<OwnershipEvent>, OwnershipError> {
    let text = std::fs::read_to_string(path).map_err(|error| OwnershipError::Io { path: path.into(), error })?;
    let mut events = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || OwnershipError::Malformed { path: path.into(), line: i + 1, text: line.to_string() };
        let f: Vec<&str> = line.split_whitespace().collect();
        let [t, node, ty, shard, _epoch, what] = f[..] else { return Err(bad()) };
        let start = match what {
            "start" => true,
            "stop" => false,
            _ => return Err(bad()),
        };
        let at_ms = t.parse().map_err(|_| bad())?;
        events.push(OwnershipEvent { at_ms, node: node.into(), type_key: ty.into(), shard: shard.into(), start });
    }
    Ok(events)
}

/// The overlaps in a log. `killed` holds the nodes killed (by name, without `#incarnation`) and
/// when: an interval they never closed ends there; one still open otherwise ends at `end_ms`.
pub fn overlaps(events: &[OwnershipEvent], killed: &[(String, u128)], end_ms: u128) -> Vec<Overlap> {
    type Key = (String, String);
    let mut open: HashMap<Key, HashMap<String, u128>> = HashMap::new();
    let mut intervals: HashMap<Key, Vec<(u128, u128, String)>> = HashMap::new();
    for e in events {
        let key = (e.type_key.clone(), e.shard.clone());
        if e.start {
            open.entry(key).or_default().insert(e.node.clone(), e.at_ms);
        } else if let Some(s) = open.entry(key.clone()).or_default().remove(&e.node) {
            intervals.entry(key).or_default().push((s, e.at_ms, e.node.clone()));
        }
    }
    for (key, nodes) in open {
        for (node, s) in nodes {
            let name = node.split('#').next().unwrap_or("");
            let stop = killed.iter().filter(|(n, at)| n == name && *at >= s).map(|(_, at)| *at).min().unwrap_or(end_ms);
            intervals.entry(key.clone()).or_default().push((s, stop, node));
        }
    }
    let mut found = Vec::new();
    for (key, mut iv) in intervals {
        iv.sort();
        for w in iv.windows(2) {
            if w[0].1 > w[1].0 {
                found.push(Overlap {
                    shard: key.clone(),
                    first: (w[0].2.clone(), w[0].1),
                    second: (w[1].2.clone(), w[1].0),
                });
            }
        }
    }
    found.sort_by(|a, b| a.shard.cmp(&b.shard));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(at_ms: u128, node: &str, shard: &str, start: bool) -> OwnershipEvent {
        OwnershipEvent { at_ms, node: node.into(), type_key: "t".into(), shard: shard.into(), start }
    }

    #[test]
    fn one_host_at_a_time_holds_and_two_at_once_are_found() {
        let ok = [ev(0, "n1#1", "1", true), ev(10, "n1#1", "1", false), ev(10, "n2#1", "1", true)];
        assert!(overlaps(&ok, &[], 100).is_empty());
        let twice = [ev(0, "n1#1", "1", true), ev(5, "n2#1", "1", true), ev(10, "n1#1", "1", false)];
        let found = overlaps(&twice, &[], 100);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].first, ("n1#1".to_string(), 10));
        assert_eq!(found[0].second, ("n2#1".to_string(), 5));
    }

    #[test]
    fn a_killed_node_hosts_until_its_kill() {
        let events = [ev(0, "n1#1", "1", true), ev(50, "n2#1", "1", true)];
        assert!(overlaps(&events, &[("n1".into(), 40)], 100).is_empty());
        assert_eq!(overlaps(&events, &[("n1".into(), 60)], 100).len(), 1, "killed after the new owner started");
        assert_eq!(overlaps(&events, &[], 100).len(), 1, "never killed: still hosting");
    }

    #[test]
    fn a_malformed_line_is_an_error_naming_it() {
        let path = std::env::temp_dir().join(format!("shardline-ownership-{}.log", std::process::id()));
        std::fs::write(&path, "1 n1#1 t 3 1.1 start\nnot a line\n").unwrap();
        let err = read_log(&path).unwrap_err();
        assert!(matches!(err, OwnershipError::Malformed { line: 2, .. }), "{err}");
        std::fs::remove_file(&path).unwrap();
    }
}
