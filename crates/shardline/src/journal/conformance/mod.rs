//! The conformance suite every [`Journal`] must pass: the in-memory journal here, SQLite and
//! PostgreSQL against real databases in their crates. Each check names its persistence ids and
//! entity types under `prefix`, so the suite can run on a database that holds other data, and
//! returns a description of the first broken promise.

mod reminders;

use std::sync::Arc;

use shardline_core::{Epoch, ShardId};

use super::{AppendRequest, EventRecord, Fence, Journal, JournalError, RecordedReply, Snapshot};

/// The result of a check.
pub type Check = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            return Err(format!($($msg)*));
        }
    };
}
pub(crate) use ensure;

pub use reminders::{
    reminder_changes_are_fenced_and_whole, reminders_are_read_in_due_order,
    reminders_are_replaced_cancelled_and_acknowledged, reminders_commit_with_their_append,
};

fn e(term: u64, seq: u64) -> Epoch {
    Epoch { term, seq }
}

fn fence(type_key: &str, shard: u32, epoch: Epoch) -> Fence {
    Fence { type_key: type_key.to_string(), shard: ShardId(shard), epoch }
}

fn event(i: u64) -> EventRecord {
    // Bytes that a text column would mangle: zeros, high bytes.
    EventRecord {
        type_name: format!("Deposited{}", i % 3),
        schema_version: 1 + (i % 2) as u32,
        payload: vec![0, 255, i as u8, 0],
    }
}

/// An append of `n` events after `expected`, with nothing else.
pub fn append(f: &Fence, pid: &str, expected: u64, n: u64) -> AppendRequest {
    AppendRequest {
        fence: f.clone(),
        persistence_id: pid.to_string(),
        entity_id: pid.rsplit('|').next().unwrap_or(pid).to_string(),
        expected_seq: expected,
        events: (expected + 1..=expected + n).map(event).collect(),
        remember: false,
        reply: None,
        keep_replies: KEEP,
        reminders: Vec::new(),
    }
}

/// How long the checks keep replies: longer than any of them runs.
const KEEP: std::time::Duration = std::time::Duration::from_secs(3600);

/// Lets the journal's clock move past what was recorded so far, so that a reply kept for no
/// time at all is older than the next append.
async fn let_time_pass() {
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
}

/// Runs every check.
pub async fn run_all(journal: Arc<dyn Journal>, prefix: &str) -> Check {
    let j = &*journal;
    fences_refuse_older_epochs(j, &format!("{prefix}-fence")).await?;
    sequence_numbers_conflict_never_duplicate(journal.clone(), &format!("{prefix}-seq")).await?;
    events_keep_their_type_version_and_bytes(j, &format!("{prefix}-bytes")).await?;
    a_history_reads_a_page_at_a_time(j, &format!("{prefix}-pages")).await?;
    snapshots_keep_the_latest(j, &format!("{prefix}-snap")).await?;
    remembered_entities_follow_their_appends(j, &format!("{prefix}-remember")).await?;
    replies_are_recorded_with_their_events(j, &format!("{prefix}-reply")).await?;
    a_request_is_applied_once(journal.clone(), &format!("{prefix}-once")).await?;
    concurrent_writers_keep_each_history_linear(journal.clone(), &format!("{prefix}-many")).await?;
    concurrent_appends_record_and_remember(journal.clone(), &format!("{prefix}-many-replies")).await?;
    the_highest_term_covers_every_fence(j, &format!("{prefix}-term")).await?;
    a_batch_refuses_only_its_bad_appends(journal.clone(), &format!("{prefix}-mixed")).await?;
    reminders_are_read_in_due_order(j, &format!("{prefix}-remind-order")).await?;
    reminders_are_replaced_cancelled_and_acknowledged(j, &format!("{prefix}-remind-ack")).await?;
    reminder_changes_are_fenced_and_whole(j, &format!("{prefix}-remind-fence")).await?;
    reminders_commit_with_their_append(j, &format!("{prefix}-remind-append")).await?;
    Ok(())
}

