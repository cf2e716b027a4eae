//! `ReminderSchedule` against a model of the journal: reads that are answered late (their page
//! taken at any moment between the request and the answer), local changes committed while a
//! read is in flight, acknowledgements that commit later than the firing (or in the entity's own
//! transaction, before it), firings that fail, writes whose outcome is unknown. Checked after
//! every step: a firing is of the reminder the journal holds now (never of one cancelled,
//! replaced or already acknowledged), no firing of a due time is delivered twice unless the
//! first was not handled or a write of unknown outcome touched it, memory stays within pages; and at the end, with time run
//! past every due time, every reminder that fell due has fired.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use shardline_core::reminder::{
    next_due, Firing, ReadRequest, ReminderChange, ReminderPosition, ReminderSchedule, ScheduleConfig, StoredReminder,
};

type Key = (String, String);

/// The journal: the reminders of the shard by key.
#[derive(Default, Clone)]
struct Db(BTreeMap<Key, (u64, u64)>);

impl Db {
    fn page(&self, r: &ReadRequest) -> Vec<StoredReminder> {
        let mut all: Vec<StoredReminder> = self
            .0
            .iter()
            .map(|((e, n), (due, every))| StoredReminder {
                entity_id: e.clone(),
                name: n.clone(),
                due_ms: *due,
                every_ms: *every,
            })
            .filter(|s| s.due_ms < r.until_ms && r.after.as_ref().is_none_or(|a| &s.position() > a))
            .collect();
        all.sort_by_key(StoredReminder::position);
        all.truncate(r.max);
        all
    }

    fn apply(&mut self, c: &ReminderChange) {
        match c {
            ReminderChange::Set(r) => {
                self.0.insert((r.entity_id.clone(), r.name.clone()), (r.due_ms, r.every_ms));
            }
            ReminderChange::Cancel { entity_id, name } => {
                self.0.remove(&(entity_id.clone(), name.clone()));
            }
            ReminderChange::Fired { entity_id, name, due_ms, next_ms } => {
                let key = (entity_id.clone(), name.clone());
                if self.0.get(&key).is_some_and(|(d, _)| d == due_ms) {
                    match next_ms {
                        Some(n) => {
                            if let Some(v) = self.0.get_mut(&key) {
                                v.0 = *n;
                            }
                        }
                        None => {
                            self.0.remove(&key);
                        }
                    }
                }
            }
        }
    }
}

struct World {
    db: Db,
    s: ReminderSchedule,
    now: u64,
    /// The read in flight, and the page once taken (not answered yet).
    read: Option<(ReadRequest, Option<Vec<StoredReminder>>)>,
    firing: Vec<Firing>,
    acking: Vec<ReminderChange>,
    /// Firings delivered and not failed, by (key, due).
    delivered: HashMap<(Key, u64), u32>,
    config: ScheduleConfig,
}

impl World {
    fn new(config: ScheduleConfig) -> Self {
        World {
            db: Db::default(),
            s: ReminderSchedule::new(config),
            now: 1_000_000,
            read: None,
            firing: Vec::new(),
            acking: Vec::new(),
            delivered: HashMap::new(),
            config,
        }
    }

    fn key(w: u64) -> Key {
        (format!("e{}", w % 7), format!("n{}", (w >> 3) % 3))
    }

    /// The driver's turn: ask for a read, fire what is due.
    fn poll(&mut self) -> Result<(), TestCaseError> {
        if self.read.is_none() {
            if let Some(r) = self.s.read_due(self.now) {
                self.read = Some((r, None));
            }
        }
        for f in self.s.take_due(self.now) {
            let key = (f.entity_id.clone(), f.name.clone());
            let stored = self.db.0.get(&key).copied();
            prop_assert_eq!(stored.map(|s| s.0), Some(f.due_ms), "fired {:?}, the journal holds {:?}", f, stored);
            prop_assert!(f.due_ms <= self.now, "fired early: {:?} at {}", f, self.now);
            let n = self.delivered.entry((key, f.due_ms)).or_default();
            prop_assert_eq!(*n, 0, "{:?} delivered twice", f);
            *n += 1;
            self.firing.push(f);
        }
        let bound = 2 * self.config.page + 21 + self.firing.len() + self.acking.len();
        prop_assert!(self.s.len() <= bound, "{} known, bound {}", self.s.len(), bound);
        Ok(())
    }

