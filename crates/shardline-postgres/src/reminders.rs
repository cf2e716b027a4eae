//! Durable reminders in `shardline_reminders`: the fenced changes (on their own, or with an
//! append in its statement), and the due ones of a shard read a page at a time from the index
//! by (type, shard, due time, entity, name).
//!
//! A statement applies changes as arrays, one set per kind (stored, dropped, moved), so that a
//! batch of acknowledgements is one statement, not one per reminder. Its changes must name
//! distinct reminders (within one statement each would see the table as it was before it, and an
//! upsert may not touch a row twice): a list that changes a reminder twice is applied in
//! [`rounds`], each a statement, in order. The rows to drop or move are found by the key each
//! change carries, type included, so the only way to them is the primary key: given the type as
//! a separate condition, a plan made while the table was small read every reminder of the type.

use std::collections::{HashMap, HashSet};

use shardline::journal::queue::DueReminders;
use shardline::journal::{persistence_id, AppendRequest, Fence, JournalError, ReminderChange, StoredReminder};
use shardline_core::Epoch;
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row, Transaction};

use crate::connection::db;
use crate::sql::{check_fence, col, to_i64, to_u64, Query};

/// Reminder changes of one shard's entities, fenced in the statement: nothing is written unless
/// the stored fence admits the writer, and the statement answers the stored fence (none when
/// it was never raised). The changes name distinct reminders.
pub(crate) const CHANGE_REMINDERS: &str = "
WITH fence AS (
    SELECT term, seq FROM shardline_fences WHERE type_key = $1 AND shard = $2 FOR SHARE
), ok AS (
    SELECT 1 FROM fence WHERE (fence.term, fence.seq) <= ($3::BIGINT, $4::BIGINT)
), rset AS (
    INSERT INTO shardline_reminders (type_key, entity_id, name, shard, due_ms, every_ms)
    SELECT $1, s.entity_id, s.name, $2, s.due_ms, s.every_ms
    FROM ok, UNNEST($5::TEXT[], $6::TEXT[], $7::BIGINT[], $8::BIGINT[]) AS s(entity_id, name, due_ms, every_ms)
    ON CONFLICT (type_key, entity_id, name) DO UPDATE
        SET shard = EXCLUDED.shard, due_ms = EXCLUDED.due_ms, every_ms = EXCLUDED.every_ms
), rdrop AS (
    DELETE FROM shardline_reminders r
    USING ok, UNNEST($9::TEXT[], $10::TEXT[], $11::TEXT[], $12::BIGINT[]) AS d(type_key, entity_id, name, due_ms)
    WHERE r.type_key = d.type_key AND r.entity_id = d.entity_id AND r.name = d.name
        AND (d.due_ms IS NULL OR r.due_ms = d.due_ms)
), rmove AS (
    UPDATE shardline_reminders r SET due_ms = m.next_ms
    FROM ok, UNNEST($13::TEXT[], $14::TEXT[], $15::TEXT[], $16::BIGINT[], $17::BIGINT[])
        AS m(type_key, entity_id, name, due_ms, next_ms)
    WHERE r.type_key = m.type_key AND r.entity_id = m.entity_id AND r.name = m.name AND r.due_ms = m.due_ms
)
SELECT (SELECT term FROM fence), (SELECT seq FROM fence)";

/// The first page of a shard's reminders due at most at `$3`: a range of the index.
pub(crate) const DUE_REMINDERS: &str = "SELECT entity_id, name, due_ms, every_ms FROM shardline_reminders
     WHERE type_key = $1 AND shard = $2 AND due_ms <= $3
     ORDER BY due_ms, entity_id, name LIMIT $4";

/// A later page: the reminders after a position, due at most at `$6`.
pub(crate) const DUE_REMINDERS_AFTER: &str = "SELECT entity_id, name, due_ms, every_ms FROM shardline_reminders
     WHERE type_key = $1 AND shard = $2 AND (due_ms, entity_id, name) > ($3, $4, $5) AND due_ms <= $6
     ORDER BY due_ms, entity_id, name LIMIT $7";

