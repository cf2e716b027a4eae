//! The journal's statements, one function per request kind, and the checked conversions between
//! the journal's numbers and the database's.

use shardline::journal::{AppendRequest, EventRecord, Fence, JournalError, RecordedReply, Snapshot, StoredEvent};
use shardline_core::{Epoch, ShardId};
use tokio_postgres::error::SqlState;
use tokio_postgres::{GenericClient, Transaction};

use crate::connection::db;
use crate::reminders;

/// The statements of the reads, prepared once by the reader (and run as text by a write that
/// reads in its savepoint).
pub(crate) const LAST_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM shardline_events WHERE persistence_id = $1";
pub(crate) const READ: &str = "SELECT seq, type_name, schema_version, payload FROM shardline_events
     WHERE persistence_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3";
pub(crate) const LOAD_SNAPSHOT: &str =
    "SELECT seq, schema_version, payload FROM shardline_snapshots WHERE persistence_id = $1";
pub(crate) const RECORDED_REPLY: &str =
    "SELECT reply FROM shardline_replies WHERE persistence_id = $1 AND request_id = $2";
pub(crate) const RECORDED_REPLIES: &str = "SELECT request_id, reply FROM shardline_replies WHERE persistence_id = $1
     ORDER BY seq DESC, recorded DESC LIMIT $2";
pub(crate) const REMEMBERED: &str =
    "SELECT entity_id FROM shardline_remembered WHERE type_key = $1 AND shard = $2 ORDER BY entity_id";
pub(crate) const HIGHEST_TERM: &str = "SELECT MAX(term) FROM shardline_fences";

/// A statement, as text or prepared.
pub(crate) trait Query: tokio_postgres::ToStatement + Sync + Send {}
impl<T: tokio_postgres::ToStatement + Sync + Send + ?Sized> Query for T {}

pub(crate) fn to_i64(v: u64, what: &str) -> Result<i64, JournalError> {
    i64::try_from(v).map_err(|_| JournalError::Failed(format!("{what} {v} does not fit the database")))
}

/// A column of a row this crate's own query returned; a type that does not match the schema is
/// an error, not a panic.
pub(crate) fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    i: usize,
) -> Result<T, JournalError> {
    row.try_get(i).map_err(|e| JournalError::Failed(format!("column {i} does not match the schema: {e}")))
}

pub(crate) fn to_u64(v: i64, pid: &str, seq: u64, what: &str) -> Result<u64, JournalError> {
    u64::try_from(v).map_err(|_| JournalError::Corrupt {
        persistence_id: pid.to_string(),
        seq,
        reason: format!("{what} is negative ({v})"),
    })
}

pub(crate) fn to_u32(v: i64, pid: &str, seq: u64, what: &str) -> Result<u32, JournalError> {
    u32::try_from(v).map_err(|_| JournalError::Corrupt {
        persistence_id: pid.to_string(),
        seq,
        reason: format!("{what} {v} is out of range"),
    })
}

/// Reads the stored fence; `lock` takes a share lock on its row until the transaction ends.
pub(crate) async fn stored_fence(
    tx: &Transaction<'_>,
    type_key: &str,
    shard: ShardId,
    lock: bool,
) -> Result<Option<Epoch>, JournalError> {
    let sql = if lock {
        "SELECT term, seq FROM shardline_fences WHERE type_key = $1 AND shard = $2 FOR SHARE"
    } else {
        "SELECT term, seq FROM shardline_fences WHERE type_key = $1 AND shard = $2"
    };
    let row = tx.query_opt(sql, &[&type_key, &i64::from(shard.0)]).await.map_err(db)?;
    row.map(|r| {
        let what = format!("fence of {type_key} shard {}", shard.0);
        Ok(Epoch { term: to_u64(col(&r, 0)?, &what, 0, "term")?, seq: to_u64(col(&r, 1)?, &what, 0, "seq")? })
    })
    .transpose()
}

pub(crate) async fn check_fence(tx: &Transaction<'_>, f: &Fence) -> Result<(), JournalError> {
    f.admitted_by(stored_fence(tx, &f.type_key, f.shard, true).await?)
}

