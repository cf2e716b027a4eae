//! Durable reminders on real in-process nodes: they fire when due and not before, repeat until
//! cancelled, survive the crash of the node that set them and writes of unknown outcome, and an
//! event-sourced entity's firing is acknowledged in the append of what it did. Each test uses
//! the in-memory journal, shared by its nodes as a database would be.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{eventually, logs};
use serde::{Deserialize, Serialize};
use shardline::entity::Remind;
use shardline::journal::{
    AppendRequest, BoxFuture, Fence, InMemoryJournal, Journal, JournalError, RecordedReply, ReminderChange,
    ReminderPosition, Snapshot, StoredEvent, StoredReminder,
};
use shardline::{
    Cluster, Entity, EntityContext, EntityId, EntitySettings, Error, EventSourced, EventSourcedSettings, Gossip,
    Reminder, ShardId, When,
};

/// Every firing any `Alarm` handled: (entity, reminder, due, when it was handled).
static FIRED: Mutex<Vec<(String, String, SystemTime, SystemTime)>> = Mutex::new(Vec::new());

fn fired(entity: &str) -> Vec<(String, SystemTime, SystemTime)> {
    let all = FIRED.lock().unwrap_or_else(|e| e.into_inner());
    all.iter().filter(|f| f.0 == entity).map(|f| (f.1.clone(), f.2, f.3)).collect()
}

#[derive(Serialize, Deserialize)]
enum AlarmCmd {
    Once(String, u64),
    Every(String, u64),
    Cancel(String),
}

struct Alarm;

impl Entity for Alarm {
    type Message = AlarmCmd;
    type Reply = Result<(), Error>;

    fn new(_id: &EntityId) -> Self {
        Alarm
    }

    async fn handle(&mut self, ctx: &mut EntityContext, msg: AlarmCmd) -> Result<(), Error> {
        match msg {
            AlarmCmd::Once(name, ms) => ctx.remind(&name, When::After(Duration::from_millis(ms))).await,
            AlarmCmd::Every(name, ms) => ctx.remind(&name, When::Every(Duration::from_millis(ms))).await,
            AlarmCmd::Cancel(name) => ctx.cancel_reminder(&name).await,
        }
    }

    async fn reminded(&mut self, ctx: &mut EntityContext, r: Reminder) -> Result<(), Error> {
        let entry = (ctx.id().to_string(), r.name().to_string(), r.due(), SystemTime::now());
        FIRED.lock().unwrap_or_else(|e| e.into_inner()).push(entry);
        Ok(())
    }
}

fn alarms(journal: &InMemoryJournal) -> EntitySettings {
    EntitySettings::new("alarm").shards(8).journal(journal.clone()).reminders()
}

/// One node: a one-shot reminder fires once, not before it is due; a repeating one fires at
/// each period until cancelled; a type without reminders refuses `remind` with a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reminder_fires_when_due_and_a_repeating_one_until_cancelled() {
    logs();
    let journal = InMemoryJournal::new();
    let a = Cluster::builder().cluster_name("remind-one").build().await.unwrap();
    let h = a.register::<Alarm>(alarms(&journal)).await.unwrap();
    let set = SystemTime::now();
    h.entity_ref("one-1").ask(AlarmCmd::Once("wake".into(), 300)).await.unwrap().unwrap();
    h.entity_ref("one-2").ask(AlarmCmd::Every("tick".into(), 200)).await.unwrap().unwrap();
    eventually("the one-shot fired", Duration::from_secs(10), || !fired("one-1").is_empty()).await;
    eventually("three ticks", Duration::from_secs(10), || fired("one-2").len() >= 3).await;
    h.entity_ref("one-2").ask(AlarmCmd::Cancel("tick".into())).await.unwrap().unwrap();
    let after_cancel = fired("one-2").len();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let once = fired("one-1");
    assert_eq!(once.len(), 1, "{once:?}");
    let (_, due, at) = &once[0];
    assert!(*due >= set + Duration::from_millis(300), "due {due:?}, set {set:?}");
    assert!(at >= due, "fired at {at:?} before its due time {due:?}");
    let ticks = fired("one-2");
    assert!(ticks.len() <= after_cancel + 1, "ticks went on after the cancel: {} then {}", after_cancel, ticks.len());
    assert!(ticks.windows(2).all(|w| w[1].1 > w[0].1), "the ticks' due times do not advance: {ticks:?}");
    let stored = journal.due_reminders("alarm", h.shard_of("one-1"), None, u64::MAX >> 1, 10).await.unwrap();
    assert!(stored.iter().all(|r| r.entity_id != "one-1"), "a fired one-shot stays stored: {stored:?}");

    let plain = a.register::<Alarm>(EntitySettings::new("plain").shards(4)).await.unwrap();
    let r = plain.entity_ref("p").ask(AlarmCmd::Once("x".into(), 10)).await.unwrap();
    assert!(matches!(r, Err(Error::Rejected(_))), "{r:?}");
    let r = h.entity_ref("one-3").ask(AlarmCmd::Once(String::new(), 10)).await.unwrap();
    assert!(matches!(r, Err(Error::Rejected(_))), "an unnamed reminder: {r:?}");
    a.leave().await.unwrap();
}

