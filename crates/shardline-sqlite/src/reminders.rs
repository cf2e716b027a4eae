//! Durable reminders in `shardline_reminders`: the fenced changes (on their own or with an
//! append, in its savepoint), and the due ones of a shard read a page at a time from the index
//! by (type, shard, due time, entity, name).

use rusqlite::{params, Connection};
use shardline::journal::queue::DueReminders;
use shardline::journal::{persistence_id, Fence, JournalError, ReminderChange, StoredReminder};

use crate::connection::db;
use crate::sql::{check_fence, to_i64};

/// [`Journal::change_reminders`](shardline::journal::Journal::change_reminders): fenced, then
/// all or nothing (run it in a savepoint: a change the database refuses rolls back the others).
pub(crate) fn change_reminders(c: &Connection, f: &Fence, changes: &[ReminderChange]) -> Result<(), JournalError> {
    check_fence(c, f)?;
    refuse_problems(changes)?;
    apply(c, f, changes)
}

/// Refuses the whole batch when one change cannot be stored (an empty name, a due time above
/// [`MAX_DUE_MS`](shardline::journal::MAX_DUE_MS), a period the database cannot hold), before
/// anything is written.
pub(crate) fn refuse_problems(changes: &[ReminderChange]) -> Result<(), JournalError> {
    if let Some(problem) = changes.iter().find_map(ReminderChange::problem) {
        return Err(JournalError::Failed(problem));
    }
    for change in changes {
        if let ReminderChange::Set(r) = change {
            to_i64(r.every_ms, &format!("the period of reminder {}", r.name))?;
        }
    }
    Ok(())
}

/// Applies changes of the fence's shard's entities, in order: the fence checked and the changes
/// passed by [`refuse_problems`] already, in the same savepoint.
pub(crate) fn apply(c: &Connection, f: &Fence, changes: &[ReminderChange]) -> Result<(), JournalError> {
    for change in changes {
        match change {
            ReminderChange::Set(r) => {
                c.prepare_cached(
                    "INSERT INTO shardline_reminders (type_key, entity_id, name, shard, due_ms, every_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (type_key, entity_id, name) DO UPDATE SET shard = excluded.shard,
                        due_ms = excluded.due_ms, every_ms = excluded.every_ms",
                )
                .map_err(db)?
                .execute(params![
                    f.type_key,
                    r.entity_id,
                    r.name,
                    f.shard.0,
                    to_i64(r.due_ms, "reminder due time")?,
                    to_i64(r.every_ms, "reminder period")?,
                ])
                .map_err(db)?;
            }
            ReminderChange::Cancel { entity_id, name } => {
                c.prepare_cached(
                    "DELETE FROM shardline_reminders WHERE type_key = ?1 AND entity_id = ?2 AND name = ?3",
                )
                .map_err(db)?
                .execute(params![f.type_key, entity_id, name])
                .map_err(db)?;
            }
            ReminderChange::Fired { entity_id, name, due_ms, next_ms } => {
                // No stored reminder is due past what the database holds: nothing to acknowledge.
                let Ok(due) = i64::try_from(*due_ms) else { continue };
                match next_ms {
                    None => c
                        .prepare_cached(
                            "DELETE FROM shardline_reminders
                             WHERE type_key = ?1 AND entity_id = ?2 AND name = ?3 AND due_ms = ?4",
                        )
                        .map_err(db)?
                        .execute(params![f.type_key, entity_id, name, due])
                        .map_err(db)?,
                    Some(next) => c
                        .prepare_cached(
                            "UPDATE shardline_reminders SET due_ms = ?5
                             WHERE type_key = ?1 AND entity_id = ?2 AND name = ?3 AND due_ms = ?4",
                        )
                        .map_err(db)?
                        .execute(params![f.type_key, entity_id, name, due, to_i64(*next, "reminder due time")?])
                        .map_err(db)?,
                };
            }
        }
    }
    Ok(())
}

