//! The journal's statements, one function per request kind, the checked conversions between the
//! journal's numbers and the database's, and the writer's clock that replies are kept by.

use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension};
use shardline::journal::{AppendRequest, EventRecord, Fence, JournalError, RecordedReply, Snapshot, StoredEvent};
use shardline_core::{Epoch, ShardId};

use crate::connection::db;
use crate::reminders;

pub(crate) fn to_i64(v: u64, what: &str) -> Result<i64, JournalError> {
    i64::try_from(v).map_err(|_| JournalError::Failed(format!("{what} {v} does not fit the database")))
}

fn to_u64(v: i64, pid: &str, seq: u64, what: &str) -> Result<u64, JournalError> {
    u64::try_from(v).map_err(|_| JournalError::Corrupt {
        persistence_id: pid.to_string(),
        seq,
        reason: format!("{what} is negative ({v})"),
    })
}

fn stored_fence(c: &Connection, type_key: &str, shard: ShardId) -> Result<Option<Epoch>, JournalError> {
    let row: Option<(i64, i64)> = c
        .prepare_cached("SELECT term, seq FROM shardline_fences WHERE type_key = ?1 AND shard = ?2")
        .map_err(db)?
        .query_row(params![type_key, shard.0], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(db)?;
    row.map(|(t, s)| {
        let what = format!("fence of {type_key} shard {}", shard.0);
        Ok(Epoch { term: to_u64(t, &what, 0, "term")?, seq: to_u64(s, &what, 0, "seq")? })
    })
    .transpose()
}

pub(crate) fn check_fence(c: &Connection, f: &Fence) -> Result<(), JournalError> {
    f.admitted_by(stored_fence(c, &f.type_key, f.shard)?)
}

pub(crate) fn raise_fence(c: &Connection, f: &Fence) -> Result<Epoch, JournalError> {
    let (term, seq) = (to_i64(f.epoch.term, "term")?, to_i64(f.epoch.seq, "epoch")?);
    c.prepare_cached(
        "INSERT INTO shardline_fences (type_key, shard, term, seq) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (type_key, shard) DO UPDATE SET term = excluded.term, seq = excluded.seq
         WHERE (excluded.term, excluded.seq) > (shardline_fences.term, shardline_fences.seq)",
    )
    .map_err(db)?
    .execute(params![f.type_key, f.shard.0, term, seq])
    .map_err(db)?;
    stored_fence(c, &f.type_key, f.shard)?
        .ok_or_else(|| JournalError::Failed(format!("the fence of {} shard {} was not stored", f.type_key, f.shard.0)))
}

pub(crate) fn last_seq(c: &Connection, pid: &str) -> Result<u64, JournalError> {
    let last: Option<i64> = c
        .prepare_cached("SELECT MAX(seq) FROM shardline_events WHERE persistence_id = ?1")
        .map_err(db)?
        .query_row([pid], |r| r.get(0))
        .map_err(db)?;
    to_u64(last.unwrap_or(0), pid, 0, "last sequence number")
}

pub(crate) fn append(c: &Connection, req: &AppendRequest) -> Result<u64, JournalError> {
    check_fence(c, &req.fence)?;
    let pid = &req.persistence_id;
    if let Some(r) = &req.reply {
        if let Some(reply) = recorded_reply(c, pid, &r.request_id)? {
            return Err(JournalError::Duplicate {
                persistence_id: pid.clone(),
                request_id: r.request_id.clone(),
                reply,
            });
        }
    }
    let last = last_seq(c, pid)?;
    if last != req.expected_seq {
        return Err(JournalError::Conflict { persistence_id: pid.clone(), expected: req.expected_seq, actual: last });
    }
    reminders::refuse_problems(&req.reminders)?;
    let mut insert = c
        .prepare_cached(
            "INSERT INTO shardline_events (persistence_id, seq, type_name, schema_version, payload)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(db)?;
    for (i, e) in req.events.iter().enumerate() {
        let seq = to_i64(last + 1 + i as u64, "sequence number")?;
        insert.execute(params![pid, seq, e.type_name, e.schema_version, e.payload]).map_err(db)?;
    }
    let new_last = last + req.events.len() as u64;
    if req.remember {
        c.prepare_cached("INSERT OR IGNORE INTO shardline_remembered (type_key, shard, entity_id) VALUES (?1, ?2, ?3)")
            .map_err(db)?
            .execute(params![req.fence.type_key, req.fence.shard.0, req.entity_id])
            .map_err(db)?;
    }
    reminders::apply(c, &req.fence, &req.reminders)?;
    if let Some(r) = &req.reply {
        let seq = to_i64(new_last, "sequence number")?;
        let now = now_ms();
        let keep = i64::try_from(req.keep_replies.as_millis()).unwrap_or(i64::MAX);
        // Through the index by time: usually the one reply that just aged out.
        c.prepare_cached("DELETE FROM shardline_replies WHERE persistence_id = ?1 AND recorded_at < ?2")
            .map_err(db)?
            .execute(params![pid, now.saturating_sub(keep)])
            .map_err(db)?;
        c.prepare_cached(
            "INSERT OR REPLACE INTO shardline_replies (persistence_id, request_id, seq, reply, recorded_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(db)?
        .execute(params![pid, r.request_id, seq, r.reply, now])
        .map_err(db)?;
    }
    Ok(new_last)
}

pub(crate) fn read(c: &Connection, pid: &str, from: u64, max: usize) -> Result<Vec<StoredEvent>, JournalError> {
    let mut q = c
        .prepare_cached(
            "SELECT seq, type_name, schema_version, payload FROM shardline_events
             WHERE persistence_id = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3",
        )
        .map_err(db)?;
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let rows = q
        .query_map(params![pid, to_i64(from, "sequence number")?, limit], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?, r.get::<_, Vec<u8>>(3)?))
        })
        .map_err(db)?;
    let mut out: Vec<StoredEvent> = Vec::new();
    for row in rows {
        // A row of the wrong type (text where bytes belong, say) is corrupt: name where it is.
        let (seq, type_name, version, payload) = row.map_err(|e| JournalError::Corrupt {
            persistence_id: pid.to_string(),
            seq: out.last().map_or(from, |e| e.seq + 1),
            reason: e.to_string(),
        })?;
        let seq = to_u64(seq, pid, 0, "sequence number")?;
        let schema_version = u32::try_from(version).map_err(|_| JournalError::Corrupt {
            persistence_id: pid.to_string(),
            seq,
            reason: format!("schema version {version} is out of range"),
        })?;
        out.push(StoredEvent { seq, event: EventRecord { type_name, schema_version, payload } });
    }
    Ok(out)
}