/// Refuses changes the database cannot store (an empty name, a due time above
/// [`MAX_DUE_MS`](shardline::journal::MAX_DUE_MS), a period above `i64::MAX`), before anything
/// is written.
pub(crate) fn refuse(changes: &[ReminderChange]) -> Result<(), JournalError> {
    if let Some(problem) = changes.iter().find_map(ReminderChange::problem) {
        return Err(JournalError::Failed(problem));
    }
    for c in changes {
        if let ReminderChange::Set(r) = c {
            to_i64(r.every_ms, "reminder period")?;
        }
    }
    Ok(())
}

/// The changes in statements that each change a reminder at most once, in order: the n-th
/// change of a reminder goes in the n-th. Always at least one (perhaps empty), which checks the
/// fence.
pub(crate) fn rounds(changes: &[ReminderChange]) -> Vec<Vec<&ReminderChange>> {
    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    let mut rounds: Vec<Vec<&ReminderChange>> = vec![Vec::new()];
    for c in changes {
        let n = seen.entry((c.entity_id(), c.name())).or_insert(0);
        match rounds.get_mut(*n) {
            Some(round) => round.push(c),
            None => rounds.push(vec![c]),
        }
        *n += 1;
    }
    rounds
}

/// Whether the reminders of these appends can be written by one statement with them: none
/// refused, and no reminder changed twice (`across`: in the whole batch, else within each).
pub(crate) fn fit_one_statement(requests: &[&AppendRequest], across: bool) -> bool {
    let mut all = HashSet::new();
    requests.iter().all(|r| {
        let mut own = HashSet::new();
        refuse(&r.reminders).is_ok()
            && r.reminders.iter().all(|c| {
                let key = (r.fence.type_key.as_str(), c.entity_id(), c.name());
                own.insert(key) && (!across || all.insert(key))
            })
    })
}

/// Changes as the arrays of a statement, by kind; `idx` names the append a change belongs to in
/// a batched statement (1 for the first).
#[derive(Default)]
pub(crate) struct ChangeArrays<'a> {
    set_idx: Vec<i64>,
    set_entity: Vec<&'a str>,
    set_name: Vec<&'a str>,
    set_due: Vec<i64>,
    set_every: Vec<i64>,
    drop_idx: Vec<i64>,
    drop_type: Vec<&'a str>,
    drop_entity: Vec<&'a str>,
    drop_name: Vec<&'a str>,
    /// None: cancelled, whatever its due time.
    drop_due: Vec<Option<i64>>,
    move_idx: Vec<i64>,
    move_type: Vec<&'a str>,
    move_entity: Vec<&'a str>,
    move_name: Vec<&'a str>,
    move_due: Vec<i64>,
    move_next: Vec<i64>,
}

impl<'a> ChangeArrays<'a> {
    /// Adds a change of `type_key`'s reminders (checked by [`refuse`] or refused here).
    pub(crate) fn push(&mut self, idx: i64, type_key: &'a str, change: &'a ReminderChange) -> Result<(), JournalError> {
        match change {
            ReminderChange::Set(r) => {
                self.set_idx.push(idx);
                self.set_entity.push(&r.entity_id);
                self.set_name.push(&r.name);
                self.set_due.push(to_i64(r.due_ms, "reminder due time")?);
                self.set_every.push(to_i64(r.every_ms, "reminder period")?);
            }
            ReminderChange::Cancel { entity_id, name } => {
                self.drop_idx.push(idx);
                self.drop_type.push(type_key);
                self.drop_entity.push(entity_id);
                self.drop_name.push(name);
                self.drop_due.push(None);
            }
            ReminderChange::Fired { entity_id, name, due_ms, next_ms } => {
                // No stored reminder is due past what the database holds: nothing to acknowledge.
                let Ok(due) = i64::try_from(*due_ms) else { return Ok(()) };
                match next_ms {
                    None => {
                        self.drop_idx.push(idx);
                        self.drop_type.push(type_key);
                        self.drop_entity.push(entity_id);
                        self.drop_name.push(name);
                        self.drop_due.push(Some(due));
                    }
                    Some(next) => {
                        self.move_idx.push(idx);
                        self.move_type.push(type_key);
                        self.move_entity.push(entity_id);
                        self.move_name.push(name);
                        self.move_due.push(due);
                        self.move_next.push(to_i64(*next, "reminder due time")?);
                    }
                }
            }
        }
        Ok(())
    }