fn is_fenced(r: &Result<impl std::fmt::Debug, JournalError>) -> bool {
    matches!(r, Err(JournalError::Fenced { .. }))
}

/// A write carrying an epoch older than the stored fence is refused, and writes nothing; the
/// fence never goes down; a shard whose fence was never raised takes no write.
pub async fn fences_refuse_older_epochs(j: &dyn Journal, t: &str) -> Check {
    let pid = format!("{t}|a");
    let (old, new) = (fence(t, 3, e(1, 4)), fence(t, 3, e(2, 1)));
    let never = fence(t, 4, e(9, 9));
    ensure!(is_fenced(&j.append(append(&never, &pid, 0, 1)).await), "a write to a shard never fenced was taken");
    ensure!(j.raise_fence(&old).await.map_err(|e| e.to_string())? == e(1, 4), "raise returned another fence");
    let last = j.append(append(&old, &pid, 0, 2)).await.map_err(|e| e.to_string())?;
    ensure!(last == 2, "two events after none: last is {last}");
    ensure!(j.raise_fence(&new).await.map_err(|e| e.to_string())? == e(2, 1), "raise to a newer epoch");
    // Raising to an older epoch keeps the newer one, and says so.
    ensure!(j.raise_fence(&old).await.map_err(|e| e.to_string())? == e(2, 1), "a fence went down");
    let r = j.append(append(&old, &pid, 2, 1)).await;
    ensure!(is_fenced(&r), "an append at an older epoch was not fenced: {r:?}");
    let snap = Snapshot { seq: 2, schema_version: 1, payload: vec![1] };
    ensure!(is_fenced(&j.save_snapshot(&old, &pid, snap).await), "a snapshot at an older epoch was taken");
    ensure!(is_fenced(&j.forget(&old, "a").await), "a forget at an older epoch was taken");
    let events = j.read(&pid, 1).await.map_err(|e| e.to_string())?;
    ensure!(events.len() == 2, "the fenced append wrote something: {} events", events.len());
    let last = j.append(append(&new, &pid, 2, 1)).await.map_err(|e| e.to_string())?;
    ensure!(last == 3, "the new owner appends after the old history: last is {last}");
    Ok(())
}

/// A stale expected sequence number is a conflict, and of many writers racing with the same
/// expectation exactly one wins.
pub async fn sequence_numbers_conflict_never_duplicate(journal: Arc<dyn Journal>, t: &str) -> Check {
    let j = &*journal;
    let f = fence(t, 0, e(1, 1));
    j.raise_fence(&f).await.map_err(|e| e.to_string())?;
    let pid = format!("{t}|a");
    j.append(append(&f, &pid, 0, 3)).await.map_err(|e| e.to_string())?;
    match j.append(append(&f, &pid, 1, 1)).await {
        Err(JournalError::Conflict { expected: 1, actual: 3, .. }) => {}
        other => return Err(format!("a stale expected sequence number gave {other:?}")),
    }
    let tail = j.read(&pid, 2).await.map_err(|e| e.to_string())?;
    ensure!(tail.iter().map(|e| e.seq).collect::<Vec<_>>() == vec![2, 3], "read from 2: {tail:?}");
    ensure!(tail[0].event == event(2), "event 2 read back as {:?}", tail[0].event);
    let mut racers = Vec::new();
    for _ in 0..8 {
        let (journal, f, pid) = (journal.clone(), f.clone(), pid.clone());
        racers.push(tokio::spawn(async move { journal.append(append(&f, &pid, 3, 2)).await }));
    }
    let mut won = 0;
    for r in racers {
        match r.await.map_err(|e| e.to_string())? {
            Ok(5) => won += 1,
            Ok(other) => return Err(format!("a racer's append ended at {other}")),
            Err(JournalError::Conflict { .. }) => {}
            Err(other) => return Err(format!("a racer failed with {other}")),
        }
    }
    ensure!(won == 1, "{won} of 8 racing appends won");
    let all = j.read(&pid, 1).await.map_err(|e| e.to_string())?;
    ensure!(
        all.iter().map(|e| e.seq).eq(1..=5),
        "history is not 1..=5: {:?}",
        all.iter().map(|e| e.seq).collect::<Vec<_>>()
    );
    Ok(())
}

