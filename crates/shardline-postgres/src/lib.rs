//! Shardline's journal on PostgreSQL, and a [`PostgresStore`] for lease membership in the same
//! database (see its module).
//!
//! - **Writer tasks** (two by default), each with a connection of its own; an entity's writes
//!   always go to the same one, so they keep their order. A writer takes every write waiting
//!   and runs its appends in one transaction (group commit): one statement over unnested arrays
//!   when their entities are distinct, else one statement each, pipelined. Anything else (a
//!   claim, a snapshot) runs one savepoint per request, so a refused one rolls back alone.
//! - **A reader task** with a connection of its own pipelines every read waiting, outside any
//!   transaction, through statements prepared once: a recovery's reads do not wait for the
//!   writers' commits. Nothing read needs a
//!   write still queued, since a write is answered only once committed.
//! - **Each statement is planned once, through the indexes** (`enable_seqscan = off`,
//!   `plan_cache_mode = force_generic_plan`): every statement reads by key. A generic plan made
//!   while a fresh schema's tables were empty scanned every recorded reply on every batch, and
//!   planning every execution instead cost a third of the appends' rate.
//! - **Fencing in the database**: an append locks its shard's fence row (`FOR SHARE`) before it
//!   writes, and raising a fence updates that row, so a raise either waits for the append's
//!   commit or the append sees the raised fence. An append from another process racing on the
//!   same sequence numbers hits the primary key and is a `Conflict`.
//! - **Reminders** (`reminders`): a row each, changed a kind at a time over unnested arrays in
//!   one statement that checks the fence (an append's changes in the append's own statement,
//!   written only if the append is); a shard's due ones read a page at a time from an index by
//!   (type, shard, due time, entity, name), ids compared byte by byte as Rust compares them.
//! - **A database that is down** gives `Unavailable` to every request meanwhile; the task connects
//!   again on the next request, so the node serves again without a restart.
//! - **Schema**: the tables live in a schema of their own (default `shardline`), migrated in
//!   versions under an advisory lock, so node processes starting together migrate once.

use std::time::Duration;

use shardline::journal::{JournalError, QueuedJournal};
use tokio::sync::mpsc;

mod batch;
mod bench;
mod connection;
mod coordination;
#[cfg(test)]
mod plans;
mod reader;
mod reminders;
mod schema;
mod sql;
mod tls;
mod writer;

pub use bench::{drop_schema, durability, floor_insert};
use connection::connect;
pub use coordination::PostgresStore;
use reader::reader;
use schema::migrate;
use writer::{route, writer};

/// Settings of a PostgreSQL journal.
#[derive(Clone, Debug)]
pub struct PostgresConfig {
    /// `postgres://user:password@host:port/database` (or a key=value connection string), with
    /// libpq's `sslmode` (`disable`, `prefer` by default, `require`, `verify-ca`, `verify-full`)
    /// and `sslrootcert` (the CA's PEM file, which the verifying modes need).
    pub url: String,
    /// The schema the tables live in (created if absent).
    pub schema: String,
    /// Longest wait to connect, and for one statement (the server cancels it after that).
    pub timeout: Duration,
    /// Connections for writes, each with a writer of its own; an entity's writes always go to
    /// the same one, so they keep their order. With one, a batch waits for the previous one's
    /// commit; with two, one batch forms while the other commits. Reads take one more.
    pub connections: usize,
}

impl PostgresConfig {
    /// Defaults: schema `shardline`, 5 s timeout, 2 connections.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresConfig { url: url.into(), schema: "shardline".into(), timeout: Duration::from_secs(5), connections: 2 }
    }

    /// The tables' schema.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
}

/// Connects PostgreSQL journals.
pub struct PostgresJournal;

impl PostgresJournal {
    /// Connects, creates the schema, migrates it and starts the journal's writer task. An
    /// unreachable database is `Unavailable`.
    pub async fn connect(config: PostgresConfig) -> Result<QueuedJournal, JournalError> {
        if config.schema.is_empty() || !config.schema.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(JournalError::Failed(format!(
                "schema name {:?}: letters, digits and underscores only",
                config.schema
            )));
        }
        let client = connect(&config).await?;
        migrate(&client, &config.schema).await?;
        let (journal, rx) = QueuedJournal::new(4096);
        let mut writers = Vec::new();
        let mut first = Some(client);
        for _ in 0..config.connections.max(1) {
            let (tx, rx) = mpsc::channel(4096);
            tokio::spawn(writer(config.clone(), first.take(), rx));
            writers.push(tx);
        }
        let (to_reader, reads) = mpsc::channel(4096);
        tokio::spawn(reader(config.clone(), reads));
        tokio::spawn(route(rx, to_reader, writers));
        Ok(journal)
    }
}
