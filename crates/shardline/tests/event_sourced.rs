//! Event-sourced entities on a shared journal: state that survives a crash, fencing by the
//! journal, exactly-once retried asks, snapshots, and a journal that is down.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{eventually, logs};
use serde::{Deserialize, Serialize};
use shardline::entity::Persist;
use shardline::journal::conformance::append;
use shardline::journal::{
    AppendRequest, BoxFuture, EventRecord, Fence, InMemoryJournal, Journal, JournalError, RecordedReply,
    ReminderChange, ReminderPosition, Snapshot, StoredEvent, StoredReminder,
};
use shardline::{
    Cluster, EntityId, EntitySettings, Epoch, Error, EventSourced, EventSourcedHandle, EventSourcedSettings, Gossip,
    RequestId, ShardId,
};

#[derive(Default, Serialize, Deserialize)]
struct Tally {
    n: u64,
}

#[derive(Debug, Serialize, Deserialize)]
enum TallyCmd {
    Add(u64),
    Get,
    /// Adds without needing the total: answers 0.
    Log(u64),
}

#[derive(Serialize, Deserialize)]
struct Added(u64);

impl EventSourced for Tally {
    type Command = TallyCmd;
    type Event = Added;
    type Reply = u64;
    const EVENT_TYPE: &'static str = "tally.added";

    fn empty(_id: &EntityId) -> Self {
        Tally::default()
    }

    fn apply(&mut self, Added(k): &Added) {
        self.n += k;
    }

    fn decide(&self, command: TallyCmd) -> (Vec<Added>, u64) {
        match command {
            TallyCmd::Add(k) => (vec![Added(k)], self.n + k),
            TallyCmd::Get => (Vec::new(), self.n),
            TallyCmd::Log(k) => (vec![Added(k)], 0),
        }
    }

    fn decide_without_state(command: &TallyCmd) -> Option<(Vec<Added>, u64)> {
        match command {
            TallyCmd::Log(k) => Some((vec![Added(*k)], 0)),
            _ => None,
        }
    }
}

const SHARDS: u32 = 8;

async fn node(
    cluster: &str,
    name: &str,
    seed: Option<&Cluster>,
    journal: &InMemoryJournal,
    es: EventSourcedSettings,
) -> (Cluster, EventSourcedHandle<Tally>) {
    let settings = EntitySettings::new("tally").shards(SHARDS).journal(Arc::new(journal.clone()));
    node_with(cluster, name, seed, settings, es).await
}

async fn node_with(
    cluster: &str,
    name: &str,
    seed: Option<&Cluster>,
    settings: EntitySettings,
    es: EventSourcedSettings,
) -> (Cluster, EventSourcedHandle<Tally>) {
    logs();
    let mut b = Cluster::builder().cluster_name(cluster).node_name(name);
    if let Some(s) = seed {
        b = b.membership(Gossip::new([s.local_addr().to_string()]));
    }
    let c = b.build().await.expect("node starts");
    let h = c.register_event_sourced::<Tally>(settings, es).await.expect("registers");
    (c, h)
}

/// Entities of a crashed node come back elsewhere with every acknowledged event: the journal,
/// not the node's memory, holds their state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_a_crash_of_its_node() {
    let journal = InMemoryJournal::new();
    let es = EventSourcedSettings::default();
    let (a, ha) = node("es-crash", "a", None, &journal, es).await;
    let (_b, hb) = node("es-crash", "b", Some(&a), &journal, es).await;
    let hb2 = hb.clone();
    eventually("b hosts shards", Duration::from_secs(30), move || !hb2.entity_handle().hosted_shards().is_empty())
        .await;
    let ha2 = ha.clone();
    eventually("a hosts shards", Duration::from_secs(30), move || !ha2.entity_handle().hosted_shards().is_empty())
        .await;
    for i in 0..40u64 {
        for _ in 0..3 {
            hb.ask(format!("t{i}"), TallyCmd::Add(i + 1)).await.expect("acknowledged");
        }
    }
    let on_a = ha.entity_handle().hosted_shards();
    assert!((0..40).any(|i| on_a.contains(&hb.entity_handle().shard_of(format!("t{i}")))), "some tally lives on a");
    a.crash();
    let hb2 = hb.clone();
    eventually("b hosts every shard", Duration::from_secs(60), move || {
        hb2.entity_handle().hosted_shards().len() == SHARDS as usize
    })
    .await;
    for i in 0..40u64 {
        assert_eq!(hb.ask(format!("t{i}"), TallyCmd::Get).await.unwrap(), 3 * (i + 1), "t{i}");
    }
}