pub(crate) fn save_snapshot(c: &Connection, f: &Fence, pid: &str, s: &Snapshot) -> Result<(), JournalError> {
    check_fence(c, f)?;
    c.prepare_cached(
        "INSERT INTO shardline_snapshots (persistence_id, seq, schema_version, payload) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (persistence_id) DO UPDATE SET seq = excluded.seq, schema_version = excluded.schema_version,
            payload = excluded.payload
         WHERE excluded.seq > shardline_snapshots.seq",
    )
    .map_err(db)?
    .execute(params![pid, to_i64(s.seq, "sequence number")?, s.schema_version, s.payload])
    .map_err(db)?;
    Ok(())
}

pub(crate) fn load_snapshot(c: &Connection, pid: &str) -> Result<Option<Snapshot>, JournalError> {
    let row: Option<(i64, i64, Vec<u8>)> = c
        .query_row(
            "SELECT seq, schema_version, payload FROM shardline_snapshots WHERE persistence_id = ?1",
            [pid],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(db)?;
    row.map(|(seq, version, payload)| {
        let seq = to_u64(seq, pid, 0, "snapshot sequence number")?;
        let schema_version = u32::try_from(version).map_err(|_| JournalError::Corrupt {
            persistence_id: pid.to_string(),
            seq,
            reason: format!("snapshot schema version {version} is out of range"),
        })?;
        Ok(Snapshot { seq, schema_version, payload })
    })
    .transpose()
}

pub(crate) fn recorded_reply(c: &Connection, pid: &str, id: &str) -> Result<Option<Vec<u8>>, JournalError> {
    // Prepared once: every append with a request id looks its id up first.
    c.prepare_cached("SELECT reply FROM shardline_replies WHERE persistence_id = ?1 AND request_id = ?2")
        .map_err(db)?
        .query_row([pid, id], |r| r.get(0))
        .optional()
        .map_err(db)
}

pub(crate) fn recorded_replies(c: &Connection, pid: &str, newest: usize) -> Result<Vec<RecordedReply>, JournalError> {
    let limit = i64::try_from(newest).unwrap_or(i64::MAX);
    let mut q = c
        .prepare_cached(
            "SELECT request_id, reply FROM shardline_replies WHERE persistence_id = ?1
             ORDER BY recorded_at DESC, rowid DESC LIMIT ?2",
        )
        .map_err(db)?;
    let rows = q
        .query_map(params![pid, limit], |r| Ok(RecordedReply { request_id: r.get(0)?, reply: r.get(1)? }))
        .map_err(db)?;
    let mut newest_first: Vec<RecordedReply> = rows.map(|r| r.map_err(db)).collect::<Result<_, _>>()?;
    newest_first.reverse();
    Ok(newest_first)
}

/// The writer's clock, in milliseconds since the Unix epoch: what replies are kept by.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

pub(crate) fn remembered(c: &Connection, type_key: &str, shard: ShardId) -> Result<Vec<String>, JournalError> {
    let mut q = c
        .prepare_cached(
            "SELECT entity_id FROM shardline_remembered WHERE type_key = ?1 AND shard = ?2 ORDER BY entity_id",
        )
        .map_err(db)?;
    let rows = q.query_map(params![type_key, shard.0], |r| r.get::<_, String>(0)).map_err(db)?;
    rows.map(|r| r.map_err(db)).collect()
}

pub(crate) fn highest_term(c: &Connection) -> Result<u64, JournalError> {
    let top: Option<i64> = c
        .prepare_cached("SELECT MAX(term) FROM shardline_fences")
        .map_err(db)?
        .query_row([], |r| r.get(0))
        .map_err(db)?;
    top.map_or(Ok(0), |t| to_u64(t, "fences", 0, "term"))
}

pub(crate) fn forget(c: &Connection, f: &Fence, entity_id: &str) -> Result<(), JournalError> {
    check_fence(c, f)?;
    c.prepare_cached("DELETE FROM shardline_remembered WHERE type_key = ?1 AND shard = ?2 AND entity_id = ?3")
        .map_err(db)?
        .execute(params![f.type_key, f.shard.0, entity_id])
        .map_err(db)?;
    Ok(())
}
