//! The plans the server picks for the journal's statements as its tables grow.
//!
//! Needs: PostgreSQL at `SHARDLINE_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`, trust authentication), in a schema of its own
//! dropped at the end. A server that cannot be reached fails the test, naming the URL.
//!
//! A prepared statement's generic plan is made for the tables as they were when it was planned.
//! Prepared on a fresh schema, the batched append kept a plan made for empty tables: a sequential
//! scan of every recorded reply on every batch, which grew with the table (the demo on PostgreSQL
//! read 130 million reply rows for 37,000 appends). The journal's sessions price sequential scans
//! out, so that the plan made once reads through the indexes whatever the tables held then; this
//! test holds them to it, and holds the reminder statements to their keys: a change finds its
//! reminder by its primary key (a plan made for a small table read every reminder of the type
//! and filtered them), a due read is a range of the due index, in its order.

use crate::batch::{APPEND, APPEND_MANY};
use crate::connection::connect;
use crate::reminders::{CHANGE_REMINDERS, DUE_REMINDERS, DUE_REMINDERS_AFTER};
use crate::schema::migrate;
use crate::PostgresConfig;

fn url() -> String {
    std::env::var("SHARDLINE_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The argument types of [`APPEND_MANY`], in order.
const ARGS: &str = "TEXT[], BIGINT[], TEXT[], BIGINT[], BIGINT[], BIGINT[], TEXT[], BOOL[], TEXT[], BYTEA[], \
                    BIGINT[], BIGINT[], BIGINT[], BIGINT[], TEXT[], BIGINT[], BYTEA[], \
                    BIGINT[], TEXT[], TEXT[], BIGINT[], BIGINT[], BIGINT[], TEXT[], TEXT[], TEXT[], BIGINT[], \
                    BIGINT[], TEXT[], TEXT[], TEXT[], BIGINT[], BIGINT[]";

/// The argument types of [`APPEND`], in order.
const ONE_ARGS: &str = "TEXT, BIGINT, TEXT, BIGINT, BIGINT, BIGINT, TEXT[], BIGINT[], BYTEA[], TEXT, BOOL, TEXT, \
                        BYTEA, BIGINT, TEXT[], TEXT[], BIGINT[], BIGINT[], TEXT[], TEXT[], TEXT[], BIGINT[], \
                        TEXT[], TEXT[], TEXT[], BIGINT[], BIGINT[]";

/// The argument types of [`CHANGE_REMINDERS`], in order.
const CHANGE_ARGS: &str = "TEXT, BIGINT, BIGINT, BIGINT, TEXT[], TEXT[], BIGINT[], BIGINT[], TEXT[], TEXT[], TEXT[], \
                           BIGINT[], TEXT[], TEXT[], TEXT[], BIGINT[], BIGINT[]";

/// The reminder arrays of one writer's statement: one reminder of entity `e` of each kind
/// (stored, cancelled, moved).
fn reminder_arrays(e: &str) -> String {
    format!(
        "ARRAY['{e}'], ARRAY['set'], ARRAY[5::BIGINT], ARRAY[0::BIGINT], \
         ARRAY['t'], ARRAY['{e}'], ARRAY['gone'], ARRAY[NULL::BIGINT], \
         ARRAY['t'], ARRAY['{e}'], ARRAY['moved'], ARRAY[7::BIGINT], ARRAY[9::BIGINT]"
    )
}

/// [`APPEND`]'s arguments for one event appended to `pid` with a request id and reminders.
fn append_one(pid: &str) -> String {
    format!(
        "'t', 0, '{pid}', 1, 0, 0, ARRAY['ev'], ARRAY[1::BIGINT], ARRAY['\\x00'::BYTEA], 'e', false, 'req-{pid}', \
         '\\x00', 60000, {}",
        reminder_arrays(pid)
    )
}

/// [`CHANGE_REMINDERS`]' arguments: one change of each kind to entity `e`'s reminders.
fn change(e: &str) -> String {
    format!("'t', 0, 1, 0, {}", reminder_arrays(e))
}

/// The scans of journal tables in `plan` that do not go through an index by a key.
fn unkeyed(plan: &[String]) -> Vec<&String> {
    plan.iter()
        .zip(plan.iter().skip(1).map(Some).chain([None]))
        .filter(|(line, _)| line.contains("Scan") && line.contains(" on shardline_"))
        .filter(|(_, next)| {
            !next
                .is_some_and(|n| n.trim_start().starts_with("Index Cond") || n.trim_start().starts_with("Recheck Cond"))
        })
        .map(|(line, _)| line)
        .collect()
}

/// One append of one event to `pid` with a request id, as the writer would send it.
fn one_append(pid: &str) -> String {
    format!(
        "ARRAY['t'], ARRAY[0::BIGINT], ARRAY['{pid}'], ARRAY[1::BIGINT], ARRAY[0::BIGINT], ARRAY[0::BIGINT], \
         ARRAY['e'], ARRAY[false], ARRAY['req-{pid}'], ARRAY['\\x00'::BYTEA], ARRAY[60000::BIGINT], \
         ARRAY[1::BIGINT], ARRAY[1::BIGINT], ARRAY[1::BIGINT], ARRAY['ev'], ARRAY[1::BIGINT], ARRAY['\\x00'::BYTEA], \
         ARRAY[1::BIGINT], ARRAY['{pid}'], ARRAY['set'], ARRAY[5::BIGINT], ARRAY[0::BIGINT], \
         ARRAY[1::BIGINT], ARRAY['t'], ARRAY['{pid}'], ARRAY['gone'], ARRAY[NULL::BIGINT], \
         ARRAY[1::BIGINT], ARRAY['t'], ARRAY['{pid}'], ARRAY['moved'], ARRAY[7::BIGINT], ARRAY[9::BIGINT]"
    )
}

/// The scans of reminders in `plan` not by the columns `key` (the primary key for a change, the
/// due time for a read): through an index by the type alone, they read every reminder of it.
fn not_by(plan: &[String], key: &str) -> Vec<String> {
    plan.iter()
        .zip(plan.iter().skip(1).map(Some).chain([None]))
        .filter(|(line, _)| line.contains("Scan") && line.contains(" on shardline_reminders"))
        .filter(|(_, next)| !next.is_some_and(|n| n.trim_start().starts_with("Index Cond") && n.contains(key)))
        .map(|(line, next)| format!("{line} / {}", next.map_or("", |n| n.as_str())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_statements_read_every_table_through_its_index_once_the_tables_grew() {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let schema = format!("shardline_test_plans_{}_{nanos}", std::process::id());
    let config = PostgresConfig::new(url()).schema(&schema);
    let client = match connect(&config).await {
        Ok(c) => c,
        Err(e) => panic!("this test needs PostgreSQL at {} (set SHARDLINE_TEST_POSTGRES): {e}", url()),
    };
    migrate(&client, &schema).await.expect("migrated");
    let outcome = async {
        client.batch_execute(&format!("PREPARE append_many({ARGS}) AS {APPEND_MANY}")).await?;
        client.batch_execute(&format!("PREPARE append_one({ONE_ARGS}) AS {APPEND}")).await?;
        client.batch_execute(&format!("PREPARE change({CHANGE_ARGS}) AS {CHANGE_REMINDERS}")).await?;
        client.batch_execute(&format!("PREPARE due(TEXT, BIGINT, BIGINT, BIGINT) AS {DUE_REMINDERS}")).await?;
        client
            .batch_execute(&format!(
                "PREPARE due_after(TEXT, BIGINT, BIGINT, TEXT, TEXT, BIGINT, BIGINT) AS {DUE_REMINDERS_AFTER}"
            ))
            .await?;
        // Young tables: a few rows, then more executions than the server plans for their
        // arguments before it may settle on a generic plan.
        client
            .batch_execute(
                "INSERT INTO shardline_fences VALUES ('t', 0, 1, 0);
                 INSERT INTO shardline_replies (persistence_id, request_id, seq, reply)
                    SELECT 'p' || g, 'r' || g, g, '\\x00' FROM generate_series(1, 20) g;
                 INSERT INTO shardline_reminders (type_key, entity_id, name, shard, due_ms, every_ms)
                    SELECT 't', 'p' || g, 'tick', 0, g, 0 FROM generate_series(1, 20) g",
            )
            .await?;
        for i in 0..10 {
            let pid = format!("young-{i}");
            client.batch_execute(&format!("BEGIN; EXECUTE append_many({}); ROLLBACK", one_append(&pid))).await?;
            client.batch_execute(&format!("BEGIN; EXECUTE append_one({}); ROLLBACK", append_one(&pid))).await?;
            client.batch_execute(&format!("BEGIN; EXECUTE change({}); ROLLBACK", change(&pid))).await?;
            client
                .batch_execute("EXECUTE due('t', 0, 100, 10); EXECUTE due_after('t', 0, 3, 'p', 'x', 100, 10)")
                .await?;
        }
        // The table grows past what a scan per batch can afford; no statistics run meanwhile.
        client
            .batch_execute(
                "INSERT INTO shardline_replies (persistence_id, request_id, seq, reply)
                    SELECT 'p' || (g % 5000), 'q' || g, g, '\\x00' FROM generate_series(1, 100000) g;
                 INSERT INTO shardline_reminders (type_key, entity_id, name, shard, due_ms, every_ms)
                    SELECT 't', 'q' || g, 'tick', g % 4, g, 0 FROM generate_series(1, 100000) g",
            )
            .await?;
        let mut plans = Vec::new();
        for explain in [
            format!("EXPLAIN EXECUTE append_many({})", one_append("grown")),
            format!("EXPLAIN EXECUTE append_one({})", append_one("grown")),
            format!("EXPLAIN EXECUTE change({})", change("grown")),
            "EXPLAIN EXECUTE due('t', 0, 100, 10)".to_string(),
            "EXPLAIN EXECUTE due_after('t', 0, 3, 'p', 'x', 100, 10)".to_string(),
        ] {
            let rows = client.simple_query(&explain).await?;
            let plan: Vec<String> = rows
                .iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                    _ => None,
                })
                .collect();
            plans.push(plan);
        }
        Ok::<_, tokio_postgres::Error>(plans)
    }
    .await;
    let _ = client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await;
    let plans = outcome.expect("statements ran");
    let statements = [
        ("the batched append", "entity_id"),
        ("the single append", "entity_id"),
        ("the reminder changes", "entity_id"),
        ("the first due page", "due_ms"),
        ("a later due page", "due_ms"),
    ];
    assert_eq!(plans.len(), statements.len());
    for ((statement, key), plan) in statements.iter().zip(&plans) {
        assert!(!plan.is_empty(), "no plan was returned for {statement}");
        // Every scan of a journal table goes through an index, by the key the statement has.
        let unkeyed = unkeyed(plan);
        assert!(unkeyed.is_empty(), "{statement} reads journal tables without a key: {unkeyed:?}\n{}", plan.join("\n"));
        let not_by = not_by(plan, key);
        assert!(not_by.is_empty(), "{statement} reads reminders not by {key}: {not_by:?}\n{}", plan.join("\n"));
        if *key == "due_ms" {
            // A range of the index, in its order: no sort of every due reminder.
            assert!(!plan.iter().any(|l| l.contains("Sort")), "{statement} sorts:\n{}", plan.join("\n"));
        }
    }
}
