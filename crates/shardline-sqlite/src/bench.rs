//! What the journal's benchmark needs beside the journal: the raw floor appends are compared with.

use std::path::Path;
use std::time::Duration;

use rusqlite::{params, Connection};
use shardline::journal::JournalError;

use crate::connection::{db, failed, unavailable};
use crate::sql::to_i64;
use crate::Synchronous;

/// The floor the journal benchmark compares appends with: the same rows inserted raw, in
/// transactions of `per_transaction` rows, into a table of the same shape (no fence, no sequence
/// check), in a file of its own next to `path`, synced as the journal is (`synchronous`).
/// Returns how long the inserts took.
pub fn floor_insert(
    path: &Path,
    rows: &[(String, u64, Vec<u8>)],
    per_transaction: usize,
    synchronous: Synchronous,
) -> Result<Duration, JournalError> {
    let file = path.with_extension("floor.db");
    let _ = std::fs::remove_file(&file);
    let mut conn = Connection::open(&file).map_err(|e| unavailable(&file, e))?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(|e| failed(&file, e))?;
    conn.pragma_update(None, "synchronous", synchronous.as_str()).map_err(|e| failed(&file, e))?;
    conn.execute_batch(
        "CREATE TABLE floor (persistence_id TEXT NOT NULL, seq INTEGER NOT NULL, payload BLOB NOT NULL,
            PRIMARY KEY (persistence_id, seq)) WITHOUT ROWID",
    )
    .map_err(|e| failed(&file, e))?;
    let start = std::time::Instant::now();
    for chunk in rows.chunks(per_transaction.max(1)) {
        let tx = conn.transaction().map_err(db)?;
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO floor (persistence_id, seq, payload) VALUES (?1, ?2, ?3)")
                .map_err(db)?;
            for (pid, seq, payload) in chunk {
                insert.execute(params![pid, to_i64(*seq, "sequence number")?, payload]).map_err(db)?;
            }
        }
        tx.commit().map_err(db)?;
    }
    let took = start.elapsed();
    drop(conn);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(took)
}
