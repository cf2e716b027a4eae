//! The reminder checks of the conformance suite.

use super::{append, e, ensure, fence, Check};
use crate::journal::{Journal, JournalError, ReminderChange, ReminderPosition, StoredReminder};
use shardline_core::ShardId;

fn reminder(entity: &str, name: &str, due_ms: u64, every_ms: u64) -> StoredReminder {
    StoredReminder { entity_id: entity.to_string(), name: name.to_string(), due_ms, every_ms }
}

fn set(entity: &str, name: &str, due_ms: u64, every_ms: u64) -> ReminderChange {
    ReminderChange::Set(reminder(entity, name, due_ms, every_ms))
}

/// Every reminder of a shard due before `until`, read `page` at a time.
async fn read_all(
    j: &dyn Journal,
    t: &str,
    shard: u32,
    until: u64,
    page: usize,
) -> Result<Vec<StoredReminder>, String> {
    let (mut all, mut after): (Vec<StoredReminder>, Option<ReminderPosition>) = (Vec::new(), None);
    loop {
        let got = j.due_reminders(t, ShardId(shard), after.clone(), until, page).await.map_err(|e| e.to_string())?;
        if got.len() > page {
            return Err(format!("a page of {page} returned {}", got.len()));
        }
        let full = got.len() == page;
        after = got.last().map(StoredReminder::position).or(after);
        all.extend(got);
        if !full {
            return Ok(all);
        }
        if all.len() > 10_000 {
            return Err("paging does not end".into());
        }
    }
}

/// Reminders are read per shard, due before a time, in (due, entity, name) order, a page at a
/// time after a position (ties on the due time included), with their period.
pub async fn reminders_are_read_in_due_order(j: &dyn Journal, t: &str) -> Check {
    let (f1, f2) = (fence(t, 1, e(1, 0)), fence(t, 2, e(1, 0)));
    j.raise_fence(&f1).await.map_err(|e| e.to_string())?;
    j.raise_fence(&f2).await.map_err(|e| e.to_string())?;
    let mut changes = vec![set("b", "x", 5_000, 0), set("a", "y", 5_000, 250), set("a", "x", 5_000, 0)];
    changes.extend((0..7).map(|i| set(&format!("e{i}"), "tick", 1_000 + i, 0)));
    changes.push(set("late", "x", 9_000, 0));
    j.change_reminders(&f1, changes).await.map_err(|e| e.to_string())?;
    j.change_reminders(&f2, vec![set("other", "x", 10, 0)]).await.map_err(|e| e.to_string())?;
    for page in [1, 3, 100] {
        let got = read_all(j, t, 1, 9_000, page).await?;
        let mut want: Vec<StoredReminder> = (0..7).map(|i| reminder(&format!("e{i}"), "tick", 1_000 + i, 0)).collect();
        want.extend([reminder("a", "x", 5_000, 0), reminder("a", "y", 5_000, 250), reminder("b", "x", 5_000, 0)]);
        ensure!(got == want, "shard 1 before 9000 in pages of {page}: {got:?}, want {want:?}");
    }
    let after = Some(ReminderPosition::before(5_000));
    let got = j.due_reminders(t, ShardId(1), after, 9_001, 100).await.map_err(|e| e.to_string())?;
    ensure!(got.len() == 4 && got[3].entity_id == "late", "after (5000, \"\", \"\"): {got:?}");
    let other = j.due_reminders(t, ShardId(2), None, u64::MAX >> 1, 100).await.map_err(|e| e.to_string())?;
    ensure!(other == vec![reminder("other", "x", 10, 0)], "shard 2: {other:?}");
    let none =
        j.due_reminders(&format!("{t}-else"), ShardId(1), None, 100_000, 100).await.map_err(|e| e.to_string())?;
    ensure!(none.is_empty(), "another type's shard 1: {none:?}");
    Ok(())
}

