//! The journal file's schema: one migration per version, applied in order, and a file of a newer
//! version refused instead of misread.

use rusqlite::Connection;

/// The schema, one migration per version, applied in order.
const MIGRATIONS: &[&str] = &[
    // 1: events, snapshots, fences, recorded replies, remembered entities.
    "CREATE TABLE shardline_fences (
        type_key TEXT NOT NULL, shard INTEGER NOT NULL, term INTEGER NOT NULL, seq INTEGER NOT NULL,
        PRIMARY KEY (type_key, shard));
     CREATE TABLE shardline_events (
        persistence_id TEXT NOT NULL, seq INTEGER NOT NULL, type_name TEXT NOT NULL,
        schema_version INTEGER NOT NULL, payload BLOB NOT NULL, PRIMARY KEY (persistence_id, seq));
     CREATE TABLE shardline_snapshots (
        persistence_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, schema_version INTEGER NOT NULL,
        payload BLOB NOT NULL);
     CREATE TABLE shardline_replies (
        persistence_id TEXT NOT NULL, request_id TEXT NOT NULL, seq INTEGER NOT NULL, reply BLOB NOT NULL,
        PRIMARY KEY (persistence_id, request_id));
     CREATE TABLE shardline_remembered (
        type_key TEXT NOT NULL, shard INTEGER NOT NULL, entity_id TEXT NOT NULL,
        PRIMARY KEY (type_key, shard, entity_id));",
    // 2: the reply window pruned through an index (it read every reply of the entity on each
    // append), and events stored in their primary key's B-tree (one B-tree per insert, not two).
    "CREATE INDEX shardline_replies_by_seq ON shardline_replies (persistence_id, seq);
     CREATE TABLE shardline_events_v2 (
        persistence_id TEXT NOT NULL, seq INTEGER NOT NULL, type_name TEXT NOT NULL,
        schema_version INTEGER NOT NULL, payload BLOB NOT NULL, PRIMARY KEY (persistence_id, seq))
        WITHOUT ROWID;
     INSERT INTO shardline_events_v2 (persistence_id, seq, type_name, schema_version, payload)
        SELECT persistence_id, seq, type_name, schema_version, payload FROM shardline_events;
     DROP TABLE shardline_events;
     ALTER TABLE shardline_events_v2 RENAME TO shardline_events;",
    // 3: replies kept for a time rather than a count (milliseconds since the Unix epoch by the
    // writer's clock); those recorded before the upgrade count from the upgrade.
    "ALTER TABLE shardline_replies ADD COLUMN recorded_at INTEGER NOT NULL DEFAULT 0;
     UPDATE shardline_replies SET recorded_at = CAST(strftime('%s', 'now') AS INTEGER) * 1000;
     CREATE INDEX shardline_replies_by_time ON shardline_replies (persistence_id, recorded_at);",
    // 4: the newest replies read through the index by time (with the row id, in the order they
    // were recorded) rather than one by sequence number: one B-tree fewer written per reply.
    "DROP INDEX shardline_replies_by_seq;",
    // 5: durable reminders, one per (entity type, entity, name) with the shard that owns the
    // entity, and the order a shard's owner reads them in (due time, entity, name): a page of the
    // reminders due soon is a range of that index, never a scan of every pending one.
    "CREATE TABLE shardline_reminders (
        type_key TEXT NOT NULL, entity_id TEXT NOT NULL, name TEXT NOT NULL, shard INTEGER NOT NULL,
        due_ms INTEGER NOT NULL, every_ms INTEGER NOT NULL, PRIMARY KEY (type_key, entity_id, name))
        WITHOUT ROWID;
     CREATE INDEX shardline_reminders_due ON shardline_reminders (type_key, shard, due_ms, entity_id, name);",
];

/// A file of a newer schema version than this build knows.
fn newer(version: i64, known: i64) -> rusqlite::Error {
    let msg = format!("schema version {version} is newer than this build knows ({known})");
    rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR), Some(msg))
}

pub(crate) fn migrate(conn: &mut Connection) -> Result<(), rusqlite::Error> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute("CREATE TABLE IF NOT EXISTS shardline_schema (version INTEGER NOT NULL)", [])?;
    let version: Option<i64> = tx.query_row("SELECT MAX(version) FROM shardline_schema", [], |r| r.get(0))?;
    let version = version.unwrap_or(0);
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(newer(version, known));
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(m)?;
        tx.execute("INSERT INTO shardline_schema (version) VALUES (?1)", [i as i64 + 1])?;
    }
    tx.commit()
}
