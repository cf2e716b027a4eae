//! One line of a history, and the file it goes to.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What an operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Adds `amount`.
    Deposit,
    /// Takes `amount` out, or is declined when the balance is short.
    Withdraw,
    /// Reads the balance.
    Balance,
    /// Reads the balance and every applied operation, in order.
    Audit,
}

/// How it ended, as its caller saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Answered.
    Ok,
    /// Failed, and was not processed.
    NotApplied,
    /// Failed, and may have been processed.
    Unknown,
}

/// One completed operation of a history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    /// The account's id.
    pub account: String,
    /// What it did.
    pub kind: Kind,
    /// The operation's id (unique in a run; 0 for reads).
    pub op: u64,
    /// The amount of a deposit or withdrawal (0 for reads).
    pub amount: i64,
    /// The request id it was sent with, if any.
    pub request_id: Option<String>,
    /// When it was first sent, in microseconds since the Unix epoch.
    pub invoke_us: u64,
    /// When its last answer (or its last failure) came, in microseconds since the Unix epoch.
    pub complete_us: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// For an answered write: whether it was applied (a withdrawal may be declined).
    pub applied: Option<bool>,
    /// For an answered operation: the balance it answered with.
    pub balance: Option<i64>,
    /// For an answered audit: the operations applied, in order.
    pub ops: Option<Vec<u64>>,
}

/// The wall clock in microseconds since the Unix epoch: what histories of several processes share.
pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros().min(u128::from(u64::MAX)) as u64)
}

/// The wall clock in milliseconds since the Unix epoch: the ownership log's clock.
pub fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// Why a history cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The file cannot be created, written or read.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        error: std::io::Error,
    },
    /// A line is not an operation.
    #[error("{path}, line {line}: {error}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Its line number, from 1.
        line: usize,
        /// What is wrong with it.
        error: serde_json::Error,
    },
}

/// Appends operations to a history file, one JSON object per line. Shared by a driver's callers.
pub struct HistoryWriter {
    path: PathBuf,
    out: Mutex<Writing>,
}

struct Writing {
    file: std::io::BufWriter<std::fs::File>,
    /// The first write that failed: the history is incomplete, and `flush` says so.
    failed: Option<String>,
}

impl HistoryWriter {
    /// Creates (or empties) the file.
    pub fn create(path: impl Into<PathBuf>) -> Result<Self, HistoryError> {
        let path = path.into();
        let file = std::fs::File::create(&path).map_err(|error| HistoryError::Io { path: path.clone(), error })?;
        Ok(HistoryWriter { path, out: Mutex::new(Writing { file: std::io::BufWriter::new(file), failed: None }) })
    }

    /// Records one operation. A failure is also kept for [`flush`](Self::flush) to report, so
    /// that callers on a hot path may go on and still never check an incomplete history.
    pub fn record(&self, op: &Operation) -> Result<(), HistoryError> {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let written = serde_json::to_writer(&mut out.file, op)
            .map_err(std::io::Error::from)
            .and_then(|()| out.file.write_all(b"\n"));
        written.map_err(|error| {
            out.failed.get_or_insert_with(|| error.to_string());
            HistoryError::Io { path: self.path.clone(), error }
        })
    }

    /// Writes what is buffered to the file; an error if anything recorded so far was lost.
    pub fn flush(&self) -> Result<(), HistoryError> {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let flushed = out.file.flush();
        if let Some(first) = &out.failed {
            let error = std::io::Error::other(format!("an operation could not be recorded: {first}"));
            return Err(HistoryError::Io { path: self.path.clone(), error });
        }
        flushed.map_err(|error| HistoryError::Io { path: self.path.clone(), error })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Reads the operations of several history files (drivers of one run).
pub fn read_histories(paths: &[PathBuf]) -> Result<Vec<Operation>, HistoryError> {
    let mut ops = Vec::new();
    for path in paths {
        let file = std::fs::File::open(path).map_err(|error| HistoryError::Io { path: path.clone(), error })?;
        for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|error| HistoryError::Io { path: path.clone(), error })?;
            if line.trim().is_empty() {
                continue;
            }
            let op = serde_json::from_str(&line).map_err(|error| HistoryError::Malformed {
                path: path.clone(),
                line: i + 1,
                error,
            })?;
            ops.push(op);
        }
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_reads_back_and_a_bad_line_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("shardline-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.jsonl");
        let w = HistoryWriter::create(&path).unwrap();
        let op = Operation {
            account: "acct-1".into(),
            kind: Kind::Deposit,
            op: 7,
            amount: 5,
            request_id: Some("r-7".into()),
            invoke_us: 1,
            complete_us: 2,
            outcome: Outcome::Ok,
            applied: Some(true),
            balance: Some(5),
            ops: None,
        };
        w.record(&op).unwrap();
        w.flush().unwrap();
        assert_eq!(read_histories(std::slice::from_ref(&path)).unwrap(), vec![op]);
        std::fs::write(&path, "{\"account\": 3}\n").unwrap();
        let err = read_histories(std::slice::from_ref(&path)).unwrap_err();
        assert!(matches!(err, HistoryError::Malformed { line: 1, .. }), "{err}");
        let missing = read_histories(&[dir.join("missing")]).unwrap_err();
        assert!(matches!(missing, HistoryError::Io { .. }), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