/// Setting a name again replaces it; cancelling removes it (a missing one too, silently); a
/// firing is acknowledged only while the stored reminder is still the one that fired.
pub async fn reminders_are_replaced_cancelled_and_acknowledged(j: &dyn Journal, t: &str) -> Check {
    let f = fence(t, 0, e(1, 0));
    j.raise_fence(&f).await.map_err(|e| e.to_string())?;
    let ch = |c: Vec<ReminderChange>| j.change_reminders(&f, c);
    ch(vec![set("a", "once", 100, 0), set("a", "rep", 200, 50), set("b", "once", 300, 0)])
        .await
        .map_err(|e| e.to_string())?;
    ch(vec![set("a", "once", 150, 0)]).await.map_err(|e| e.to_string())?;
    let got = read_all(j, t, 0, 1_000, 10).await?;
    ensure!(got.len() == 3 && got[0] == reminder("a", "once", 150, 0), "replaced: {got:?}");
    let fired = |entity: &str, name: &str, due_ms, next_ms| ReminderChange::Fired {
        entity_id: entity.into(),
        name: name.into(),
        due_ms,
        next_ms,
    };
    // The firing of the replaced time acknowledges nothing.
    ch(vec![fired("a", "once", 100, None)]).await.map_err(|e| e.to_string())?;
    ensure!(read_all(j, t, 0, 1_000, 10).await?.len() == 3, "a stale acknowledgement removed a reminder");
    ch(vec![fired("a", "once", 150, None), fired("a", "rep", 200, Some(250))]).await.map_err(|e| e.to_string())?;
    let got = read_all(j, t, 0, 1_000, 10).await?;
    ensure!(got == vec![reminder("a", "rep", 250, 50), reminder("b", "once", 300, 0)], "acknowledged: {got:?}");
    ch(vec![
        ReminderChange::Cancel { entity_id: "b".into(), name: "once".into() },
        ReminderChange::Cancel { entity_id: "nobody".into(), name: "x".into() },
    ])
    .await
    .map_err(|e| e.to_string())?;
    let got = read_all(j, t, 0, 1_000, 10).await?;
    ensure!(got == vec![reminder("a", "rep", 250, 50)], "cancelled: {got:?}");
    Ok(())
}

/// A reminder change is fenced like an append, all or nothing, and refuses what it cannot store.
pub async fn reminder_changes_are_fenced_and_whole(j: &dyn Journal, t: &str) -> Check {
    let (old, new) = (fence(t, 0, e(1, 0)), fence(t, 0, e(2, 0)));
    match j.change_reminders(&old, vec![set("a", "x", 1, 0)]).await {
        Err(JournalError::Fenced { .. }) => {}
        other => return Err(format!("a change before any fence was raised: {other:?}")),
    }
    j.raise_fence(&new).await.map_err(|e| e.to_string())?;
    match j.change_reminders(&old, vec![set("a", "x", 1, 0)]).await {
        Err(JournalError::Fenced { .. }) => {}
        other => return Err(format!("a change at an older epoch: {other:?}")),
    }
    for bad in [set("a", "", 1, 0), set("a", "far", u64::MAX, 0)] {
        match j.change_reminders(&new, vec![set("a", "good", 1, 0), bad.clone()]).await {
            Err(JournalError::Failed(_)) => {}
            other => return Err(format!("{bad:?} with a good change: {other:?}")),
        }
    }
    let got = read_all(j, t, 0, u64::MAX >> 1, 10).await?;
    ensure!(got.is_empty(), "refused changes stored {got:?}");
    Ok(())
}

/// Reminders carried by an append are written in its transaction, in order: with its events, or
/// not at all when it is refused.
pub async fn reminders_commit_with_their_append(j: &dyn Journal, t: &str) -> Check {
    let f = fence(t, 0, e(1, 0));
    j.raise_fence(&f).await.map_err(|e| e.to_string())?;
    let pid = format!("{t}|a");
    let mut ok = append(&f, &pid, 0, 1);
    ok.reminders = vec![set("a", "expire", 500, 0)];
    j.append(ok).await.map_err(|e| e.to_string())?;
    let mut conflict = append(&f, &pid, 0, 1);
    conflict.reminders = vec![set("a", "other", 400, 0)];
    match j.append(conflict).await {
        Err(JournalError::Conflict { .. }) => {}
        other => return Err(format!("a stale append: {other:?}")),
    }
    let mut bad = append(&f, &pid, 1, 1);
    bad.reminders = vec![set("a", "", 400, 0)];
    match j.append(bad).await {
        Err(JournalError::Failed(_)) => {}
        other => return Err(format!("an append with an unnamed reminder: {other:?}")),
    }
    ensure!(j.last_seq(&pid).await.map_err(|e| e.to_string())? == 1, "the refused append wrote events");
    let got = read_all(j, t, 0, 1_000, 10).await?;
    ensure!(got == vec![reminder("a", "expire", 500, 0)], "after an append and two refused ones: {got:?}");
    // A reminder's command acknowledges its firing, and its event sets the reminder again, at
    // the very time that fired: applied in order, so it stays.
    let mut again = append(&f, &pid, 1, 1);
    let ack = ReminderChange::Fired { entity_id: "a".into(), name: "expire".into(), due_ms: 500, next_ms: None };
    again.reminders = vec![ack, set("a", "expire", 500, 0)];
    j.append(again).await.map_err(|e| e.to_string())?;
    let got = read_all(j, t, 0, 1_000, 10).await?;
    ensure!(got == vec![reminder("a", "expire", 500, 0)], "acknowledged, then set again, in one append: {got:?}");
    let mut cancel = append(&f, &pid, 2, 1);
    cancel.reminders = vec![ReminderChange::Cancel { entity_id: "a".into(), name: "expire".into() }];
    j.append(cancel).await.map_err(|e| e.to_string())?;
    ensure!(read_all(j, t, 0, 1_000, 10).await?.is_empty(), "an append's cancel was not applied");
    Ok(())
}