    fn step(&mut self, w: u64) -> Result<(), TestCaseError> {
        let arg = w >> 8;
        match w % 10 {
            // Time passes.
            0 | 1 => self.now += arg % 3_000,
            // The entity sets or cancels a reminder: committed, then the schedule learns it.
            2 | 3 => {
                let (e, n) = World::key(arg);
                let c = if arg % 5 == 0 {
                    ReminderChange::Cancel { entity_id: e, name: n }
                } else {
                    let due = self.now + (arg >> 5) % 40_000;
                    let every = if arg % 3 == 0 { 500 + (arg >> 9) % 5_000 } else { 0 };
                    ReminderChange::Set(StoredReminder { entity_id: e, name: n, due_ms: due, every_ms: every })
                };
                // One in four writes loses its connection while committing: stored or not, the
                // entity cannot tell, and a firing of that reminder may come again.
                let unknown = (arg >> 40) % 4 == 0;
                if !unknown || (arg >> 42) % 2 == 0 {
                    self.db.apply(&c);
                }
                if unknown {
                    let key = (c.entity_id().to_string(), c.name().to_string());
                    self.delivered.retain(|(k, _), _| *k != key);
                    self.s.unsure(&key.0, &key.1);
                } else {
                    self.s.changed(&c);
                }
            }
            // The read in flight takes its page, or is answered.
            4 | 5 => match self.read.take() {
                Some((r, None)) if arg % 4 == 0 => {
                    self.s.read_done(&r, None);
                }
                Some((r, None)) => {
                    let page = self.db.page(&r);
                    self.read = Some((r, Some(page)));
                }
                Some((r, Some(page))) => self.s.read_done(&r, Some(page)),
                None => {}
            },
            // A firing is handled (or not).
            6 | 7 => {
                if !self.firing.is_empty() {
                    let f = self.firing.remove(arg as usize % self.firing.len());
                    let handled = arg % 6 != 0;
                    if !handled {
                        self.delivered.remove(&((f.entity_id.clone(), f.name.clone()), f.due_ms));
                    } else if (arg >> 40) % 3 == 0 {
                        // The entity stored the acknowledgement in its own transaction (an
                        // event-sourced one's append): the driver's own write changes nothing.
                        self.db.apply(&f.ack());
                        self.s.changed(&f.ack());
                    }
                    if let Some(ack) = self.s.fired(&f, handled, self.now) {
                        self.acking.push(ack);
                    }
                }
            }
            // An acknowledgement commits.
            _ => {
                if !self.acking.is_empty() {
                    let ack = self.acking.remove(arg as usize % self.acking.len());
                    self.db.apply(&ack);
                    if let (ReminderChange::Fired { entity_id, name, due_ms, .. }, 0) = (&ack, (arg >> 40) % 4) {
                        // The entity sets it again, at the very time that fired, before the
                        // driver learns that the acknowledgement committed: a new reminder.
                        let again = StoredReminder {
                            entity_id: entity_id.clone(),
                            name: name.clone(),
                            due_ms: *due_ms,
                            every_ms: 0,
                        };
                        self.delivered.remove(&((entity_id.clone(), name.clone()), *due_ms));
                        let c = ReminderChange::Set(again);
                        self.db.apply(&c);
                        self.s.changed(&c);
                    }
                    self.s.acked(&ack);
                }
            }
        }
        self.poll()
    }

