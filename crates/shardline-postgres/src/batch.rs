//! Appends a batch at a time: the statements that check and write an append, one append
//! ([`APPEND`]) or a batch of appends to distinct entities ([`APPEND_MANY`]), and the two ways a
//! batch runs them: one statement, or one statement per append pipelined on the connection.

use shardline::journal::{AppendRequest, JournalError};
use tokio_postgres::Client;

use crate::connection::db;
use crate::reminders::{stored_fence, ChangeArrays};
use crate::sql::{col, to_i64, to_u64};

/// Every check and write of an append in one statement: nothing is written (events, remembered
/// entity, reply, reminder changes) unless the fence and the expected sequence number allow it
/// and its request id has no recorded reply yet, and the statement says which check failed
/// (with the recorded reply) instead of raising an error, so a refused append does not abort the
/// transaction around it. Its reminder changes name distinct reminders (see `reminders`).
///
/// The sequence check reads the entity's keys from the expected last event to the one after: the
/// expected last must be there (unless none is expected) and the next must not. An entity's
/// events run from 1 without a gap (each append writes after the last), so that holds exactly
/// when the last is the expected one, and the scan stops after two keys. The last itself
/// (`MAX(seq)` unbounded, a backward scan that read every key of the entity on its leaf page, a
/// quarter of the server's time in the appends bench) is read only for a refused append, to say
/// where the entity is. The check is a scalar sub-select, not an `EXISTS`: the planner may hash an
/// `EXISTS` over the whole table, and did so for a generic plan made while it was empty.
pub(crate) const APPEND: &str = "
WITH fence AS (
    SELECT term, seq FROM shardline_fences WHERE type_key = $1 AND shard = $2 FOR SHARE
), last AS (
    SELECT (SELECT COALESCE(MAX(seq), 0) FROM shardline_events
            WHERE persistence_id = $3 AND seq BETWEEN $6::BIGINT AND $6::BIGINT + 1) = $6::BIGINT AS at
), dup AS (
    SELECT reply FROM shardline_replies WHERE persistence_id = $3 AND request_id = $12::TEXT
), ok AS (
    SELECT 1 FROM fence, last WHERE (fence.term, fence.seq) <= ($4::BIGINT, $5::BIGINT) AND last.at
        AND NOT EXISTS (SELECT 1 FROM dup)
), ins AS (
    INSERT INTO shardline_events (persistence_id, seq, type_name, schema_version, payload)
    SELECT $3, $6::BIGINT + e.ord, e.name, e.version, e.payload
    FROM ok, UNNEST($7::TEXT[], $8::BIGINT[], $9::BYTEA[]) WITH ORDINALITY AS e(name, version, payload, ord)
), rem AS (
    INSERT INTO shardline_remembered (type_key, shard, entity_id)
    SELECT $1, $2, $10 FROM ok WHERE $11::BOOL ON CONFLICT DO NOTHING
), rep AS (
    INSERT INTO shardline_replies (persistence_id, request_id, seq, reply)
    SELECT $3, $12::TEXT, $6::BIGINT + cardinality($7::TEXT[]), $13::BYTEA FROM ok WHERE $12::TEXT IS NOT NULL
    ON CONFLICT (persistence_id, request_id) DO UPDATE
        SET seq = EXCLUDED.seq, reply = EXCLUDED.reply, recorded = DEFAULT, recorded_at = DEFAULT
), old AS (
    DELETE FROM shardline_replies
    WHERE persistence_id = $3 AND $12::TEXT IS NOT NULL AND EXISTS (SELECT 1 FROM ok)
      AND request_id <> $12::TEXT
      AND recorded_at < (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT - $14::BIGINT
), rset AS (
    INSERT INTO shardline_reminders (type_key, entity_id, name, shard, due_ms, every_ms)
    SELECT $1, s.entity_id, s.name, $2, s.due_ms, s.every_ms
    FROM ok, UNNEST($15::TEXT[], $16::TEXT[], $17::BIGINT[], $18::BIGINT[]) AS s(entity_id, name, due_ms, every_ms)
    ON CONFLICT (type_key, entity_id, name) DO UPDATE
        SET shard = EXCLUDED.shard, due_ms = EXCLUDED.due_ms, every_ms = EXCLUDED.every_ms
), rdrop AS (
    DELETE FROM shardline_reminders r
    USING ok, UNNEST($19::TEXT[], $20::TEXT[], $21::TEXT[], $22::BIGINT[]) AS d(type_key, entity_id, name, due_ms)
    WHERE r.type_key = d.type_key AND r.entity_id = d.entity_id AND r.name = d.name
        AND (d.due_ms IS NULL OR r.due_ms = d.due_ms)
), rmove AS (
    UPDATE shardline_reminders r SET due_ms = m.next_ms
    FROM ok, UNNEST($23::TEXT[], $24::TEXT[], $25::TEXT[], $26::BIGINT[], $27::BIGINT[])
        AS m(type_key, entity_id, name, due_ms, next_ms)
    WHERE r.type_key = m.type_key AND r.entity_id = m.entity_id AND r.name = m.name AND r.due_ms = m.due_ms
)
SELECT (SELECT term FROM fence), (SELECT seq FROM fence),
    CASE WHEN (SELECT at FROM last) THEN $6::BIGINT
        ELSE (SELECT COALESCE(MAX(seq), 0) FROM shardline_events WHERE persistence_id = $3) END,
    EXISTS (SELECT 1 FROM ok),
    (SELECT reply FROM dup)";

/// [`APPEND`] for a whole batch of appends to distinct persistence ids, in one statement: the
/// server runs one statement per batch instead of one per append. (A batch that appends twice to
/// one entity takes the pipelined path: within one statement the second append would not see
/// the first one's events; likewise a batch that changes one reminder twice, counting all its
/// appends.) Answers one row per append, in order, shaped like [`APPEND`]'s.
pub(crate) const APPEND_MANY: &str = "
WITH req AS (
    SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::BIGINT[], $5::BIGINT[], $6::BIGINT[],
                         $7::TEXT[], $8::BOOL[], $9::TEXT[], $10::BYTEA[], $11::BIGINT[], $12::BIGINT[])
        WITH ORDINALITY AS r(type_key, shard, pid, term, eseq, expected, entity_id, remember, request_id, reply,
                             keep_ms, events, idx)
), fence AS (
    SELECT r.idx, f.term, f.seq FROM req r
    JOIN shardline_fences f ON f.type_key = r.type_key AND f.shard = r.shard FOR SHARE OF f
), last AS (
    SELECT r.idx,
        (SELECT COALESCE(MAX(e.seq), 0) FROM shardline_events e
            WHERE e.persistence_id = r.pid AND e.seq BETWEEN r.expected AND r.expected + 1) = r.expected AS at
    FROM req r
), dup AS (
    SELECT r.idx, d.reply FROM req r
    JOIN shardline_replies d ON d.persistence_id = r.pid AND d.request_id = r.request_id
), ok AS (
    SELECT r.* FROM req r JOIN fence f ON f.idx = r.idx JOIN last l ON l.idx = r.idx
    WHERE (f.term, f.seq) <= (r.term, r.eseq) AND l.at
        AND NOT EXISTS (SELECT 1 FROM dup WHERE dup.idx = r.idx)
), ins AS (
    INSERT INTO shardline_events (persistence_id, seq, type_name, schema_version, payload)
    SELECT ok.pid, ok.expected + e.ord, e.name, e.version, e.payload
    FROM UNNEST($13::BIGINT[], $14::BIGINT[], $15::TEXT[], $16::BIGINT[], $17::BYTEA[])
        AS e(idx, ord, name, version, payload)
    JOIN ok ON ok.idx = e.idx
), rem AS (
    INSERT INTO shardline_remembered (type_key, shard, entity_id)
    SELECT type_key, shard, entity_id FROM ok WHERE remember ON CONFLICT DO NOTHING
), rep AS (
    INSERT INTO shardline_replies (persistence_id, request_id, seq, reply)
    SELECT pid, request_id, expected + events, reply FROM ok WHERE request_id IS NOT NULL
    ON CONFLICT (persistence_id, request_id) DO UPDATE
        SET seq = EXCLUDED.seq, reply = EXCLUDED.reply, recorded = DEFAULT, recorded_at = DEFAULT
), old AS (
    DELETE FROM shardline_replies d USING ok
    WHERE d.persistence_id = ok.pid AND ok.request_id IS NOT NULL AND d.request_id <> ok.request_id
      AND d.recorded_at < (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT - ok.keep_ms
), rset AS (
    INSERT INTO shardline_reminders (type_key, entity_id, name, shard, due_ms, every_ms)
    SELECT ok.type_key, s.entity_id, s.name, ok.shard, s.due_ms, s.every_ms
    FROM UNNEST($18::BIGINT[], $19::TEXT[], $20::TEXT[], $21::BIGINT[], $22::BIGINT[])
        AS s(idx, entity_id, name, due_ms, every_ms)
    JOIN ok ON ok.idx = s.idx
    ON CONFLICT (type_key, entity_id, name) DO UPDATE
        SET shard = EXCLUDED.shard, due_ms = EXCLUDED.due_ms, every_ms = EXCLUDED.every_ms
), rdrop AS (
    DELETE FROM shardline_reminders r
    USING UNNEST($23::BIGINT[], $24::TEXT[], $25::TEXT[], $26::TEXT[], $27::BIGINT[])
        AS d(idx, type_key, entity_id, name, due_ms)
    JOIN ok ON ok.idx = d.idx
    WHERE r.type_key = d.type_key AND r.entity_id = d.entity_id AND r.name = d.name
        AND (d.due_ms IS NULL OR r.due_ms = d.due_ms)
), rmove AS (
    UPDATE shardline_reminders r SET due_ms = m.next_ms
    FROM UNNEST($28::BIGINT[], $29::TEXT[], $30::TEXT[], $31::TEXT[], $32::BIGINT[], $33::BIGINT[])
        AS m(idx, type_key, entity_id, name, due_ms, next_ms)
    JOIN ok ON ok.idx = m.idx
    WHERE r.type_key = m.type_key AND r.entity_id = m.entity_id AND r.name = m.name AND r.due_ms = m.due_ms
)
SELECT f.term, f.seq,
    CASE WHEN l.at THEN r.expected
        ELSE (SELECT COALESCE(MAX(e.seq), 0) FROM shardline_events e WHERE e.persistence_id = r.pid) END,
    EXISTS (SELECT 1 FROM ok WHERE ok.idx = r.idx), dup.reply
FROM req r JOIN last l ON l.idx = r.idx LEFT JOIN fence f ON f.idx = r.idx LEFT JOIN dup ON dup.idx = r.idx
ORDER BY r.idx";

/// Runs a batch of appends to distinct persistence ids as one [`APPEND_MANY`] statement in one
/// transaction. Returns each append's result and the commit's; `Err` when the statement failed,
/// which rolled everything back.
pub(crate) async fn batched_appends(
    client: &mut Client,
    statement: &tokio_postgres::Statement,
    requests: &[&AppendRequest],
) -> Result<(Vec<Result<u64, JournalError>>, Result<(), JournalError>), JournalError> {
    let args: Vec<AppendArgs<'_>> = requests.iter().map(|r| AppendArgs::new(r)).collect::<Result<_, _>>()?;
    let column = |f: &dyn Fn(&AppendArgs<'_>) -> i64| args.iter().map(f).collect::<Vec<i64>>();
    let (shards, terms, eseqs, expected, keep_ms) = (
        column(&|a| a.shard),
        column(&|a| a.term),
        column(&|a| a.epoch_seq),
        column(&|a| a.expected),
        column(&|a| a.keep_ms),
    );
    let counts = column(&|a| a.names.len() as i64);
    let type_keys: Vec<&str> = requests.iter().map(|r| r.fence.type_key.as_str()).collect();
    let pids: Vec<&str> = requests.iter().map(|r| r.persistence_id.as_str()).collect();
    let entity_ids: Vec<&str> = requests.iter().map(|r| r.entity_id.as_str()).collect();
    let remember: Vec<bool> = requests.iter().map(|r| r.remember).collect();
    let request_ids: Vec<Option<&str>> = args.iter().map(|a| a.request_id).collect();
    let replies: Vec<Option<&[u8]>> = args.iter().map(|a| a.reply).collect();
    let (mut ev_idx, mut ev_ord, mut names, mut versions, mut payloads) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut reminders = ChangeArrays::default();
    for (i, a) in args.iter().enumerate() {
        for (k, name) in a.names.iter().enumerate() {
            ev_idx.push(i as i64 + 1);
            ev_ord.push(k as i64 + 1);
            names.push(*name);
            versions.push(a.versions[k]);
            payloads.push(a.payloads[k]);
        }
        for c in &a.req.reminders {
            reminders.push(i as i64 + 1, &a.req.fence.type_key, c)?;
        }
    }
    let head: [&(dyn tokio_postgres::types::ToSql + Sync); 17] = [
        &type_keys,
        &shards,
        &pids,
        &terms,
        &eseqs,
        &expected,
        &entity_ids,
        &remember,
        &request_ids,
        &replies,
        &keep_ms,
        &counts,
        &ev_idx,
        &ev_ord,
        &names,
        &versions,
        &payloads,
    ];
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
        head.into_iter().chain(reminders.params_by_append()).collect();
    let rows = client.query(statement, &params);
    let (rows, committed) = in_transaction(client, rows).await?;
    if rows.len() != requests.len() {
        // The rows were written (or not) as one: no answer can be matched to its append.
        let e = JournalError::CommitUnknown(format!("{} answers to {} appends", rows.len(), requests.len()));
        return Ok((requests.iter().map(|_| Err(e.clone())).collect(), Err(e)));
    }
    let results = requests.iter().zip(&rows).map(|(req, row)| append_outcome(req, row)).collect();
    Ok((results, committed))
}

/// Runs many appends in one transaction, their statements pipelined on the connection (they
/// still run in order, so a later append of the same entity sees an earlier one). Returns each
/// append's result and the commit's; `Err` when a statement failed, which rolled everything
/// back.
pub(crate) async fn pipelined_appends(
    client: &mut Client,
    statement: &tokio_postgres::Statement,
    requests: &[&AppendRequest],
) -> Result<(Vec<Result<u64, JournalError>>, Result<(), JournalError>), JournalError> {
    let mut args = Vec::with_capacity(requests.len());
    for req in requests {
        args.push(AppendArgs::new(req)?);
    }
    let params: Vec<Vec<&(dyn tokio_postgres::types::ToSql + Sync)>> = args.iter().map(AppendArgs::params).collect();
    let statements = futures_util::future::join_all(params.iter().map(|p| client.query_one(statement, &p[..])));
    let all = async { statements.await.into_iter().collect::<Result<Vec<_>, _>>() };
    let (rows, committed) = in_transaction(client, all).await?;
    let results = requests.iter().zip(&rows).map(|(req, row)| append_outcome(req, row)).collect();
    Ok((results, committed))
}

/// Runs `work` in a transaction whose `BEGIN` and `COMMIT` are pipelined around it on the
/// connection: one round trip to the server instead of three. `work` must send its statements
/// when first polled (queries of prepared statements do), so that they reach the server between
/// the two.
///
/// Returns what `work` answered and the commit's outcome; `Err` when `work` failed and nothing was
/// written (the server refused a statement, which aborted the transaction, so the `COMMIT` rolled
/// it back), or `Err(CommitUnknown)` when the connection failed and the `COMMIT` may have run.
pub(crate) async fn in_transaction<T>(
    client: &Client,
    work: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<(T, Result<(), JournalError>), JournalError> {
    let (begun, done, committed) =
        futures_util::future::join3(client.batch_execute("BEGIN"), work, client.batch_execute("COMMIT")).await;
    let unknown = |e: tokio_postgres::Error| JournalError::CommitUnknown(db(e).to_string());
    match (begun, done) {
        (Ok(()), Ok(v)) => Ok((
            v,
            committed.map_err(|e| match db(e) {
                JournalError::Unavailable(m) => JournalError::CommitUnknown(m),
                other => other,
            }),
        )),
        // A refused statement aborts the transaction: the pipelined COMMIT answers ROLLBACK.
        (Ok(()), Err(e)) if e.as_db_error().is_some() => Err(db(e)),
        // The connection failed (the server may have run everything, COMMIT included, before
        // its answers were lost), or BEGIN failed and the statements ran without a transaction.
        (Ok(()), Err(e)) | (Err(e), _) => Err(unknown(e)),
    }
}

/// The parameters of [`APPEND`] for one request, owned so that they outlive the pipeline.
pub(crate) struct AppendArgs<'a> {
    req: &'a AppendRequest,
    shard: i64,
    term: i64,
    epoch_seq: i64,
    expected: i64,
    names: Vec<&'a str>,
    versions: Vec<i64>,
    payloads: Vec<&'a [u8]>,
    request_id: Option<&'a str>,
    reply: Option<&'a [u8]>,
    keep_ms: i64,
    reminders: ChangeArrays<'a>,
}

impl<'a> AppendArgs<'a> {
    pub(crate) fn new(req: &'a AppendRequest) -> Result<Self, JournalError> {
        let mut reminders = ChangeArrays::default();
        for c in &req.reminders {
            reminders.push(0, &req.fence.type_key, c)?;
        }
        Ok(AppendArgs {
            req,
            shard: i64::from(req.fence.shard.0),
            term: to_i64(req.fence.epoch.term, "term")?,
            epoch_seq: to_i64(req.fence.epoch.seq, "epoch")?,
            expected: to_i64(req.expected_seq, "sequence number")?,
            names: req.events.iter().map(|e| e.type_name.as_str()).collect(),
            versions: req.events.iter().map(|e| i64::from(e.schema_version)).collect(),
            payloads: req.events.iter().map(|e| e.payload.as_slice()).collect(),
            request_id: req.reply.as_ref().map(|r| r.request_id.as_str()),
            reply: req.reply.as_ref().map(|r| r.reply.as_slice()),
            keep_ms: i64::try_from(req.keep_replies.as_millis()).unwrap_or(i64::MAX),
            reminders,
        })
    }

    /// [`APPEND`]'s parameters, in order.
    pub(crate) fn params(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        let head: [&(dyn tokio_postgres::types::ToSql + Sync); 14] = [
            &self.req.fence.type_key,
            &self.shard,
            &self.req.persistence_id,
            &self.term,
            &self.epoch_seq,
            &self.expected,
            &self.names,
            &self.versions,
            &self.payloads,
            &self.req.entity_id,
            &self.req.remember,
            &self.request_id,
            &self.reply,
            &self.keep_ms,
        ];
        head.into_iter().chain(self.reminders.params()).collect()
    }
}

/// What [`APPEND`]'s answer row says about one request.
pub(crate) fn append_outcome(req: &AppendRequest, row: &tokio_postgres::Row) -> Result<u64, JournalError> {
    let pid = &req.persistence_id;
    let written: bool = col(row, 3)?;
    let last = to_u64(col(row, 2)?, pid, 0, "last sequence number")?;
    if written {
        return Ok(req.expected_seq + req.events.len() as u64);
    }
    req.fence.admitted_by(stored_fence(row, &req.fence)?)?;
    if let (Some(r), Some(reply)) = (&req.reply, col::<Option<Vec<u8>>>(row, 4)?) {
        return Err(JournalError::Duplicate { persistence_id: pid.clone(), request_id: r.request_id.clone(), reply });
    }
    Err(JournalError::Conflict { persistence_id: pid.clone(), expected: req.expected_seq, actual: last })
}