/// Type names, schema versions and payload bytes come back as written.
pub async fn events_keep_their_type_version_and_bytes(j: &dyn Journal, t: &str) -> Check {
    let f = fence(t, 1, e(1, 1));
    j.raise_fence(&f).await.map_err(|e| e.to_string())?;
    let pid = format!("{t}|a");
    let mut req = append(&f, &pid, 0, 0);
    req.events = vec![
        EventRecord { type_name: "Opened".into(), schema_version: 3, payload: Vec::new() },
        EventRecord { type_name: "Ünïcode ✓".into(), schema_version: u32::MAX, payload: (0..=255).collect() },
    ];
    let written = req.events.clone();
    j.append(req).await.map_err(|e| e.to_string())?;
    let read: Vec<EventRecord> =
        j.read(&pid, 1).await.map_err(|e| e.to_string())?.into_iter().map(|e| e.event).collect();
    ensure!(read == written, "events read back differ: {read:?}");
    ensure!(j.read(&format!("{t}|none"), 1).await.map_err(|e| e.to_string())?.is_empty(), "an unknown id has events");
    Ok(())
}

/// A page holds at most the events asked for, in order from the one asked for; a short page is
/// the end; and a whole read (pages one after the other) is longer than one page.
pub async fn a_history_reads_a_page_at_a_time(j: &dyn Journal, t: &str) -> Check {
    let f = fence(t, 1, e(1, 1));
    j.raise_fence(&f).await.map_err(|e| e.to_string())?;
    let pid = format!("{t}|long");
    let total = crate::journal::READ_PAGE as u64 + 10;
    let mut expected = 0;
    while expected < total {
        let n = 1000.min(total - expected);
        j.append(append(&f, &pid, expected, n)).await.map_err(|e| e.to_string())?;
        expected += n;
    }
    let seqs = |page: Vec<crate::journal::StoredEvent>| page.into_iter().map(|e| e.seq).collect::<Vec<u64>>();
    let page = seqs(j.read_page(&pid, 5, 3).await.map_err(|e| e.to_string())?);
    ensure!(page == [5, 6, 7], "a page of 3 from 5: {page:?}");
    let tail = seqs(j.read_page(&pid, total - 1, 3).await.map_err(|e| e.to_string())?);
    ensure!(tail == [total - 1, total], "the last page is short: {tail:?}");
    let past = j.read_page(&pid, total + 1, 3).await.map_err(|e| e.to_string())?;
    ensure!(past.is_empty(), "nothing past the end: {past:?}");
    let all = seqs(j.read(&pid, 1).await.map_err(|e| e.to_string())?);
    ensure!(all == (1..=total).collect::<Vec<u64>>(), "a whole read of {total} events: {} read", all.len());
    Ok(())
}

/// The latest snapshot wins; an older one does not replace it.
pub async fn snapshots_keep_the_latest(j: &dyn Journal, t: &str) -> Check {
    let f = fence(t, 2, e(1, 1));
    j.raise_fence(&f).await.map_err(|e| e.to_string())?;
    let pid = format!("{t}|a");
    ensure!(j.load_snapshot(&pid).await.map_err(|e| e.to_string())?.is_none(), "a snapshot before any was saved");
    let s10 = Snapshot { seq: 10, schema_version: 2, payload: vec![0, 10, 255] };
    let s5 = Snapshot { seq: 5, schema_version: 2, payload: vec![5] };
    j.save_snapshot(&f, &pid, s10.clone()).await.map_err(|e| e.to_string())?;
    j.save_snapshot(&f, &pid, s5).await.map_err(|e| e.to_string())?;
    let got = j.load_snapshot(&pid).await.map_err(|e| e.to_string())?;
    ensure!(got.as_ref() == Some(&s10), "latest snapshot: {got:?}");
    Ok(())
}

