//! Durable reminders on PostgreSQL beyond the conformance suite: the ways a writer batches the
//! appends that carry them (one statement for a batch, one per append, one savepoint each), the
//! changes that name a reminder twice, the order of ids the database compares, and the numbers
//! at the edges of what it stores. Each is checked against the in-memory journal, the reference.
//!
//! Needs: PostgreSQL at `SHARDLINE_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`, trust authentication), in a schema of its own
//! dropped at the end. A server that cannot be reached fails the test, naming the URL.

use shardline::journal::conformance::append;
use shardline::journal::{
    AppendRequest, Fence, InMemoryJournal, Journal, JournalError, ReminderChange, ReminderPosition, StoredReminder,
    MAX_DUE_MS,
};
use shardline::{Epoch, ShardId};
use shardline_postgres::{PostgresConfig, PostgresJournal};

fn url() -> String {
    std::env::var("SHARDLINE_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn config(name: &str) -> PostgresConfig {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    PostgresConfig::new(url()).schema(format!("shardline_test_{name}_{}_{nanos}", std::process::id()))
}

async fn journal(config: &PostgresConfig) -> shardline::journal::QueuedJournal {
    match PostgresJournal::connect(config.clone()).await {
        Ok(j) => j,
        Err(e) => panic!("this test needs PostgreSQL at {} (set SHARDLINE_TEST_POSTGRES): {e}", url()),
    }
}

const TYPE: &str = "timer";

fn fence() -> Fence {
    Fence { type_key: TYPE.into(), shard: ShardId(0), epoch: Epoch { term: 1, seq: 0 } }
}

fn set(entity: &str, name: &str, due_ms: u64, every_ms: u64) -> ReminderChange {
    ReminderChange::Set(StoredReminder { entity_id: entity.into(), name: name.into(), due_ms, every_ms })
}

fn fired(entity: &str, name: &str, due_ms: u64, next_ms: Option<u64>) -> ReminderChange {
    ReminderChange::Fired { entity_id: entity.into(), name: name.into(), due_ms, next_ms }
}

/// Every reminder of shard 0 due before `until`, read `page` at a time.
async fn all(j: &dyn Journal, until: u64, page: usize) -> Vec<StoredReminder> {
    let (mut out, mut after): (Vec<StoredReminder>, Option<ReminderPosition>) = (Vec::new(), None);
    loop {
        let got = j.due_reminders(TYPE, ShardId(0), after.clone(), until, page).await.expect("due reminders read");
        let full = got.len() == page;
        after = got.last().map(StoredReminder::position).or(after);
        out.extend(got);
        if !full {
            return out;
        }
    }
}

/// A small deterministic generator (xorshift), so that a failure repeats.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    /// One of `entity`'s two reminder names.
    fn name(&mut self) -> &'static str {
        ["x", "y"][self.roll(2) as usize]
    }

    /// A change of `entity`'s reminder `name`, due at one of three times, so that firings often
    /// find what they acknowledge and often do not.
    fn change(&mut self, entity: &str, name: &str) -> ReminderChange {
        let due = 100 * (1 + self.roll(3));
        match self.roll(4) {
            0 => set(entity, name, due, 100 * self.roll(2)),
            1 => ReminderChange::Cancel { entity_id: entity.into(), name: name.into() },
            2 => fired(entity, name, due, None),
            _ => fired(entity, name, due, Some(due + 100)),
        }
    }
}

/// Appends carrying reminder changes, sent together so that the writers batch them in each of
/// their ways, and acknowledgements between them, leave what the in-memory journal leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_appends_and_changes_leave_what_the_reference_leaves() {
    let config = config("remind_batches");
    let pg = journal(&config).await;
    let reference = InMemoryJournal::new();
    let f = fence();
    for j in [&pg as &dyn Journal, &reference] {
        j.raise_fence(&f).await.expect("fence raised");
    }
    let entities: Vec<String> = (0..12).map(|i| format!("e{i}")).collect();
    let mut dice = Dice(0x9e37_79b9_7f4a_7c15);
    let mut seq = vec![0u64; entities.len()];
    // Up to two changes of distinct reminders, or (`twice`) up to three that may change one
    // reminder twice.
    let request = |dice: &mut Dice, i: usize, expected: u64, twice: bool| -> AppendRequest {
        let e = &entities[i];
        let mut r = append(&f, &format!("{TYPE}|{e}"), expected, 1);
        for k in 0..dice.roll(if twice { 4 } else { 3 }) as usize {
            let name = if twice { dice.name() } else { ["x", "y"][k] };
            r.reminders.push(dice.change(e, name));
        }
        r
    };
    for step in 0..24 {
        // One append per entity (distinct entities and reminders: the batched statement), or
        // several per entity at once (the same entity twice in a batch: a statement per append,
        // in order), or appends that change a reminder twice (a savepoint each).
        let (per_entity, twice) = match step % 4 {
            0 | 2 => (1, false),
            1 => (1, true),
            _ => (3, false),
        };
        let mut requests = Vec::new();
        for _ in 0..per_entity {
            for (i, s) in seq.iter_mut().enumerate() {
                requests.push(request(&mut dice, i, *s, twice));
                *s += 1;
            }
        }
        for r in &requests {
            reference.append(r.clone()).await.expect("the reference appends");
        }
        let sent: Vec<_> = requests.into_iter().map(|r| pg.append(r)).collect();
        for (k, r) in futures_util::future::join_all(sent).await.into_iter().enumerate() {
            assert!(r.is_ok(), "step {step}, append {k}: {r:?}");
        }
        // Acknowledgements of a shard's reminders, as its owner sends them.
        let mut acks = Vec::new();
        for _ in 0..6 {
            let (e, n) = (&entities[dice.roll(entities.len() as u64) as usize], dice.name());
            acks.push(dice.change(e, n));
        }
        reference.change_reminders(&f, acks.clone()).await.expect("the reference changes");
        pg.change_reminders(&f, acks).await.expect("changed");
        let want = all(&reference, u64::MAX, 1000).await;
        for page in [1, 4, 1000] {
            assert_eq!(all(&pg, u64::MAX, page).await, want, "step {step}, pages of {page}");
        }
    }
    shardline_postgres::drop_schema(&config).await.expect("schema dropped");
}

