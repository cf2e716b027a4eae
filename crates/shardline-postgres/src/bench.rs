//! What the journal's benchmarks and tests need of the database beside the journal: the raw floor
//! appends are compared with, the server's durability settings, and a clean-up.

use std::time::Duration;

use shardline::journal::JournalError;

use crate::connection::{connect, db};
use crate::sql::to_i64;
use crate::PostgresConfig;

/// The floor the journal benchmark compares appends with: the same rows inserted raw, in
/// transactions of `per_transaction` rows (one multi-row `INSERT` each), into a table of the same
/// shape (no fence, no sequence check) in `config`'s schema. Returns how long the inserts took.
pub async fn floor_insert(
    config: &PostgresConfig,
    rows: &[(String, u64, Vec<u8>)],
    per_transaction: usize,
) -> Result<Duration, JournalError> {
    let client = connect(config).await?;
    client
        .batch_execute(
            "DROP TABLE IF EXISTS shardline_bench_floor;
             CREATE TABLE shardline_bench_floor (persistence_id TEXT NOT NULL, seq BIGINT NOT NULL,
                payload BYTEA NOT NULL, PRIMARY KEY (persistence_id, seq))",
        )
        .await
        .map_err(db)?;
    let start = std::time::Instant::now();
    for chunk in rows.chunks(per_transaction.max(1)) {
        let pids: Vec<&str> = chunk.iter().map(|r| r.0.as_str()).collect();
        let seqs: Vec<i64> = chunk.iter().map(|r| to_i64(r.1, "sequence number")).collect::<Result<_, _>>()?;
        let payloads: Vec<&[u8]> = chunk.iter().map(|r| r.2.as_slice()).collect();
        client
            .execute(
                "INSERT INTO shardline_bench_floor (persistence_id, seq, payload)
                 SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BYTEA[])",
                &[&pids, &seqs, &payloads],
            )
            .await
            .map_err(db)?;
    }
    let took = start.elapsed();
    client.batch_execute("DROP TABLE shardline_bench_floor").await.map_err(db)?;
    Ok(took)
}

/// Drops `config`'s schema and everything in it (benchmarks and tests clean up with it).
pub async fn drop_schema(config: &PostgresConfig) -> Result<(), JournalError> {
    let client = connect(config).await?;
    client.batch_execute(&format!("DROP SCHEMA {} CASCADE", config.schema)).await.map_err(db)
}

/// How the server makes a commit durable, as `fsync=…, synchronous_commit=…` from its own
/// settings: benchmarks print it beside their figures, since a server run with `fsync=off` (as the
/// test drills' own servers are, to spare the disk) commits far faster than one that syncs.
pub async fn durability(config: &PostgresConfig) -> Result<String, JournalError> {
    let client = connect(config).await?;
    let mut settings = Vec::new();
    for name in ["fsync", "synchronous_commit"] {
        let row = client.query_one(&format!("SHOW {name}"), &[]).await.map_err(db)?;
        let value: String = row.try_get(0).map_err(db)?;
        settings.push(format!("{name}={value}"));
    }
    Ok(settings.join(", "))
}