/// An append can remember its entity in its shard; a failed append remembers nothing; `forget`
/// removes it.
pub async fn remembered_entities_follow_their_appends(j: &dyn Journal, t: &str) -> Check {
    let f = fence(t, 7, e(1, 1));
    j.raise_fence(&f).await.map_err(|e| e.to_string())?;
    let mut req = append(&f, &format!("{t}|a"), 0, 1);
    req.remember = true;
    j.append(req).await.map_err(|e| e.to_string())?;
    let mut stale = append(&f, &format!("{t}|b"), 5, 1);
    stale.remember = true;
    ensure!(matches!(j.append(stale).await, Err(JournalError::Conflict { .. })), "a stale append to b succeeded");
    let mut only_remember = append(&f, &format!("{t}|c"), 0, 0);
    only_remember.remember = true;
    j.append(only_remember).await.map_err(|e| e.to_string())?;
    let mut got = j.remembered(t, ShardId(7)).await.map_err(|e| e.to_string())?;
    got.sort();
    ensure!(got == vec!["a".to_string(), "c".to_string()], "remembered in shard 7: {got:?}");
    ensure!(j.remembered(t, ShardId(8)).await.map_err(|e| e.to_string())?.is_empty(), "shard 8 remembers something");
    j.forget(&f, "a").await.map_err(|e| e.to_string())?;
    let got = j.remembered(t, ShardId(7)).await.map_err(|e| e.to_string())?;
    ensure!(got == vec!["c".to_string()], "after forgetting a: {got:?}");
    Ok(())
}

/// A reply is recorded with its events (or alone, for a command that wrote none), found again by
/// its request id however many came after it, and dropped only once it is older than the time
/// appends keep replies for; a failed append records nothing.
pub async fn replies_are_recorded_with_their_events(j: &dyn Journal, t: &str) -> Check {
    let f = fence(t, 0, e(1, 1));
    j.raise_fence(&f).await.map_err(|e| e.to_string())?;
    let pid = format!("{t}|a");
    for i in 0..200u64 {
        let mut req = append(&f, &pid, i, 1);
        req.reply = Some(RecordedReply { request_id: format!("req-{i}"), reply: vec![i as u8, 0, 255] });
        j.append(req).await.map_err(|e| e.to_string())?;
    }
    let get = |id: &str| j.recorded_reply(&pid, id);
    ensure!(get("req-199").await.map_err(|e| e.to_string())? == Some(vec![199, 0, 255]), "the newest reply is missing");
    ensure!(
        get("req-0").await.map_err(|e| e.to_string())? == Some(vec![0, 0, 255]),
        "199 later requests dropped a reply"
    );
    let mut failed = append(&f, &pid, 1, 1);
    failed.reply = Some(RecordedReply { request_id: "req-x".into(), reply: vec![9] });
    ensure!(j.append(failed).await.is_err(), "a stale append succeeded");
    ensure!(get("req-x").await.map_err(|e| e.to_string())?.is_none(), "a failed append recorded its reply");
    // A reply without events (a command that wrote none): recorded, the history unchanged.
    let mut bare = append(&f, &pid, 200, 0);
    bare.reply = Some(RecordedReply { request_id: "read-1".into(), reply: vec![7] });
    ensure!(j.append(bare).await.map_err(|e| e.to_string())? == 200, "a reply alone moved the history");
    ensure!(get("read-1").await.map_err(|e| e.to_string())? == Some(vec![7]), "a reply alone was not recorded");
    let ids = |n: usize| {
        let pid = pid.clone();
        async move {
            j.recorded_replies(&pid, n)
                .await
                .map(|v| v.into_iter().map(|r| r.request_id).collect::<Vec<String>>())
                .map_err(|e| e.to_string())
        }
    };
    let newest = ids(3).await?;
    ensure!(newest == ["req-198", "req-199", "read-1"], "the newest 3, oldest first: {newest:?}");
    ensure!(ids(1000).await?.len() == 201, "every reply kept");
    ensure!(j.last_seq(&pid).await.map_err(|e| e.to_string())? == 200, "the last sequence number");
    ensure!(j.last_seq(&format!("{t}|none")).await.map_err(|e| e.to_string())? == 0, "no events: 0");
    // Kept for no time at all: the next append drops every older reply, and keeps its own.
    let_time_pass().await;
    let mut last = append(&f, &pid, 200, 1);
    last.reply = Some(RecordedReply { request_id: "req-last".into(), reply: vec![1] });
    last.keep_replies = std::time::Duration::ZERO;
    j.append(last).await.map_err(|e| e.to_string())?;
    ensure!(get("req-0").await.map_err(|e| e.to_string())?.is_none(), "a reply older than kept survived");
    let left = ids(1000).await?;
    ensure!(left == ["req-last"], "only the new reply: {left:?}");
    Ok(())
}