pub(crate) async fn raise_fence(tx: &Transaction<'_>, f: Fence) -> Result<Epoch, JournalError> {
    let (term, seq) = (to_i64(f.epoch.term, "term")?, to_i64(f.epoch.seq, "epoch")?);
    tx.execute(
        "INSERT INTO shardline_fences (type_key, shard, term, seq) VALUES ($1, $2, $3, $4)
         ON CONFLICT (type_key, shard) DO UPDATE SET term = EXCLUDED.term, seq = EXCLUDED.seq
         WHERE (EXCLUDED.term, EXCLUDED.seq) > (shardline_fences.term, shardline_fences.seq)",
        &[&f.type_key, &i64::from(f.shard.0), &term, &seq],
    )
    .await
    .map_err(db)?;
    stored_fence(tx, &f.type_key, f.shard, false)
        .await?
        .ok_or_else(|| JournalError::Failed(format!("the fence of {} shard {} was not stored", f.type_key, f.shard.0)))
}

pub(crate) async fn last_seq(
    tx: &impl GenericClient,
    q: &(impl Query + ?Sized),
    pid: &str,
) -> Result<u64, JournalError> {
    let row = tx.query_one(q, &[&pid]).await.map_err(db)?;
    to_u64(col(&row, 0)?, pid, 0, "last sequence number")
}

/// An append in the writer's savepoint, a statement per step; `change` is
/// [`CHANGE_REMINDERS`](crate::reminders::CHANGE_REMINDERS), for its reminder changes.
pub(crate) async fn append(
    tx: &Transaction<'_>,
    change: &(impl Query + ?Sized),
    req: AppendRequest,
) -> Result<u64, JournalError> {
    check_fence(tx, &req.fence).await?;
    let pid = &req.persistence_id;
    if let Some(r) = &req.reply {
        if let Some(reply) = recorded_reply(tx, RECORDED_REPLY, pid, &r.request_id).await? {
            return Err(JournalError::Duplicate {
                persistence_id: pid.clone(),
                request_id: r.request_id.clone(),
                reply,
            });
        }
    }
    let last = last_seq(tx, LAST_SEQ, pid).await?;
    if last != req.expected_seq {
        return Err(JournalError::Conflict { persistence_id: pid.clone(), expected: req.expected_seq, actual: last });
    }
    // Before anything is written: a refused change refuses the append.
    reminders::refuse(&req.reminders)?;
    if !req.events.is_empty() {
        let seqs: Vec<i64> =
            (0..req.events.len()).map(|i| to_i64(last + 1 + i as u64, "sequence number")).collect::<Result<_, _>>()?;
        let names: Vec<&str> = req.events.iter().map(|e| e.type_name.as_str()).collect();
        let versions: Vec<i64> = req.events.iter().map(|e| i64::from(e.schema_version)).collect();
        let payloads: Vec<&[u8]> = req.events.iter().map(|e| e.payload.as_slice()).collect();
        let inserted = tx
            .execute(
                "INSERT INTO shardline_events (persistence_id, seq, type_name, schema_version, payload)
                 SELECT $1, * FROM UNNEST($2::BIGINT[], $3::TEXT[], $4::BIGINT[], $5::BYTEA[])",
                &[pid, &seqs, &names, &versions, &payloads],
            )
            .await;
        if let Err(e) = inserted {
            // Another process appended the same sequence numbers first.
            if e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
                return Err(JournalError::Conflict {
                    persistence_id: pid.clone(),
                    expected: req.expected_seq,
                    actual: req.expected_seq + 1,
                });
            }
            return Err(db(e));
        }
    }
    let new_last = last + req.events.len() as u64;
    if req.remember {
        tx.execute(
            "INSERT INTO shardline_remembered (type_key, shard, entity_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            &[&req.fence.type_key, &i64::from(req.fence.shard.0), &req.entity_id],
        )
        .await
        .map_err(db)?;
    }
    if let Some(r) = &req.reply {
        let seq = to_i64(new_last, "sequence number")?;
        let keep = i64::try_from(req.keep_replies.as_millis()).unwrap_or(i64::MAX);
        // Through the index by time, by the server's clock: usually the one reply that just aged out.
        tx.execute(
            "DELETE FROM shardline_replies WHERE persistence_id = $1
                AND recorded_at < (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT - $2",
            &[pid, &keep],
        )
        .await
        .map_err(db)?;
        tx.execute(
            "INSERT INTO shardline_replies (persistence_id, request_id, seq, reply) VALUES ($1, $2, $3, $4)
             ON CONFLICT (persistence_id, request_id) DO UPDATE SET seq = EXCLUDED.seq, reply = EXCLUDED.reply,
                recorded = DEFAULT, recorded_at = DEFAULT",
            &[pid, &r.request_id, &seq, &r.reply],
        )
        .await
        .map_err(db)?;
    }
    if !req.reminders.is_empty() {
        reminders::apply(tx, change, &req.fence, &req.reminders).await?;
    }
    Ok(new_last)
}

