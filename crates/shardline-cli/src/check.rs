//! `shardline check`: a recorded history and an ownership log, checked.

use std::path::{Path, PathBuf};

use serde::Serialize;
use shardline_cli::history::{self, ownership, Findings};

/// What `shardline check` prints.
#[derive(Serialize)]
struct Report {
    operations: usize,
    #[serde(flatten)]
    findings: Findings,
    ownership_overlaps: Option<usize>,
    overlaps: Vec<String>,
}

/// Checks the histories (and the ownership log); prints the report as JSON. Exit code: 0 when
/// everything holds, 1 on a violation, 2 when a file cannot be read.
pub fn run(histories: &[PathBuf], ownership_log: Option<&Path>, killed: &[(String, u128)]) -> i32 {
    let ops = match history::read_histories(histories) {
        Ok(ops) => ops,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let findings = history::check(&ops);
    let overlaps = match ownership_log.map(ownership::read_log).transpose() {
        Ok(events) => events.map(|ev| ownership::overlaps(&ev, killed, history::now_ms())),
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let holds = findings.holds() && overlaps.as_ref().is_none_or(Vec::is_empty);
    let report = Report {
        operations: ops.len(),
        findings,
        ownership_overlaps: overlaps.as_ref().map(Vec::len),
        overlaps: overlaps.unwrap_or_default().iter().map(ToString::to_string).collect(),
    };
    match serde_json::to_string_pretty(&report) {
        Ok(json) => println!("{json}"),
        Err(e) => {
            eprintln!("error: cannot encode the report: {e}");
            return 2;
        }
    }
    if holds {
        0
    } else {
        1
    }
}