/// In a batch of appends, a refused one (stale, or with a change that cannot be stored) writes
/// none of its reminder changes and the others write theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_append_in_a_batch_writes_no_reminder() {
    let config = config("remind_refused");
    let pg = journal(&config).await;
    let f = fence();
    pg.raise_fence(&f).await.expect("fence raised");
    for bad in [None, Some(set("bad", "", 5, 0)), Some(set("bad", "far", MAX_DUE_MS + 1, 0))] {
        let mut requests = Vec::new();
        for i in 0..20 {
            let pid = format!("{TYPE}|ok-{i}");
            let expected = pg.last_seq(&pid).await.expect("last seq");
            let mut r = append(&f, &pid, expected, 1);
            r.reminders = vec![set(&format!("ok-{i}"), "x", 1_000 + expected, 0)];
            requests.push(r);
        }
        // A stale one, and one refused for its change, among them.
        let mut stale = append(&f, &format!("{TYPE}|stale"), 99, 1);
        stale.reminders = vec![set("stale", "x", 7, 0)];
        requests.insert(5, stale);
        if let Some(change) = &bad {
            let mut refused = append(&f, &format!("{TYPE}|bad"), 0, 1);
            refused.reminders = vec![set("bad", "fine", 8, 0), change.clone()];
            requests.insert(10, refused);
        }
        let sent: Vec<_> = requests.into_iter().map(|r| pg.append(r)).collect();
        let results = futures_util::future::join_all(sent).await;
        for (k, r) in results.iter().enumerate() {
            match (k, r) {
                (5, Err(JournalError::Conflict { .. })) => {}
                (10, Err(JournalError::Failed(_))) if bad.is_some() => {}
                (k, Ok(_)) if k != 5 && (k != 10 || bad.is_none()) => {}
                (k, r) => panic!("with {bad:?}, append {k}: {r:?}"),
            }
        }
        assert_eq!(pg.last_seq(&format!("{TYPE}|bad")).await, Ok(0), "the refused append wrote events");
        let got = all(&pg, u64::MAX, 100).await;
        assert_eq!(got.len(), 20, "with {bad:?}: {got:?}");
        assert!(got.iter().all(|r| r.entity_id.starts_with("ok-")), "with {bad:?}: {got:?}");
    }
    shardline_postgres::drop_schema(&config).await.expect("schema dropped");
}

/// A change the database refuses (text it cannot hold) fails alone: the changes batched with it
/// in one transaction are written, whichever way each was sent (one statement, or one per
/// change of the same reminder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_the_database_refuses_fails_alone() {
    let config = config("remind_alone");
    let pg = journal(&config).await;
    let f = fence();
    pg.raise_fence(&f).await.expect("fence raised");
    let bad = "nul\0byte";
    let lists: Vec<Vec<ReminderChange>> = (0..40)
        .map(|i| match i % 10 {
            3 => vec![set("ok", &format!("n{i}"), 5, 0), set(bad, "x", 5, 0)],
            7 => vec![set(bad, "x", 5, 0), ReminderChange::Cancel { entity_id: bad.into(), name: "x".into() }],
            _ => vec![set("ok", &format!("n{i}"), 5, 0), set("ok", &format!("m{i}"), 6, 0)],
        })
        .collect();
    let sent: Vec<_> = lists.into_iter().map(|c| pg.change_reminders(&f, c)).collect();
    for (i, r) in futures_util::future::join_all(sent).await.into_iter().enumerate() {
        let refused = matches!(i % 10, 3 | 7);
        match r {
            Err(JournalError::Failed(_)) if refused => {}
            Ok(()) if !refused => {}
            r => panic!("change {i}: {r:?}"),
        }
    }
    let got = all(&pg, u64::MAX, 1000).await;
    assert_eq!(got.len(), 32 * 2, "{got:?}");
    assert!(got.iter().all(|r| r.entity_id == "ok"), "{got:?}");
    shardline_postgres::drop_schema(&config).await.expect("schema dropped");
}