pub(crate) async fn read(
    tx: &impl GenericClient,
    q: &(impl Query + ?Sized),
    pid: &str,
    from: u64,
    max: usize,
) -> Result<Vec<StoredEvent>, JournalError> {
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let rows = tx.query(q, &[&pid, &to_i64(from, "sequence number")?, &limit]).await.map_err(db)?;
    rows.into_iter()
        .map(|r| {
            let seq = to_u64(col(&r, 0)?, pid, 0, "sequence number")?;
            let schema_version = to_u32(col(&r, 2)?, pid, seq, "schema version")?;
            Ok(StoredEvent { seq, event: EventRecord { type_name: col(&r, 1)?, schema_version, payload: col(&r, 3)? } })
        })
        .collect()
}

pub(crate) async fn save_snapshot(
    tx: &Transaction<'_>,
    f: Fence,
    pid: String,
    s: Snapshot,
) -> Result<(), JournalError> {
    check_fence(tx, &f).await?;
    tx.execute(
        "INSERT INTO shardline_snapshots (persistence_id, seq, schema_version, payload) VALUES ($1, $2, $3, $4)
         ON CONFLICT (persistence_id) DO UPDATE SET seq = EXCLUDED.seq, schema_version = EXCLUDED.schema_version,
            payload = EXCLUDED.payload
         WHERE EXCLUDED.seq > shardline_snapshots.seq",
        &[&pid, &to_i64(s.seq, "sequence number")?, &i64::from(s.schema_version), &s.payload],
    )
    .await
    .map_err(db)?;
    Ok(())
}

pub(crate) async fn load_snapshot(
    tx: &impl GenericClient,
    q: &(impl Query + ?Sized),
    pid: &str,
) -> Result<Option<Snapshot>, JournalError> {
    let row = tx.query_opt(q, &[&pid]).await.map_err(db)?;
    row.map(|r| {
        let seq = to_u64(col(&r, 0)?, pid, 0, "snapshot sequence number")?;
        let schema_version = to_u32(col(&r, 1)?, pid, seq, "snapshot schema version")?;
        Ok(Snapshot { seq, schema_version, payload: col(&r, 2)? })
    })
    .transpose()
}

pub(crate) async fn recorded_reply(
    tx: &impl GenericClient,
    q: &(impl Query + ?Sized),
    pid: &str,
    id: &str,
) -> Result<Option<Vec<u8>>, JournalError> {
    let row = tx.query_opt(q, &[&pid, &id]).await.map_err(db)?;
    row.map(|r| col(&r, 0)).transpose()
}

pub(crate) async fn recorded_replies(
    tx: &impl GenericClient,
    q: &(impl Query + ?Sized),
    pid: &str,
    newest: usize,
) -> Result<Vec<RecordedReply>, JournalError> {
    let limit = i64::try_from(newest).unwrap_or(i64::MAX);
    let rows = tx.query(q, &[&pid, &limit]).await.map_err(db)?;
    let mut replies: Vec<RecordedReply> = rows
        .iter()
        .map(|r| Ok(RecordedReply { request_id: col(r, 0)?, reply: col(r, 1)? }))
        .collect::<Result<_, _>>()?;
    replies.reverse();
    Ok(replies)
}

pub(crate) async fn remembered(
    tx: &impl GenericClient,
    q: &(impl Query + ?Sized),
    type_key: &str,
    shard: ShardId,
) -> Result<Vec<String>, JournalError> {
    let rows = tx.query(q, &[&type_key, &i64::from(shard.0)]).await.map_err(db)?;
    rows.iter().map(|r| col(r, 0)).collect()
}

pub(crate) async fn highest_term(tx: &impl GenericClient, q: &(impl Query + ?Sized)) -> Result<u64, JournalError> {
    let row = tx.query_one(q, &[]).await.map_err(db)?;
    let top: Option<i64> = col(&row, 0)?;
    top.map_or(Ok(0), |t| to_u64(t, "fences", 0, "term"))
}

pub(crate) async fn forget(tx: &Transaction<'_>, f: Fence, entity_id: String) -> Result<(), JournalError> {
    check_fence(tx, &f).await?;
    tx.execute(
        "DELETE FROM shardline_remembered WHERE type_key = $1 AND shard = $2 AND entity_id = $3",
        &[&f.type_key, &i64::from(f.shard.0), &entity_id],
    )
    .await
    .map_err(db)?;
    Ok(())
}