/// The same request id twice: applied once, the same reply twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_is_applied_once() {
    let journal = InMemoryJournal::new();
    let (_c, h) = node("es-retry", "solo", None, &journal, EventSourcedSettings::default()).await;
    assert_eq!(h.ask_with_request_id("x", TallyCmd::Add(5), RequestId::new("req-1")).await.unwrap(), 5);
    assert_eq!(
        h.ask_with_request_id("x", TallyCmd::Add(5), RequestId::new("req-1")).await.unwrap(),
        5,
        "the recorded reply"
    );
    assert_eq!(h.ask("x", TallyCmd::Get).await.unwrap(), 5, "applied once");
    assert_eq!(
        h.ask_with_request_id("x", TallyCmd::Add(5), RequestId::new("req-2")).await.unwrap(),
        10,
        "a new request applies"
    );
    assert_eq!(journal.read("tally|x", 1).await.unwrap().len(), 2);
}

/// A journal as one node sees it: every call goes to `inner`, but the append of request `lost`
/// is committed and never answered, as when the node is killed between its commit and its
/// reply; with `recoveries`, each recovery (its snapshot's load) takes 20 ms and is counted
/// while it runs; with `replayed`, the events read back are counted.
struct Watched {
    inner: InMemoryJournal,
    lost: Option<String>,
    recoveries: Option<Arc<Recoveries>>,
    replayed: Option<Arc<std::sync::atomic::AtomicUsize>>,
    /// How many reads of the remembered entities fail before one is answered.
    unlisted: Arc<std::sync::atomic::AtomicUsize>,
}

/// Recoveries running now, and the most at any moment.
#[derive(Default)]
struct Recoveries {
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl Journal for Watched {
    fn raise_fence(&self, fence: &Fence) -> BoxFuture<'_, Result<Epoch, JournalError>> {
        self.inner.raise_fence(fence)
    }
    fn append(&self, request: AppendRequest) -> BoxFuture<'_, Result<u64, JournalError>> {
        let lost = request.reply.as_ref().is_some_and(|r| Some(&r.request_id) == self.lost.as_ref());
        Box::pin(async move {
            let r = self.inner.append(request).await;
            if lost {
                std::future::pending::<()>().await;
            }
            r
        })
    }
    fn read_page(&self, pid: &str, from: u64, max: usize) -> BoxFuture<'_, Result<Vec<StoredEvent>, JournalError>> {
        let Some(counted) = self.replayed.clone() else { return self.inner.read_page(pid, from, max) };
        let pid = pid.to_string();
        Box::pin(async move {
            let page = self.inner.read_page(&pid, from, max).await?;
            counted.fetch_add(page.len(), std::sync::atomic::Ordering::SeqCst);
            Ok(page)
        })
    }
    fn last_seq(&self, pid: &str) -> BoxFuture<'_, Result<u64, JournalError>> {
        self.inner.last_seq(pid)
    }
    fn save_snapshot(&self, fence: &Fence, pid: &str, s: Snapshot) -> BoxFuture<'_, Result<(), JournalError>> {
        self.inner.save_snapshot(fence, pid, s)
    }
    fn load_snapshot(&self, pid: &str) -> BoxFuture<'_, Result<Option<Snapshot>, JournalError>> {
        let Some(counted) = self.recoveries.clone() else { return self.inner.load_snapshot(pid) };
        let pid = pid.to_string();
        Box::pin(async move {
            use std::sync::atomic::Ordering::SeqCst;
            let now = counted.now.fetch_add(1, SeqCst) + 1;
            counted.most.fetch_max(now, SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let r = self.inner.load_snapshot(&pid).await;
            counted.now.fetch_sub(1, SeqCst);
            r
        })
    }
    fn recorded_reply(&self, pid: &str, request_id: &str) -> BoxFuture<'_, Result<Option<Vec<u8>>, JournalError>> {
        self.inner.recorded_reply(pid, request_id)
    }
    fn recorded_replies(&self, pid: &str, newest: usize) -> BoxFuture<'_, Result<Vec<RecordedReply>, JournalError>> {
        self.inner.recorded_replies(pid, newest)
    }
    fn remembered(&self, type_key: &str, shard: ShardId) -> BoxFuture<'_, Result<Vec<String>, JournalError>> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.unlisted.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Box::pin(async { Err(JournalError::Unavailable("the journal is restarting".into())) });
        }
        self.inner.remembered(type_key, shard)
    }
    fn forget(&self, fence: &Fence, entity_id: &str) -> BoxFuture<'_, Result<(), JournalError>> {
        self.inner.forget(fence, entity_id)
    }
    fn change_reminders(&self, fence: &Fence, changes: Vec<ReminderChange>) -> BoxFuture<'_, Result<(), JournalError>> {
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