    /// No more changes: reads answered at once, firings handled, acknowledgements committed,
    /// time run to `end`.
    fn settle(&mut self, end: u64) -> Result<(), TestCaseError> {
        for _ in 0..100_000 {
            if let Some((r, page)) = self.read.take() {
                let page = page.unwrap_or_else(|| self.db.page(&r));
                self.s.read_done(&r, Some(page));
            }
            for f in std::mem::take(&mut self.firing) {
                if let Some(ack) = self.s.fired(&f, true, self.now) {
                    self.acking.push(ack);
                }
            }
            for ack in std::mem::take(&mut self.acking) {
                self.db.apply(&ack);
                self.s.acked(&ack);
            }
            self.poll()?;
            if self.read.is_some() || !self.firing.is_empty() {
                continue;
            }
            match self.s.next_wake(self.now) {
                Some(at) if at <= end => self.now = self.now.max(at),
                _ => return Ok(()),
            }
        }
        Err(TestCaseError::fail("the schedule never settles"))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn reminders_fire_once_each_and_none_is_lost(
        script in proptest::collection::vec(any::<u64>(), 0..600),
        page in 1usize..6,
        lookahead in 1_000u64..60_000,
    ) {
        let config = ScheduleConfig { lookahead_ms: lookahead, page, retry_ms: 700 };
        let mut w = World::new(config);
        w.poll()?;
        for op in script {
            w.step(op)?;
        }
        let end = w.now + 100_000;
        w.settle(end)?;
        // Everything due before the end fired and was acknowledged: a one-shot is gone, a
        // repeating one is due after the end.
        for (key, (due, every)) in &w.db.0 {
            prop_assert!(*due > end, "{:?} due at {} (every {}) never fired; the end is {}", key, due, every, end);
        }
    }
}

#[test]
fn a_repeating_reminder_skips_the_times_missed_while_nobody_hosted_it() {
    assert_eq!(next_due(1_000, 100, 1_050), Some(1_100));
    assert_eq!(next_due(1_000, 100, 5_555), Some(5_600));
}

#[test]
fn a_million_pending_reminders_are_read_a_page_at_a_time() {
    // 1M reminders due over a day: the schedule asks for pages of at most `page`, only those
    // within the lookahead, and keeps no more than that in memory.
    let mut db = Db::default();
    for i in 0..1_000_000u64 {
        db.0.insert((format!("e{i}"), "r".into()), (1_000 + i * 86, 0));
    }
    let config = ScheduleConfig { lookahead_ms: 30_000, page: 1024, retry_ms: 1_000 };
    let mut s = ReminderSchedule::new(config);
    let mut now = 1_000;
    let (mut reads, mut fired) = (0, 0u64);
    let mut most = 0;
    while now < 1_000 + 200_000 {
        while let Some(r) = s.read_due(now) {
            reads += 1;
            assert!(r.until_ms <= now + 30_000);
            let page = db.page(&r);
            assert!(page.len() <= 1024);
            s.read_done(&r, Some(page));
        }
        most = most.max(s.len());
        for f in s.take_due(now) {
            let ack = s.fired(&f, true, now).expect("handled");
            db.apply(&ack);
            s.acked(&ack);
            fired += 1;
        }
        now = s.next_wake(now).unwrap_or(now + 1).max(now + 1);
    }
    // About 200 s / 86 ms fell due, and fired.
    assert!((2_300..=2_330).contains(&fired), "{fired} fired");
    assert!(most <= 1024, "{most} in memory at once");
    assert!(reads < 100, "{reads} reads");
    let _ = ReminderPosition::before(0);
}

#[test]
fn a_burst_due_at_once_is_read_no_faster_than_it_fires() {
    // 5,000 reminders due at the same moment, and firings that take their time: the schedule
    // reads a page only while fewer than a page are known, so fewer than two pages are ever
    // known, however fast pages could be read.
    let mut db = Db::default();
    for i in 0..5_000u64 {
        db.0.insert((format!("e{i}"), "r".into()), (1_000, 0));
    }
    let config = ScheduleConfig { lookahead_ms: 30_000, page: 100, retry_ms: 1_000 };
    let mut s = ReminderSchedule::new(config);
    let mut firing = Vec::new();
    for step in 0..200 {
        while let Some(r) = s.read_due(2_000) {
            let page = db.page(&r);
            s.read_done(&r, Some(page));
        }
        firing.extend(s.take_due(2_000));
        assert!(s.len() < 200, "{} known at step {step}", s.len());
        // One firing in ten completes per step.
        for f in firing.drain(..firing.len().min(10)) {
            let ack = s.fired(&f, true, 2_000).expect("handled");
            db.apply(&ack);
            s.acked(&ack);
        }
    }
}