/// [`Journal::due_reminders`](shardline::journal::Journal::due_reminders): a range of the index
/// by (type, shard, due time, entity, name), at most `max` rows.
pub(crate) fn due_reminders(c: &Connection, q: &DueReminders) -> Result<Vec<StoredReminder>, JournalError> {
    // Due before `until_ms`, i.e. at most `until_ms - 1`: every due time fits the database, so a
    // bound past it is the largest one, and nothing is due before 0.
    let Some(last_due) = q.until_ms.checked_sub(1) else { return Ok(Vec::new()) };
    let last_due = i64::try_from(last_due).unwrap_or(i64::MAX);
    let limit = i64::try_from(q.max).unwrap_or(i64::MAX);
    let (t, shard) = (&q.type_key, q.shard.0);
    let mut stmt;
    let rows = match &q.after {
        None => {
            stmt = c
                .prepare_cached(
                    "SELECT entity_id, name, due_ms, every_ms FROM shardline_reminders
                     WHERE type_key = ?1 AND shard = ?2 AND due_ms <= ?3
                     ORDER BY due_ms, entity_id, name LIMIT ?4",
                )
                .map_err(db)?;
            stmt.query(params![t, shard, last_due, limit]).map_err(db)?
        }
        Some(after) => {
            // Nothing is stored after a position past every due time the database holds.
            let Ok(after_due) = i64::try_from(after.due_ms) else { return Ok(Vec::new()) };
            stmt = c
                .prepare_cached(
                    "SELECT entity_id, name, due_ms, every_ms FROM shardline_reminders
                     WHERE type_key = ?1 AND shard = ?2 AND (due_ms, entity_id, name) > (?3, ?4, ?5)
                        AND due_ms <= ?6
                     ORDER BY due_ms, entity_id, name LIMIT ?7",
                )
                .map_err(db)?;
            stmt.query(params![t, shard, after_due, after.entity_id, after.name, last_due, limit]).map_err(db)?
        }
    };
    read_rows(rows, q)
}

/// The rows of a due read; a value that is not what was stored (a negative time, text where a
/// number belongs) is corrupt, never read as a default.
fn read_rows(mut rows: rusqlite::Rows<'_>, q: &DueReminders) -> Result<Vec<StoredReminder>, JournalError> {
    let mut out: Vec<StoredReminder> = Vec::new();
    loop {
        let row = match rows.next() {
            Ok(Some(row)) => row,
            Ok(None) => return Ok(out),
            Err(e) => return Err(db(e)),
        };
        let values = (|| -> rusqlite::Result<(String, String, i64, i64)> {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })();
        let (entity_id, name, due, every) = values.map_err(|e| unreadable(q, out.last(), e))?;
        let corrupt = |what: &str, v: i64| JournalError::Corrupt {
            persistence_id: persistence_id(&q.type_key, &entity_id),
            seq: 0,
            reason: format!("reminder {name}: {what} is negative ({v})"),
        };
        let due_ms = u64::try_from(due).map_err(|_| corrupt("due time", due))?;
        let every_ms = u64::try_from(every).map_err(|_| corrupt("period", every))?;
        out.push(StoredReminder { entity_id, name, due_ms, every_ms });
    }
}

