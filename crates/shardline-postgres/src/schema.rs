//! The journal's tables, one migration per version, applied in order under an advisory lock.

use tokio_postgres::Client;
use tracing::info;

use shardline::journal::JournalError;

use crate::connection::db;

/// The schema, one migration per version, applied in order.
const MIGRATIONS: &[&str] = &[
    // 1: events, snapshots, fences, recorded replies, remembered entities.
    "CREATE TABLE shardline_fences (
        type_key TEXT NOT NULL, shard BIGINT NOT NULL, term BIGINT NOT NULL, seq BIGINT NOT NULL,
        PRIMARY KEY (type_key, shard));
     CREATE TABLE shardline_events (
        persistence_id TEXT NOT NULL, seq BIGINT NOT NULL, type_name TEXT NOT NULL,
        schema_version BIGINT NOT NULL, payload BYTEA NOT NULL, PRIMARY KEY (persistence_id, seq));
     CREATE TABLE shardline_snapshots (
        persistence_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, schema_version BIGINT NOT NULL,
        payload BYTEA NOT NULL);
     CREATE TABLE shardline_replies (
        persistence_id TEXT NOT NULL, request_id TEXT NOT NULL, seq BIGINT NOT NULL, reply BYTEA NOT NULL,
        recorded BIGSERIAL, PRIMARY KEY (persistence_id, request_id));
     CREATE TABLE shardline_remembered (
        type_key TEXT NOT NULL, shard BIGINT NOT NULL, entity_id TEXT NOT NULL,
        PRIMARY KEY (type_key, shard, entity_id));",
    // 2: the reply window pruned through an index, newest first (it read every reply of the
    // entity on each append).
    "CREATE INDEX shardline_replies_by_seq ON shardline_replies (persistence_id, seq, recorded)
        INCLUDE (request_id);",
    // 3: replies kept for a time rather than a count (milliseconds since the Unix epoch by the
    // server's clock); those recorded before the upgrade count from the upgrade.
    "ALTER TABLE shardline_replies
        ADD COLUMN recorded_at BIGINT NOT NULL DEFAULT (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT;
     CREATE INDEX shardline_replies_by_time ON shardline_replies (persistence_id, recorded_at);",
    // 4: durable reminders, one per (entity type, entity, name) with the shard that owns the
    // entity, and the order a shard's owner reads them in (due time, entity, name): a page of the
    // reminders due soon is a range of that index, never a scan of every pending one. Entity ids
    // and names compare byte by byte (`"C"`), as Rust orders strings, so that the database's order
    // and a page's position (`(due_ms, entity_id, name) > (...)`) are the journal's.
    "CREATE TABLE shardline_reminders (
        type_key TEXT NOT NULL, entity_id TEXT COLLATE \"C\" NOT NULL, name TEXT COLLATE \"C\" NOT NULL,
        shard BIGINT NOT NULL, due_ms BIGINT NOT NULL, every_ms BIGINT NOT NULL,
        PRIMARY KEY (type_key, entity_id, name));
     CREATE INDEX shardline_reminders_due ON shardline_reminders (type_key, shard, due_ms, entity_id, name);",
];

pub(crate) async fn migrate(client: &Client, schema: &str) -> Result<(), JournalError> {
    client.batch_execute("BEGIN").await.map_err(db)?;
    let result = async {
        // One migrator at a time, whichever node process starts first.
        client.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&format!("shardline-migrate-{schema}")]).await?;
        client.batch_execute("CREATE TABLE IF NOT EXISTS shardline_schema (version BIGINT NOT NULL)").await?;
        let row = client.query_one("SELECT COALESCE(MAX(version), 0) FROM shardline_schema", &[]).await?;
        row.try_get::<_, i64>(0)
    }
    .await;
    let version = match result {
        Ok(v) => v,
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(db(e));
        }
    };
    let known = MIGRATIONS.len() as i64;
    if version > known {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(JournalError::Failed(format!(
            "schema {schema} is at version {version}, newer than this build knows ({known})"
        )));
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let applied = async {
            client.batch_execute(m).await?;
            client.execute("INSERT INTO shardline_schema (version) VALUES ($1)", &[&(i as i64 + 1)]).await
        }
        .await;
        if let Err(e) = applied {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(db(e));
        }
        info!(schema, version = i + 1, "journal schema migrated");
    }
    client.batch_execute("COMMIT").await.map_err(db)
}