/// Pages follow the byte order of ids, as Rust orders strings, whatever the database's locale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_follow_the_byte_order_of_ids() {
    let config = config("remind_order");
    let pg = journal(&config).await;
    let f = fence();
    pg.raise_fence(&f).await.expect("fence raised");
    let ids = ["b", "B", "a", "A", "_a", "a b", "ab", "a-b", "é", "e", "z", "Z", "ä", "日本", "10", "9", "~"];
    let mut changes = Vec::new();
    for (k, id) in ids.iter().enumerate() {
        changes.push(set(id, "n", 500, 0));
        changes.push(set(id, ids[(k + 3) % ids.len()], 500, 0));
    }
    pg.change_reminders(&f, changes.clone()).await.expect("changed");
    let mut want: Vec<StoredReminder> =
        changes.into_iter().filter_map(|c| if let ReminderChange::Set(r) = c { Some(r) } else { None }).collect();
    want.sort_by_key(StoredReminder::position);
    for page in [1, 2, 5, 100] {
        assert_eq!(all(&pg, 501, page).await, want, "pages of {page}");
    }
    shardline_postgres::drop_schema(&config).await.expect("schema dropped");
}

/// The edges of what the database stores: the largest due time is stored and read, a bound past
/// it reads up to it, a period it cannot hold refuses the batch, a firing of a time it cannot
/// hold acknowledges nothing, and a value the journal never writes is corrupt, not a default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_at_the_edges_of_the_database() {
    let config = config("remind_edges");
    let pg = journal(&config).await;
    let f = fence();
    pg.raise_fence(&f).await.expect("fence raised");
    pg.change_reminders(&f, vec![set("a", "last", MAX_DUE_MS, 0), set("a", "first", 0, 0)]).await.expect("changed");
    let dues = |v: Vec<StoredReminder>| v.into_iter().map(|r| r.due_ms).collect::<Vec<_>>();
    assert_eq!(dues(all(&pg, u64::MAX, 10).await), vec![0, MAX_DUE_MS]);
    assert_eq!(dues(all(&pg, MAX_DUE_MS, 10).await), vec![0]);
    assert_eq!(dues(all(&pg, 0, 10).await), Vec::<u64>::new());
    let none = pg.due_reminders(TYPE, ShardId(0), None, u64::MAX, 0).await;
    assert_eq!(none, Ok(Vec::new()));
    let past = Some(ReminderPosition::before(u64::MAX));
    assert_eq!(pg.due_reminders(TYPE, ShardId(0), past, u64::MAX, 10).await, Ok(Vec::new()));
    let got = pg.change_reminders(&f, vec![set("b", "x", 5, 0), set("a", "first", 1, u64::MAX)]).await;
    assert!(matches!(got, Err(JournalError::Failed(_))), "{got:?}");
    pg.change_reminders(&f, vec![fired("a", "last", u64::MAX, None)]).await.expect("nothing acknowledged");
    assert_eq!(dues(all(&pg, u64::MAX, 10).await), vec![0, MAX_DUE_MS]);
    // A writer fenced out hears it before it hears that its change cannot be stored.
    let old = Fence { epoch: Epoch { term: 0, seq: 0 }, ..f.clone() };
    let got = pg.change_reminders(&old, vec![set("a", "", 1, 0)]).await;
    assert!(matches!(got, Err(JournalError::Fenced { .. })), "{got:?}");

    let (client, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls).await.expect("connects");
    tokio::spawn(conn);
    let table = format!("{}.shardline_reminders", config.schema);
    for (row, what) in [("'a', 'neg', 0, -5, 0", "a negative due time"), ("'a', 'neg', 0, 5, -1", "a negative period")]
    {
        client.batch_execute(&format!("DELETE FROM {table} WHERE name = 'neg'")).await.expect("deleted");
        client
            .batch_execute(&format!(
                "INSERT INTO {table} (type_key, entity_id, name, shard, due_ms, every_ms) VALUES ('{TYPE}', {row})"
            ))
            .await
            .expect("inserted");
        let got = pg.due_reminders(TYPE, ShardId(0), None, 100, 10).await;
        assert!(matches!(got, Err(JournalError::Corrupt { .. })), "{what}: {got:?}");
    }
    shardline_postgres::drop_schema(&config).await.expect("schema dropped");
}