/// How a deposit was once applied twice after a kill -9 (the design notes): its node committed
/// it and died before answering, the caller waited out its timeout, the new owner took far more
/// later requests to the entity than it keeps replies in memory (64 were all an entity once kept
/// at all), and then the retry came. It is answered with the first reply, and applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_request_committed_by_a_node_that_died_before_answering_is_applied_once() {
    let journal = InMemoryJournal::new();
    let es = EventSourcedSettings::default();
    let dying = Watched {
        inner: journal.clone(),
        lost: Some("deposit-1".into()),
        recoveries: None,
        replayed: None,
        unlisted: Default::default(),
    };
    let settings = EntitySettings::new("tally").shards(SHARDS).journal(Arc::new(dying));
    let (a, ha) = node_with("es-lost", "a", None, settings, es).await;
    let (_b, hb) = node("es-lost", "b", Some(&a), &journal, es).await;
    let hb2 = hb.clone();
    eventually("b hosts shards", Duration::from_secs(30), move || !hb2.entity_handle().hosted_shards().is_empty())
        .await;
    let ha2 = ha.clone();
    eventually("a hosts shards", Duration::from_secs(30), move || !ha2.entity_handle().hosted_shards().is_empty())
        .await;
    let on_a = ha.entity_handle().hosted_shards();
    let id = (0..1_000)
        .map(|i| format!("t{i}"))
        .find(|id| on_a.contains(&hb.entity_handle().shard_of(id)))
        .expect("a hosts one");
    let first = RequestId::new("deposit-1");
    let err = hb
        .ask_persist(
            &id,
            Persist { request_id: Some(first.clone()), command: TallyCmd::Add(1) },
            Duration::from_secs(5),
        )
        .await;
    assert!(matches!(err, Err(Error::Timeout(_))), "no answer: {err:?}");
    assert_eq!(journal.read(&format!("tally|{id}"), 1).await.unwrap().len(), 1, "committed before the timeout");
    a.crash();
    let hb2 = hb.clone();
    eventually("b hosts every shard", Duration::from_secs(60), move || {
        hb2.entity_handle().hosted_shards().len() == SHARDS as usize
    })
    .await;
    let later = es.replies_in_memory as u64 + 36;
    for _ in 0..later {
        hb.ask(&id, TallyCmd::Add(1)).await.expect("acknowledged");
    }
    assert_eq!(hb.ask_with_request_id(&id, TallyCmd::Add(1), first).await.unwrap(), 1, "the first reply");
    assert_eq!(hb.ask(&id, TallyCmd::Get).await.unwrap(), 1 + later, "applied once");
}

/// Another node raised the shard's fence in the journal (it owns the shard now, whatever this
/// node believes): this node's writes are refused by the journal, and nothing is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_is_refused_by_the_journal() {
    let journal = InMemoryJournal::new();
    let (_c, h) = node("es-fenced", "solo", None, &journal, EventSourcedSettings::default()).await;
    assert_eq!(h.ask("y", TallyCmd::Add(1)).await.unwrap(), 1);
    let shard = h.entity_handle().shard_of("y");
    let newer = Fence { type_key: "tally".into(), shard, epoch: Epoch { term: u64::MAX / 2, seq: 1 } };
    journal.raise_fence(&newer).await.unwrap();
    let err = h.ask("y", TallyCmd::Add(1)).await.expect_err("fenced");
    assert!(err.is_safe_to_retry(), "not applied: {err:?}");
    assert_eq!(journal.read("tally|y", 1).await.unwrap().len(), 1, "nothing written after the raise");
}