    /// The arrays of a statement for one writer (no `idx`), in the order [`CHANGE_REMINDERS`]
    /// and the single append take them.
    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 13] {
        [
            &self.set_entity,
            &self.set_name,
            &self.set_due,
            &self.set_every,
            &self.drop_type,
            &self.drop_entity,
            &self.drop_name,
            &self.drop_due,
            &self.move_type,
            &self.move_entity,
            &self.move_name,
            &self.move_due,
            &self.move_next,
        ]
    }

    /// The arrays of a batched statement, each kind led by its changes' `idx`.
    pub(crate) fn params_by_append(&self) -> [&(dyn ToSql + Sync); 16] {
        [
            &self.set_idx,
            &self.set_entity,
            &self.set_name,
            &self.set_due,
            &self.set_every,
            &self.drop_idx,
            &self.drop_type,
            &self.drop_entity,
            &self.drop_name,
            &self.drop_due,
            &self.move_idx,
            &self.move_type,
            &self.move_entity,
            &self.move_name,
            &self.move_due,
            &self.move_next,
        ]
    }
}

/// [`Journal::change_reminders`](shardline::journal::Journal::change_reminders): fenced, then all
/// or nothing (run it in a savepoint: a statement the database refuses rolls back the others).
pub(crate) async fn change_reminders(
    tx: &Transaction<'_>,
    q: &(impl Query + ?Sized),
    f: Fence,
    changes: Vec<ReminderChange>,
) -> Result<(), JournalError> {
    if let Err(e) = refuse(&changes) {
        // A writer that no longer owns the shard hears that first, as from any write.
        check_fence(tx, &f).await?;
        return Err(e);
    }
    apply(tx, q, &f, &changes).await
}

/// Whether [`change_in_one`] takes these changes: none refused, none of the same reminder twice.
pub(crate) fn one_statement(changes: &[ReminderChange]) -> bool {
    refuse(changes).is_ok() && rounds(changes).len() == 1
}

/// [`change_reminders`] of changes [`one_statement`] takes, in a savepoint of its own, sent with
/// the savepoint and its release in one round trip (acknowledgements come a few per shard, many
/// shards at a time: a round trip each for the savepoint and its release halved their rate).
/// The statement writes nothing unless the fence admits the writer, so the release may go out
/// before its answer; a statement the database refuses is rolled back to the savepoint.
pub(crate) async fn change_in_one(
    tx: &Transaction<'_>,
    q: &(impl Query + ?Sized),
    f: Fence,
    changes: Vec<ReminderChange>,
) -> Result<(), JournalError> {
    let args = ChangeArgs::new(&f, &changes)?;
    let (begun, row, released) = futures_util::future::join3(
        tx.batch_execute("SAVEPOINT shardline_reminders"),
        tx.query_one(q, &args.params()),
        tx.batch_execute("RELEASE SAVEPOINT shardline_reminders"),
    )
    .await;
    match (begun, row, released) {
        (Ok(()), Ok(row), Ok(())) => f.admitted_by(stored_fence(&row, &f)?),
        // Refused (and the release with it, the transaction being aborted): back to the
        // savepoint, so that the batch goes on without it.
        (Ok(()), Err(e), _) if e.as_db_error().is_some() => {
            tx.batch_execute("ROLLBACK TO SAVEPOINT shardline_reminders; RELEASE SAVEPOINT shardline_reminders")
                .await
                .map_err(db)?;
            Err(db(e))
        }
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Err(db(e)),
    }
}

/// Applies changes of the fence's shard's entities with [`CHANGE_REMINDERS`], in order, each
/// statement checking the fence; refused when the fence does not admit the writer.
pub(crate) async fn apply(
    tx: &Transaction<'_>,
    q: &(impl Query + ?Sized),
    f: &Fence,
    changes: &[ReminderChange],
) -> Result<(), JournalError> {
    refuse(changes)?;
    for round in rounds(changes) {
        let args = ChangeArgs::new(f, round)?;
        let row = tx.query_one(q, &args.params()).await.map_err(db)?;
        f.admitted_by(stored_fence(&row, f)?)?;
    }
    Ok(())
}

/// [`CHANGE_REMINDERS`]' arguments: the writer's fence and its changes (of distinct reminders).
struct ChangeArgs<'a> {
    f: &'a Fence,
    shard: i64,
    term: i64,
    seq: i64,
    arrays: ChangeArrays<'a>,
}