/// A row whose columns cannot be read as the reminder's: corrupt, named by where it is (the
/// shard, and the reminder before it); any other error is the database's.
fn unreadable(q: &DueReminders, before: Option<&StoredReminder>, e: rusqlite::Error) -> JournalError {
    match e {
        rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => {
            let after = before.map(StoredReminder::position).or_else(|| q.after.clone());
            JournalError::Corrupt {
                persistence_id: format!("{} shard {} reminders", q.type_key, q.shard.0),
                seq: 0,
                reason: format!("the reminder after {after:?}: {e}"),
            }
        }
        e => db(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::migrate;
    use shardline::journal::ReminderPosition;
    use shardline::ShardId;

    fn due(after: Option<ReminderPosition>, until_ms: u64, max: usize) -> DueReminders {
        DueReminders { type_key: "t".into(), shard: ShardId(3), after, until_ms, max }
    }

    fn conn() -> Connection {
        let mut c = Connection::open_in_memory().unwrap();
        migrate(&mut c).unwrap();
        c
    }

    /// Both forms of the read are a range of the index by due time, with no sort and no scan of
    /// the table.
    #[test]
    fn due_reminders_read_a_range_of_the_index() {
        let c = conn();
        let plans = [
            (
                "SELECT entity_id, name, due_ms, every_ms FROM shardline_reminders
                 WHERE type_key = ?1 AND shard = ?2 AND due_ms <= ?3
                 ORDER BY due_ms, entity_id, name LIMIT ?4",
                vec![rusqlite::types::Value::from("t".to_string()), 3.into(), 10.into(), 5.into()],
            ),
            (
                "SELECT entity_id, name, due_ms, every_ms FROM shardline_reminders
                 WHERE type_key = ?1 AND shard = ?2 AND (due_ms, entity_id, name) > (?3, ?4, ?5)
                    AND due_ms <= ?6
                 ORDER BY due_ms, entity_id, name LIMIT ?7",
                vec![
                    rusqlite::types::Value::from("t".to_string()),
                    3.into(),
                    1.into(),
                    "e".to_string().into(),
                    "n".to_string().into(),
                    10.into(),
                    5.into(),
                ],
            ),
        ];
        for (sql, args) in plans {
            let mut q = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let plan: Vec<String> = q
                .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let plan = plan.join("; ");
            assert!(plan.contains("USING INDEX shardline_reminders_due"), "{plan}");
            let bound = "(due_ms,entity_id,name)>(?,?,?)";
            assert!(plan.contains(bound) || !sql.contains("> (?3"), "the position is not a bound: {plan}");
            assert!(!plan.contains("TEMP B-TREE") && !plan.contains("SCAN"), "{plan}");
        }
    }

    /// Values the journal never writes are corrupt when read, not defaults.
    #[test]
    fn unreadable_reminders_are_corrupt() {
        let c = conn();
        for (row, what) in [
            ("('t', 'a', 'x', 3, -5, 0)", "negative due time"),
            ("('t', 'a', 'x', 3, 5, -1)", "negative period"),
            ("('t', 'a', 'x', 3, 5, 'often')", "text period"),
            ("('t', 'a', 'x', 3, 5, 1.5)", "real period"),
        ] {
            c.execute("DELETE FROM shardline_reminders", []).unwrap();
            c.execute(&format!("INSERT INTO shardline_reminders VALUES {row}"), []).unwrap();
            let got = due_reminders(&c, &due(None, 100, 10));
            assert!(matches!(got, Err(JournalError::Corrupt { .. })), "{what}: {got:?}");
        }
    }

    /// A bound past every storable due time reads up to the largest one; nothing is due before
    /// 0; a position past every due time has nothing after it.
    #[test]
    fn bounds_past_the_database_range() {
        let c = conn();
        let max = shardline::journal::MAX_DUE_MS;
        c.execute("INSERT INTO shardline_reminders VALUES ('t', 'a', 'x', 3, ?1, 0)", [i64::MAX]).unwrap();
        c.execute("INSERT INTO shardline_reminders VALUES ('t', 'a', 'y', 3, 0, 0)", []).unwrap();
        let all = due_reminders(&c, &due(None, u64::MAX, 10)).unwrap();
        assert_eq!(all.iter().map(|r| r.due_ms).collect::<Vec<_>>(), vec![0, max]);
        assert_eq!(due_reminders(&c, &due(None, max, 10)).unwrap().len(), 1);
        assert!(due_reminders(&c, &due(None, 0, 10)).unwrap().is_empty());
        assert!(due_reminders(&c, &due(None, 10, 0)).unwrap().is_empty());
        let past = Some(ReminderPosition::before(u64::MAX));
        assert!(due_reminders(&c, &due(past, u64::MAX, 10)).unwrap().is_empty());
    }

    /// A period the database cannot hold refuses the batch; a firing of a time it cannot hold
    /// acknowledges nothing.
    #[test]
    fn numbers_past_the_database_range_in_changes() {
        let c = conn();
        let f = Fence { type_key: "t".into(), shard: ShardId(3), epoch: shardline::Epoch { term: 1, seq: 0 } };
        crate::sql::raise_fence(&c, &f).unwrap();
        let set = |every_ms| {
            ReminderChange::Set(StoredReminder { entity_id: "a".into(), name: "x".into(), due_ms: 5, every_ms })
        };
        let got = change_reminders(&c, &f, &[set(u64::MAX)]);
        assert!(matches!(got, Err(JournalError::Failed(_))), "{got:?}");
        change_reminders(&c, &f, &[set(7)]).unwrap();
        let fired = ReminderChange::Fired { entity_id: "a".into(), name: "x".into(), due_ms: u64::MAX, next_ms: None };
        change_reminders(&c, &f, &[fired]).unwrap();
        assert_eq!(due_reminders(&c, &due(None, 100, 10)).unwrap().len(), 1);
    }
}