/// A snapshot every 10 events; a new owner recovers from it plus the events after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_written_every_n_events_and_used_to_recover() {
    let journal = InMemoryJournal::new();
    let es = EventSourcedSettings { snapshot_every: 10, ..EventSourcedSettings::default() };
    let (a, h) = node("es-snap", "a", None, &journal, es).await;
    for _ in 0..25 {
        h.ask("z", TallyCmd::Add(2)).await.unwrap();
    }
    let snap = journal.load_snapshot("tally|z").await.unwrap().expect("a snapshot");
    assert_eq!(snap.seq, 20);
    // b joins, a leaves: z's shard starts on b, which recovers it from the snapshot and 21..=25.
    let (_b, hb) = node("es-snap", "b", Some(&a), &journal, es).await;
    let hb2 = hb.clone();
    eventually("b is given shards", Duration::from_secs(30), move || !hb2.entity_handle().hosted_shards().is_empty())
        .await;
    a.leave_within(Duration::from_secs(20)).await.unwrap();
    assert_eq!(hb.ask("z", TallyCmd::Get).await.unwrap(), 50);
}

/// However long an entity's history, a recovery reads its snapshot and at most `snapshot_every`
/// events after it: that is what bounds its time (the journal bench times one such recovery).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_replays_no_more_than_the_events_after_the_last_snapshot() {
    let journal = InMemoryJournal::new();
    let es = EventSourcedSettings { snapshot_every: 100, ..EventSourcedSettings::default() };
    let (a, ha) = node("es-bounded", "a", None, &journal, es).await;
    // b counts what it reads back.
    let replayed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watched = Watched {
        inner: journal.clone(),
        lost: None,
        recoveries: None,
        replayed: Some(replayed.clone()),
        unlisted: Default::default(),
    };
    let settings = EntitySettings::new("tally").shards(SHARDS).journal(Arc::new(watched));
    let (_b, hb) = node_with("es-bounded", "b", Some(&a), settings, es).await;
    let hb2 = hb.clone();
    eventually("b hosts shards", Duration::from_secs(30), move || !hb2.entity_handle().hosted_shards().is_empty())
        .await;
    let ha2 = ha.clone();
    eventually("a hosts shards", Duration::from_secs(30), move || !ha2.entity_handle().hosted_shards().is_empty())
        .await;
    let on_a = ha.entity_handle().hosted_shards();
    let id = (0..).map(|i| format!("long{i}")).find(|id| on_a.contains(&hb.entity_handle().shard_of(id))).unwrap();
    for _ in 0..1_050 {
        hb.ask(&id, TallyCmd::Add(1)).await.expect("acknowledged");
    }
    // Only the recovery after the crash counts (a rebalance may have moved the entity before).
    replayed.store(0, std::sync::atomic::Ordering::SeqCst);
    a.crash();
    let hb2 = hb.clone();
    eventually("b hosts every shard", Duration::from_secs(60), move || {
        hb2.entity_handle().hosted_shards().len() == SHARDS as usize
    })
    .await;
    assert_eq!(hb.ask(&id, TallyCmd::Get).await.unwrap(), 1_050);
    let read = replayed.load(std::sync::atomic::Ordering::SeqCst);
    assert!(read <= 100, "replayed {read} events of a history of 1,050 with a snapshot every 100");
    let pid = format!("tally|{id}");
    assert_eq!(journal.load_snapshot(&pid).await.unwrap().map(|s| s.seq), Some(1_000));
}

/// While the journal is down, commands fail as not applied; afterwards they work, and nothing
/// acknowledged was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_that_is_down_fails_commands_as_not_applied() {
    let journal = InMemoryJournal::new();
    let (_c, h) = node("es-down", "solo", None, &journal, EventSourcedSettings::default()).await;
    assert_eq!(h.ask("w", TallyCmd::Add(3)).await.unwrap(), 3);
    journal.set_down(true);
    let err = h.ask("w", TallyCmd::Add(3)).await.expect_err("down");
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    journal.set_down(false);
    assert_eq!(h.ask("w", TallyCmd::Add(3)).await.unwrap(), 6);
}

/// A journal in which tally `id`'s first event is of a type the entity does not know. Written
/// before the node starts: its claim raises the fence past this writer's epoch.
async fn with_an_unknown_event(id: &str) -> InMemoryJournal {
    let journal = InMemoryJournal::new();
    let shard = EntitySettings::new("tally").shards(SHARDS).shard_of(id);
    let f = Fence { type_key: "tally".into(), shard, epoch: Epoch { term: 0, seq: 1 } };
    journal.raise_fence(&f).await.unwrap();
    let mut req = append(&f, &format!("tally|{id}"), 0, 0);
    req.events = vec![EventRecord { type_name: "tally.renamed".into(), schema_version: 1, payload: vec![1] }];
    journal.append(req).await.unwrap();
    journal
}