/// An append whose request id has a recorded reply writes nothing and answers `Duplicate` with
/// that reply, even when its expected sequence number is right (a writer that did not know the
/// request was applied); alone, or in a batch with other appends, which go on. Only once its
/// reply is older than kept is the id new again (an entity refuses such a retry first).
pub async fn a_request_is_applied_once(journal: Arc<dyn Journal>, t: &str) -> Check {
    let j = &*journal;
    let f = fence(t, 0, e(1, 1));
    j.raise_fence(&f).await.map_err(|e| e.to_string())?;
    let pid = format!("{t}|a");
    let with_id = |pid: &str, expected: u64, id: &str, reply: u8| {
        let mut req = append(&f, pid, expected, 1);
        req.reply = Some(RecordedReply { request_id: id.into(), reply: vec![reply, 0, 255] });
        req
    };
    j.append(with_id(&pid, 0, "r1", 1)).await.map_err(|e| e.to_string())?;
    let is_dup = |r: &Result<u64, JournalError>, want: u8| matches!(r, Err(JournalError::Duplicate { request_id, reply, .. }) if request_id == "r1" && *reply == vec![want, 0, 255]);
    let again = j.append(with_id(&pid, 1, "r1", 7)).await;
    ensure!(is_dup(&again, 1), "a request applied once was taken again: {again:?}");
    ensure!(j.last_seq(&pid).await.map_err(|e| e.to_string())? == 1, "a refused duplicate wrote events");
    ensure!(
        j.recorded_reply(&pid, "r1").await.map_err(|e| e.to_string())? == Some(vec![1, 0, 255]),
        "a refused duplicate replaced the recorded reply"
    );
    // Many at once (a database groups them): each duplicate is refused alone, the rest go on;
    // one request id on many entities is many requests.
    for i in 0..24u64 {
        j.append(with_id(&format!("{t}|m{i}"), 0, "r1", 1)).await.map_err(|e| e.to_string())?;
    }
    // Every entity gets a new request; the even ones also a duplicate (two appends to one
    // entity in a batch, which a database may run another way).
    let mut tasks = Vec::new();
    for i in 0..24u64 {
        let pid = format!("{t}|m{i}");
        let mut reqs = vec![(false, with_id(&pid, 1, "r2", 2))];
        if i % 2 == 0 {
            reqs.push((true, with_id(&pid, 1, "r1", 8)));
        }
        for (dup, req) in reqs {
            let journal = journal.clone();
            tasks.push(tokio::spawn(async move { (i, dup, journal.append(req).await) }));
        }
    }
    for task in tasks {
        let (i, dup, r) = task.await.map_err(|e| e.to_string())?;
        let ok = if dup { is_dup(&r, 1) } else { r == Ok(2) };
        ensure!(ok, "append {i} (a duplicate: {dup}) of a batch with duplicates: {r:?}");
    }
    // However many requests came after it, it is still refused.
    for k in 1..=100u64 {
        j.append(with_id(&pid, k, &format!("later-{k}"), 2)).await.map_err(|e| e.to_string())?;
    }
    let late = j.append(with_id(&pid, 101, "r1", 9)).await;
    ensure!(is_dup(&late, 1), "a request retried after 100 others was taken again: {late:?}");
    // Once its reply is older than kept, the id is new again.
    let_time_pass().await;
    let mut forget = with_id(&pid, 101, "r4", 4);
    forget.keep_replies = std::time::Duration::ZERO;
    j.append(forget).await.map_err(|e| e.to_string())?;
    ensure!(j.append(with_id(&pid, 102, "r1", 4)).await == Ok(103), "a request id older than kept was refused");
    Ok(())
}