/// Two nodes: the one hosting the entity crashes after the reminder was set and before it is
/// due. The survivor takes the shard, reads the reminder from the journal and fires it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reminder_fires_on_the_next_owner_after_a_crash() {
    logs();
    let journal = InMemoryJournal::new();
    let a = Cluster::builder().cluster_name("remind-crash").node_name("a").build().await.unwrap();
    let b = Cluster::builder()
        .cluster_name("remind-crash")
        .node_name("b")
        .membership(Gossip::new([a.local_addr().to_string()]))
        .build()
        .await
        .unwrap();
    let ha = a.register::<Alarm>(alarms(&journal)).await.unwrap();
    let hb = b.register::<Alarm>(alarms(&journal)).await.unwrap();
    a.formed(2).await.unwrap();
    // An entity whose shard b hosts.
    let id = (0..1000)
        .map(|i| format!("crash-{i}"))
        .find(|id| hb.hosted_shards().contains(&hb.shard_of(id)))
        .expect("b hosts a shard");
    hb.entity_ref(&id).ask(AlarmCmd::Once("wake".into(), 1_500)).await.unwrap().unwrap();
    b.crash();
    eventually("the reminder fired on a", Duration::from_secs(40), || !fired(&id).is_empty()).await;
    let f = fired(&id);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(ha.hosted_shards().contains(&ha.shard_of(&id)));
    a.leave().await.unwrap();
}

/// A reminder set by a write whose outcome the entity cannot know (the journal committed it,
/// then the connection was lost): `remind` says so with `OutcomeUnknown`, and the reminder,
/// stored, fires, though it is due before where the shard's schedule had read to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reminder_stored_by_a_write_of_unknown_outcome_fires() {
    logs();
    let shared = InMemoryJournal::new();
    let journal = Faulty::new(&shared);
    let a = Cluster::builder().cluster_name("remind-unknown").build().await.unwrap();
    let settings = EntitySettings::new("alarm").shards(8).journal(journal.clone()).reminders();
    let h = a.register::<Alarm>(settings).await.unwrap();
    // A first reminder fires: the shard's schedule has read the journal past the next one.
    h.entity_ref("unknown-1").ask(AlarmCmd::Once("first".into(), 10)).await.unwrap().unwrap();
    eventually("the first fired", Duration::from_secs(10), || !fired("unknown-1").is_empty()).await;
    journal.unknown_sets.store(true, Ordering::SeqCst);
    let r = h.entity_ref("unknown-1").ask(AlarmCmd::Once("second".into(), 300)).await.unwrap();
    assert!(matches!(r, Err(Error::OutcomeUnknown(_))), "{r:?}");
    journal.unknown_sets.store(false, Ordering::SeqCst);
    eventually("the reminder stored by the unknown write fired", Duration::from_secs(10), || {
        fired("unknown-1").iter().any(|f| f.0 == "second")
    })
    .await;
    a.leave().await.unwrap();
}