/// An event of a type the entity does not know is a typed error naming where it is, never a
/// silent skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_event_is_refused_with_its_place() {
    let journal = with_an_unknown_event("u").await;
    let (_c, h) = node("es-unknown", "solo", None, &journal, EventSourcedSettings::default()).await;
    let err = h.ask("u", TallyCmd::Get).await.expect_err("unreadable");
    assert!(matches!(&err, Error::Rejected(m) if m.contains("tally|u event 1")), "{err:?}");
}

/// A command that needs no state is appended without reading the history: it succeeds on an
/// entity whose history cannot even be read (its first event is of an unknown type), where a
/// command that needs the state is refused; a retried one is still applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_needs_no_state_does_not_recover() {
    let journal = with_an_unknown_event("b").await;
    let (_c, h) = node("es-blind", "solo", None, &journal, EventSourcedSettings::default()).await;
    assert_eq!(h.ask("b", TallyCmd::Log(5)).await, Ok(0), "appended without recovering");
    assert_eq!(h.ask_with_request_id("b", TallyCmd::Log(7), RequestId::new("log-7")).await, Ok(0));
    assert_eq!(h.ask_with_request_id("b", TallyCmd::Log(7), RequestId::new("log-7")).await, Ok(0), "the retry");
    assert_eq!(journal.read("tally|b", 1).await.unwrap().len(), 3, "the unknown event, then two logs");
    let err = h.ask("b", TallyCmd::Get).await.expect_err("reading the state needs the history");
    assert!(matches!(&err, Error::Rejected(m) if m.contains("tally|b event 1")), "{err:?}");
}

/// With remembered entities, every entity that wrote starts again, recovered, when its shard
/// starts on another node, before anyone asks for it; entities that never wrote do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_entities_start_again_where_their_shard_starts() {
    let journal = InMemoryJournal::new();
    let settings =
        || EntitySettings::new("tally").shards(SHARDS).journal(Arc::new(journal.clone())).remember_entities(1_000);
    let es = EventSourcedSettings::default();
    let (a, ha) = node_with("es-remember", "a", None, settings(), es).await;
    for i in 0..12u64 {
        ha.ask(format!("r{i}"), TallyCmd::Add(i)).await.unwrap();
    }
    // A read writes nothing, so it is not remembered.
    ha.ask("reader", TallyCmd::Get).await.unwrap();
    // b joins and a leaves: every shard starts on b, its remembered entities with it.
    let (_b, hb) = node_with("es-remember", "b", Some(&a), settings(), es).await;
    let hb3 = hb.clone();
    eventually("b is given shards", Duration::from_secs(30), move || !hb3.entity_handle().hosted_shards().is_empty())
        .await;
    a.leave_within(Duration::from_secs(20)).await.unwrap();
    let hb2 = hb.clone();
    let started = std::time::Instant::now();
    while hb2.entity_handle().local_entities() != 12 {
        if started.elapsed() > Duration::from_secs(30) {
            let mut remembered = Vec::new();
            for s in 0..SHARDS {
                remembered.push(journal.remembered("tally", shardline::ShardId(s)).await.map(|v| v.len()));
            }
            panic!(
                "remembered entities on b: {} in memory, shards {:?}, remembered per shard {remembered:?}",
                hb2.entity_handle().local_entities(),
                hb2.entity_handle().hosted_epochs()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 0..12u64 {
        assert_eq!(hb.ask(format!("r{i}"), TallyCmd::Get).await.unwrap(), i);
    }
}

/// Remembered entities restart under back-pressure: however fast their rate allows, at most
/// `remember_at_once` of them recover at a time on a node (each holds its place until it has
/// recovered), and every one of them starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_entities_recover_a_few_at_a_time() {
    let journal = InMemoryJournal::new();
    let recoveries = Arc::new(Recoveries::default());
    let settings = |recoveries: Option<Arc<Recoveries>>| {
        let watched =
            Watched { inner: journal.clone(), lost: None, recoveries, replayed: None, unlisted: Default::default() };
        EntitySettings::new("tally")
            .shards(SHARDS)
            .journal(Arc::new(watched))
            .remember_entities(100_000)
            .remember_at_once(4)
    };
    let es = EventSourcedSettings::default();
    let (a, ha) = node_with("es-at-once", "a", None, settings(None), es).await;
    for i in 0..120u64 {
        ha.ask(format!("r{i}"), TallyCmd::Add(i)).await.unwrap();
    }
    let (_b, hb) = node_with("es-at-once", "b", Some(&a), settings(Some(recoveries.clone())), es).await;
    let hb2 = hb.clone();
    eventually("b hosts shards", Duration::from_secs(30), move || !hb2.entity_handle().hosted_shards().is_empty())
        .await;
    // Crashed, so that nothing is handed over: every entity recovers on b.
    a.crash();
    let hb2 = hb.clone();
    eventually("every remembered entity starts on b", Duration::from_secs(60), move || {
        hb2.entity_handle().local_entities() == 120
    })
    .await;
    let most = recoveries.most.load(std::sync::atomic::Ordering::SeqCst);
    assert!((2..=4).contains(&most), "{most} recoveries at once (at most 4, and more than one)");
    for i in (0..120u64).step_by(7) {
        assert_eq!(hb.ask(format!("r{i}"), TallyCmd::Get).await.unwrap(), i);
    }
}

/// A journal that cannot list a shard's remembered entities when the shard starts (it is
/// restarting) is asked again: the entities start, only later. Before, a failed read left them
/// to start on demand only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_entities_start_even_when_the_journal_cannot_list_them_at_first() {
    let journal = InMemoryJournal::new();
    let unlisted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let settings = || {
        let watched = Watched {
            inner: journal.clone(),
            lost: None,
            recoveries: None,
            replayed: None,
            unlisted: unlisted.clone(),
        };
        EntitySettings::new("tally").shards(SHARDS).journal(Arc::new(watched)).remember_entities(1_000)
    };
    let es = EventSourcedSettings::default();
    let (a, ha) = node_with("es-unlisted", "a", None, settings(), es).await;
    for i in 0..12u64 {
        ha.ask(format!("r{i}"), TallyCmd::Add(i)).await.unwrap();
    }
    let (_b, hb) = node_with("es-unlisted", "b", Some(&a), settings(), es).await;
    let hb2 = hb.clone();
    eventually("b hosts shards", Duration::from_secs(30), move || !hb2.entity_handle().hosted_shards().is_empty())
        .await;
    // Every shard's first reads fail, more of them than there are shards.
    unlisted.store(2 * SHARDS as usize, std::sync::atomic::Ordering::SeqCst);
    a.crash();
    let hb2 = hb.clone();
    eventually("every remembered entity starts on b", Duration::from_secs(60), move || {
        hb2.entity_handle().local_entities() == 12
    })
    .await;
    assert_eq!(unlisted.load(std::sync::atomic::Ordering::SeqCst), 0, "every failed read was asked again");
}