/// Many writers at once (what a database may group into one transaction): each persistence id
/// gets its own gap-free history in the order its writer appended.
pub async fn concurrent_writers_keep_each_history_linear(journal: Arc<dyn Journal>, t: &str) -> Check {
    let f = fence(t, 0, e(1, 1));
    journal.raise_fence(&f).await.map_err(|e| e.to_string())?;
    let mut writers = Vec::new();
    for w in 0..32 {
        let (journal, f) = (journal.clone(), f.clone());
        let pid = format!("{t}|w{w}");
        writers.push(tokio::spawn(async move {
            for i in 0..10u64 {
                let mut req = append(&f, &pid, i, 1);
                req.events[0].payload = vec![w as u8, i as u8];
                journal.append(req).await.map_err(|e| format!("{pid} append {i}: {e}"))?;
            }
            let got = journal.read(&pid, 1).await.map_err(|e| e.to_string())?;
            let want: Vec<(u64, Vec<u8>)> = (0..10u64).map(|i| (i + 1, vec![w as u8, i as u8])).collect();
            let got: Vec<(u64, Vec<u8>)> = got.into_iter().map(|e| (e.seq, e.event.payload)).collect();
            if got != want {
                return Err(format!("{pid}: {got:?}"));
            }
            Ok::<(), String>(())
        }));
    }
    for w in writers {
        w.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// Replies and remembered entities are kept the same way when many appends go at once (what a
/// database may run as one batch or one pipeline), and of racing appends only the winner's reply
/// is recorded.
pub async fn concurrent_appends_record_and_remember(journal: Arc<dyn Journal>, t: &str) -> Check {
    let f = fence(t, 5, e(1, 1));
    journal.raise_fence(&f).await.map_err(|e| e.to_string())?;
    let mut writers = Vec::new();
    for w in 0..16u64 {
        let (journal, f) = (journal.clone(), f.clone());
        let pid = format!("{t}|w{w}");
        writers.push(tokio::spawn(async move {
            for i in 0..5u64 {
                let mut req = append(&f, &pid, i, 1);
                req.remember = true;
                req.reply = Some(RecordedReply { request_id: format!("req-{i}"), reply: vec![w as u8, i as u8] });
                journal.append(req).await.map_err(|e| format!("{pid} append {i}: {e}"))?;
            }
            for i in 0..5u64 {
                let got = journal.recorded_reply(&pid, &format!("req-{i}")).await.map_err(|e| e.to_string())?;
                let want = Some(vec![w as u8, i as u8]);
                if got != want {
                    return Err(format!("{pid} req-{i}: {got:?}, want {want:?}"));
                }
            }
            Ok::<(), String>(())
        }));
    }
    for w in writers {
        w.await.map_err(|e| e.to_string())??;
    }
    let remembered = journal.remembered(t, ShardId(5)).await.map_err(|e| e.to_string())?;
    ensure!(remembered.len() == 16, "remembered after concurrent appends: {remembered:?}");
    let pid = format!("{t}|race");
    let mut racers = Vec::new();
    for r in 0..8u64 {
        let (journal, f, pid) = (journal.clone(), f.clone(), pid.clone());
        racers.push(tokio::spawn(async move {
            let mut req = append(&f, &pid, 0, 1);
            req.reply = Some(RecordedReply { request_id: format!("racer-{r}"), reply: vec![r as u8] });
            journal.append(req).await.is_ok()
        }));
    }
    let mut won = Vec::new();
    for (r, h) in racers.into_iter().enumerate() {
        if h.await.map_err(|e| e.to_string())? {
            won.push(r);
        }
    }
    ensure!(won.len() == 1, "{} racers won", won.len());
    for r in 0..8u64 {
        let got = journal.recorded_reply(&pid, &format!("racer-{r}")).await.map_err(|e| e.to_string())?;
        ensure!(got.is_some() == (won[0] == r as usize), "racer-{r}'s reply: {got:?} (winner {})", won[0]);
    }
    Ok(())
}

/// `highest_term` is at least the term of every fence raised (other data may hold higher ones).
pub async fn the_highest_term_covers_every_fence(j: &dyn Journal, t: &str) -> Check {
    let before = j.highest_term().await.map_err(|e| e.to_string())?;
    let top = before + 3;
    j.raise_fence(&fence(t, 0, e(top - 1, 9))).await.map_err(|e| e.to_string())?;
    j.raise_fence(&fence(t, 1, e(top, 1))).await.map_err(|e| e.to_string())?;
    j.raise_fence(&fence(t, 2, e(1, 1))).await.map_err(|e| e.to_string())?;
    let after = j.highest_term().await.map_err(|e| e.to_string())?;
    ensure!(after >= top, "highest term {after} is below a raised fence's term {top}");
    Ok(())
}

/// Appends sent at once (one batch, for a journal that groups them), some fenced, some with a
/// stale sequence number: each gets its own answer, and only the good ones write anything.
pub async fn a_batch_refuses_only_its_bad_appends(journal: Arc<dyn Journal>, t: &str) -> Check {
    let good = fence(t, 0, e(2, 1));
    let stale = fence(t, 0, e(1, 1));
    journal.raise_fence(&good).await.map_err(|e| e.to_string())?;
    let mut tasks = Vec::new();
    for i in 0..48u64 {
        let j = journal.clone();
        let pid = format!("{t}|m{i}");
        let mut req = match i % 3 {
            0 => append(&stale, &pid, 0, 1),
            1 => append(&good, &pid, 5, 1),
            _ => append(&good, &pid, 0, 2),
        };
        req.reply = Some(RecordedReply { request_id: format!("r{i}"), reply: vec![i as u8] });
        tasks.push(tokio::spawn(async move { (i, j.append(req).await) }));
    }
    for task in tasks {
        let (i, r) = task.await.map_err(|e| e.to_string())?;
        let pid = format!("{t}|m{i}");
        let ok = match i % 3 {
            0 => matches!(r, Err(JournalError::Fenced { .. })),
            1 => matches!(r, Err(JournalError::Conflict { expected: 5, actual: 0, .. })),
            _ => r == Ok(2),
        };
        ensure!(ok, "append {i}: {r:?}");
        let events = journal.read(&pid, 1).await.map_err(|e| e.to_string())?.len();
        let reply = journal.recorded_reply(&pid, &format!("r{i}")).await.map_err(|e| e.to_string())?;
        let written = i % 3 == 2;
        ensure!(events == if written { 2 } else { 0 }, "append {i}: {events} events stored");
        ensure!(reply.is_some() == written, "append {i}: reply recorded {}", reply.is_some());
    }
    Ok(())
}

/// Two handles on one database (two node processes): a fence raised through one refuses the
/// other's older writes inside the database, and both see one history. Not in [`run_all`]: it
/// needs a second handle on the same store.
pub async fn two_handles_share_fences_and_history(a: &dyn Journal, b: &dyn Journal, t: &str) -> Check {
    let old = fence(t, 1, e(1, 1));
    let new = fence(t, 1, e(2, 1));
    let pid = format!("{t}|x");
    a.raise_fence(&old).await.map_err(|e| e.to_string())?;
    ensure!(a.append(append(&old, &pid, 0, 2)).await == Ok(2), "the first owner's append");
    b.raise_fence(&new).await.map_err(|e| e.to_string())?;
    let r = a.append(append(&old, &pid, 2, 1)).await;
    ensure!(is_fenced(&r), "the older owner's append after the raise through the other handle: {r:?}");
    ensure!(b.append(append(&new, &pid, 2, 1)).await == Ok(3), "the newer owner's append");
    let seen = a.read(&pid, 1).await.map_err(|e| e.to_string())?.len();
    ensure!(seen == 3, "the first handle sees {seen} events of 3");
    Ok(())
}