/// A journal with faults: while `refuse_acks` is set it refuses the acknowledgements of firings
/// (as if its node died after the entity handled the reminder and before the acknowledgement
/// was written); while `unknown_sets` is set it stores the reminders set and answers
/// `CommitUnknown` (the connection lost while the write committed).
#[derive(Clone)]
struct Faulty {
    inner: InMemoryJournal,
    refuse_acks: Arc<AtomicBool>,
    unknown_sets: Arc<AtomicBool>,
}

impl Faulty {
    fn new(inner: &InMemoryJournal) -> Self {
        Faulty { inner: inner.clone(), refuse_acks: Arc::default(), unknown_sets: Arc::default() }
    }
}

impl Journal for Faulty {
    fn raise_fence(&self, fence: &Fence) -> BoxFuture<'_, Result<shardline::Epoch, JournalError>> {
        self.inner.raise_fence(fence)
    }
    fn append(&self, request: AppendRequest) -> BoxFuture<'_, Result<u64, JournalError>> {
        self.inner.append(request)
    }
    fn read_page(&self, pid: &str, from: u64, max: usize) -> BoxFuture<'_, Result<Vec<StoredEvent>, JournalError>> {
        self.inner.read_page(pid, from, max)
    }
    fn last_seq(&self, pid: &str) -> BoxFuture<'_, Result<u64, JournalError>> {
        self.inner.last_seq(pid)
    }
    fn save_snapshot(&self, fence: &Fence, pid: &str, s: Snapshot) -> BoxFuture<'_, Result<(), JournalError>> {
        self.inner.save_snapshot(fence, pid, s)
    }
    fn load_snapshot(&self, pid: &str) -> BoxFuture<'_, Result<Option<Snapshot>, JournalError>> {
        self.inner.load_snapshot(pid)
    }
    fn recorded_reply(&self, pid: &str, id: &str) -> BoxFuture<'_, Result<Option<Vec<u8>>, JournalError>> {
        self.inner.recorded_reply(pid, id)
    }
    fn recorded_replies(&self, pid: &str, newest: usize) -> BoxFuture<'_, Result<Vec<RecordedReply>, JournalError>> {
        self.inner.recorded_replies(pid, newest)
    }
    fn remembered(&self, type_key: &str, shard: ShardId) -> BoxFuture<'_, Result<Vec<String>, JournalError>> {
        self.inner.remembered(type_key, shard)
    }
    fn forget(&self, fence: &Fence, entity_id: &str) -> BoxFuture<'_, Result<(), JournalError>> {
        self.inner.forget(fence, entity_id)
    }
    fn change_reminders(&self, fence: &Fence, changes: Vec<ReminderChange>) -> BoxFuture<'_, Result<(), JournalError>> {
        let ack = changes.iter().any(|c| matches!(c, ReminderChange::Fired { .. }));
        if ack && self.refuse_acks.load(Ordering::SeqCst) {
            return Box::pin(async { Err(JournalError::Unavailable("acknowledgements refused".into())) });
        }
        let set = changes.iter().any(|c| matches!(c, ReminderChange::Set(_)));
        if set && self.unknown_sets.load(Ordering::SeqCst) {
            let write = self.inner.change_reminders(fence, changes);
            return Box::pin(async move {
                write.await?;
                Err(JournalError::CommitUnknown("the connection was lost while committing".into()))
            });
        }
        self.inner.change_reminders(fence, changes)
    }
    fn due_reminders(
        &self,
        type_key: &str,
        shard: ShardId,
        after: Option<ReminderPosition>,
        until_ms: u64,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<StoredReminder>, JournalError>> {
        self.inner.due_reminders(type_key, shard, after, until_ms, max)
    }
    fn highest_term(&self) -> BoxFuture<'_, Result<u64, JournalError>> {
        self.inner.highest_term()
    }
}

/// An order that expires: placing it sets a reminder; the reminder's command appends
/// `Expired` every time it runs (naively: it does not look whether it expired already), so only
/// the runtime keeps a firing from being applied twice.
#[derive(Default, Serialize, Deserialize)]
struct Order {
    placed: bool,
    expired: u32,
}