impl<'a> ChangeArgs<'a> {
    fn new(f: &'a Fence, changes: impl IntoIterator<Item = &'a ReminderChange>) -> Result<Self, JournalError> {
        let mut arrays = ChangeArrays::default();
        for c in changes {
            arrays.push(0, &f.type_key, c)?;
        }
        let (term, seq) = (to_i64(f.epoch.term, "term")?, to_i64(f.epoch.seq, "epoch")?);
        Ok(ChangeArgs { f, shard: i64::from(f.shard.0), term, seq, arrays })
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        let head: [&(dyn ToSql + Sync); 4] = [&self.f.type_key, &self.shard, &self.term, &self.seq];
        head.into_iter().chain(self.arrays.params()).collect()
    }
}

/// The fence a statement answered in its first two columns (none when it was never raised).
pub(crate) fn stored_fence(row: &Row, f: &Fence) -> Result<Option<Epoch>, JournalError> {
    let what = format!("fence of {} shard {}", f.type_key, f.shard.0);
    match (col::<Option<i64>>(row, 0)?, col::<Option<i64>>(row, 1)?) {
        (Some(t), Some(s)) => Ok(Some(Epoch { term: to_u64(t, &what, 0, "term")?, seq: to_u64(s, &what, 0, "seq")? })),
        _ => Ok(None),
    }
}

/// [`Journal::due_reminders`](shardline::journal::Journal::due_reminders): a range of the index
/// by (type, shard, due time, entity, name), at most `max` rows (`first` is [`DUE_REMINDERS`],
/// `after` [`DUE_REMINDERS_AFTER`]).
pub(crate) async fn due_reminders(
    c: &impl GenericClient,
    first: &(impl Query + ?Sized),
    after: &(impl Query + ?Sized),
    q: &DueReminders,
) -> Result<Vec<StoredReminder>, JournalError> {
    // Due before `until_ms`, i.e. at most `until_ms - 1`: every due time fits the database, so a
    // bound past it is the largest one, and nothing is due before 0.
    let Some(last_due) = q.until_ms.checked_sub(1) else { return Ok(Vec::new()) };
    if q.max == 0 {
        return Ok(Vec::new());
    }
    let last_due = i64::try_from(last_due).unwrap_or(i64::MAX);
    let limit = i64::try_from(q.max).unwrap_or(i64::MAX);
    let shard = i64::from(q.shard.0);
    let rows = match &q.after {
        None => c.query(first, &[&q.type_key, &shard, &last_due, &limit]).await,
        Some(p) => {
            // Nothing is stored after a position past every due time the database holds.
            let Ok(after_due) = i64::try_from(p.due_ms) else { return Ok(Vec::new()) };
            c.query(after, &[&q.type_key, &shard, &after_due, &p.entity_id, &p.name, &last_due, &limit]).await
        }
    }
    .map_err(db)?;
    let mut out: Vec<StoredReminder> = Vec::with_capacity(rows.len());
    for row in &rows {
        let reminder = read_row(row, q, out.last())?;
        out.push(reminder);
    }
    Ok(out)
}

/// A row of a due read; a value that is not what the journal writes (a negative time, a
/// column of another type) is corrupt, never read as a default.
fn read_row(row: &Row, q: &DueReminders, before: Option<&StoredReminder>) -> Result<StoredReminder, JournalError> {
    let values = (|| -> Result<(String, String, i64, i64), tokio_postgres::Error> {
        Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?))
    })();
    let (entity_id, name, due, every) = values.map_err(|e| {
        let after = before.map(StoredReminder::position).or_else(|| q.after.clone());
        JournalError::Corrupt {
            persistence_id: format!("{} shard {} reminders", q.type_key, q.shard.0),
            seq: 0,
            reason: format!("the reminder after {after:?}: {e}"),
        }
    })?;
    let corrupt = |what: &str, v: i64| JournalError::Corrupt {
        persistence_id: persistence_id(&q.type_key, &entity_id),
        seq: 0,
        reason: format!("reminder {name}: {what} is negative ({v})"),
    };
    let due_ms = u64::try_from(due).map_err(|_| corrupt("due time", due))?;
    let every_ms = u64::try_from(every).map_err(|_| corrupt("period", every))?;
    Ok(StoredReminder { entity_id, name, due_ms, every_ms })
}