/// A cluster restarted from scratch on the journal of an earlier run whose leadership changed:
/// the journal's fences carry a term the new run never heard of, and nobody told it a floor.
/// The cluster must take the floor from its journal itself and serve; a write refused meanwhile
/// must not be an error that invites retrying forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restarted_on_its_journal_after_a_leadership_change_serves_again() {
    let journal = InMemoryJournal::new();
    let es = EventSourcedSettings::default();
    let (a, _ha) = node("es-restart", "a", None, &journal, es).await;
    let (b, hb) = node("es-restart", "b", Some(&a), &journal, es).await;
    let hb2 = hb.clone();
    eventually("b hosts shards", Duration::from_secs(30), move || !hb2.entity_handle().hosted_shards().is_empty())
        .await;
    // The first leader dies: b leads on, in a higher term, and writes every tally.
    a.crash();
    let hb2 = hb.clone();
    eventually("b hosts every shard", Duration::from_secs(60), move || {
        hb2.entity_handle().hosted_shards().len() == SHARDS as usize
    })
    .await;
    for i in 0..20u64 {
        assert_eq!(hb.ask(format!("t{i}"), TallyCmd::Add(1)).await.unwrap(), 1);
    }
    let stored = journal.highest_term().await.unwrap();
    b.crash();
    // The second run: the same journal, no floor given.
    let (_a2, h2) = node("es-restart", "a", None, &journal, es).await;
    let started = std::time::Instant::now();
    for i in 0..20u64 {
        loop {
            match h2.ask(format!("t{i}"), TallyCmd::Add(1)).await {
                Ok(n) => {
                    assert_eq!(n, 2, "t{i}");
                    break;
                }
                Err(e) => {
                    assert!(e.is_safe_to_retry(), "t{i}: {e:?}");
                    assert!(started.elapsed() < Duration::from_secs(30), "still refused after 30 s: {e:?}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    assert!(journal.highest_term().await.unwrap() > stored, "the new run took a term above the old one's");
}
