//! Connections to the journal's database: TLS as the URL asks, the session pointed at the schema,
//! and what a database error means to a caller.

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};
use tracing::warn;

use shardline::journal::JournalError;

use crate::{tls, PostgresConfig};

/// Drives a connection until it closes.
async fn drive(connection: impl std::future::Future<Output = Result<(), tokio_postgres::Error>>) {
    if let Err(e) = connection.await {
        warn!(error = %e, "database connection closed");
    }
}

/// Connects and points the session at the schema.
pub(crate) async fn connect(config: &PostgresConfig) -> Result<Client, JournalError> {
    let (pg, tls) = tls::settings(&config.url)?;
    // Each kind of connection is a type of its own: driven by a task either way.
    let connecting = async {
        match tls {
            None => pg.connect(NoTls).await.map(|(client, connection)| {
                tokio::spawn(drive(connection));
                client
            }),
            Some(tls) => {
                pg.connect(tokio_postgres_rustls::MakeRustlsConnect::new(tls)).await.map(|(client, connection)| {
                    tokio::spawn(drive(connection));
                    client
                })
            }
        }
    };
    let client = tokio::time::timeout(config.timeout, connecting)
        .await
        .map_err(|_| {
            JournalError::Unavailable(format!("connecting to the database timed out after {:?}", config.timeout))
        })?
        .map_err(db)?;
    let schema = &config.schema;
    let statement_ms = config.timeout.as_millis();
    // `CREATE SCHEMA IF NOT EXISTS` is not safe against itself: node processes that start
    // together on a fresh database raced, and all but one failed on the catalog's unique index.
    // One at a time, under a lock held until the commit.
    // Plans: every statement of the journal reads by key, so a sequential scan of a journal table
    // is never the plan it wants, whatever the statistics said when a statement was prepared. A
    // generic plan made while a fresh schema's tables were empty scanned every recorded reply on
    // every batch; planning every execution for its arguments instead cost a third of the
    // appends' rate (the batched append is a large statement). With sequential scans priced out
    // (`enable_seqscan = off` only prices them, so a query with no index to use still runs), the
    // generic plan is the one wanted, made once per statement (the `plans` test).
    client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtext('shardline-schema-{schema}'));
             CREATE SCHEMA IF NOT EXISTS {schema}; COMMIT; SET search_path TO {schema};
             SET statement_timeout = {statement_ms}; SET idle_in_transaction_session_timeout = {statement_ms};
             SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan"
        ))
        .await
        .map_err(db)?;
    Ok(client)
}

/// Maps a database error: a lost connection or an unreachable server is `Unavailable`; a
/// duplicate key (another process appended the same sequence numbers) is left to the caller.
pub(crate) fn db(e: tokio_postgres::Error) -> JournalError {
    // The server's own message, not just "db error"; otherwise the causes too (a TLS handshake
    // says why it failed: a certificate of another name, of another CA).
    let text = e.as_db_error().map_or_else(
        || {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text = format!("{text}: {c}");
                cause = c.source();
            }
            text
        },
        |d| d.to_string(),
    );
    match e.code() {
        None => JournalError::Unavailable(text),
        Some(c) if *c == SqlState::ADMIN_SHUTDOWN || *c == SqlState::CANNOT_CONNECT_NOW => {
            JournalError::Unavailable(text)
        }
        Some(_) => JournalError::Failed(text),
    }
}