#[derive(Serialize, Deserialize)]
enum OrderCmd {
    Place,
    Expire,
}

#[derive(Serialize, Deserialize)]
enum OrderEvent {
    Placed,
    Expired,
}

impl EventSourced for Order {
    type Command = OrderCmd;
    type Event = OrderEvent;
    type Reply = u32;
    const EVENT_TYPE: &'static str = "order";

    fn empty(_id: &EntityId) -> Self {
        Order::default()
    }

    fn apply(&mut self, e: &OrderEvent) {
        match e {
            OrderEvent::Placed => self.placed = true,
            OrderEvent::Expired => self.expired += 1,
        }
    }

    fn decide(&self, cmd: OrderCmd) -> (Vec<OrderEvent>, u32) {
        match cmd {
            OrderCmd::Place => (vec![OrderEvent::Placed], self.expired),
            OrderCmd::Expire => (vec![OrderEvent::Expired], self.expired + 1),
        }
    }

    fn reminders(e: &OrderEvent) -> Vec<Remind> {
        match e {
            OrderEvent::Placed => vec![Remind::set("expire", When::After(Duration::from_millis(300)))],
            OrderEvent::Expired => vec![],
        }
    }

    fn on_reminder(&self, r: &Reminder) -> Option<OrderCmd> {
        (r.name() == "expire").then_some(OrderCmd::Expire)
    }
}

/// The node hosting an order handles its expiry reminder (the `Expired` event is stored) but
/// cannot write acknowledgements of its own, then crashes. The firing was acknowledged in the
/// append that stored `Expired`, so the reminder is gone already, and the survivor
/// has nothing to fire again, whenever it takes the shard over (even after the entity has
/// forgotten the firing's request id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_is_acknowledged_in_the_append_of_its_command() {
    logs();
    let shared = InMemoryJournal::new();
    let mut nodes = Vec::new();
    for name in ["a", "b"] {
        let mut builder = Cluster::builder().cluster_name("remind-once").node_name(name);
        if let Some((first, _, _)) = nodes.first() {
            builder = builder.membership(Gossip::new([Cluster::local_addr(first).to_string()]));
        }
        let c = builder.build().await.unwrap();
        let journal = Faulty::new(&shared);
        let settings = EntitySettings::new("order").shards(8).journal(journal.clone()).reminders();
        let h = c.register_event_sourced::<Order>(settings, EventSourcedSettings::default()).await.unwrap();
        nodes.push((c, h, journal));
    }
    nodes[0].0.formed(2).await.unwrap();
    // An order on b (not a, the seed, which stays up).
    let (b, hb, jb) = &nodes[1];
    let id = (0..1000)
        .map(|i| format!("order-{i}"))
        .find(|id| hb.entity_handle().hosted_shards().contains(&hb.entity_handle().shard_of(id)))
        .expect("b hosts a shard");
    jb.refuse_acks.store(true, Ordering::SeqCst);
    hb.ask(&id, OrderCmd::Place).await.unwrap();
    let pid = format!("order|{id}");
    let expired = |events: &[StoredEvent]| events.iter().filter(|e| e.event.payload == [1]).count();
    let started = std::time::Instant::now();
    while expired(&shared.read(&pid, 1).await.unwrap()) == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "the order never expired on b");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let shard = hb.entity_handle().shard_of(&id);
    let stored = shared.due_reminders("order", shard, None, u64::MAX >> 1, 10).await.unwrap();
    assert!(stored.is_empty(), "the append that stored the expiry did not acknowledge it: {stored:?}");
    b.crash();
    // The survivor hosts the shard and has read its reminders, none of which is this one.
    let (a, ha, _) = &nodes[0];
    let started = std::time::Instant::now();
    while !ha.entity_handle().hosted_shards().contains(&shard) {
        assert!(started.elapsed() < Duration::from_secs(40), "a never took the shard over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let events = shared.read(&pid, 1).await.unwrap();
    assert_eq!(expired(&events), 1, "the expiry was applied {} times", expired(&events));
    assert_eq!(ha.ask(&id, OrderCmd::Place).await.unwrap(), 1);
    a.leave().await.unwrap();
}
