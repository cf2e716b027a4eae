//! Failure drills for a [`Journal`] backend, run by event-sourced entities on real nodes: what
//! the [`conformance`](crate::journal::conformance) suite checks call by call, these check end to end,
//! against the real database in each backend's tests.
//!
//! - [`two_owners_of_one_shard`]: two nodes that both believe they own a shard write to it; the
//!   database refuses the older epoch, and the entity's history stays one line.
//! - [`outage_under_load`]: the database goes away under load and comes back; asks fail
//!   meanwhile, callers resend with their request ids what may have been applied and give up
//!   what they are told was not, and afterwards, per entity, every acknowledged command is
//!   applied exactly once and none given up is, by the same node, which was never restarted.
//!
//! Each returns a description of the first broken promise.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shardline_core::{EntityId, Epoch, ShardId};

use crate::entity::{EventSourced, EventSourcedHandle, EventSourcedSettings};
use crate::journal::conformance::Check;
use crate::journal::{AppendRequest, EventRecord, Fence, Journal, JournalError};
use crate::{Cluster, EntitySettings, Error, Gossip, Processed};

/// The drills' entity: a sum of additions.
#[derive(Default, Serialize, Deserialize)]
pub struct Sum {
    total: u64,
    adds: u64,
}

/// What a [`Sum`] is asked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum SumCmd {
    /// Adds; answers the new total.
    Add(u64),
    /// Answers the total.
    Get,
}

/// What a [`Sum`] persists.
#[derive(Serialize, Deserialize)]
pub struct Added(u64);

impl EventSourced for Sum {
    type Command = SumCmd;
    type Event = Added;
    type Reply = u64;
    const EVENT_TYPE: &'static str = "drill.added";

    fn empty(_id: &EntityId) -> Self {
        Sum::default()
    }

    fn apply(&mut self, Added(k): &Added) {
        self.total += k;
        self.adds += 1;
    }

    fn decide(&self, command: SumCmd) -> (Vec<Added>, u64) {
        match command {
            SumCmd::Add(k) => (vec![Added(k)], self.total + k),
            SumCmd::Get => (Vec::new(), self.total),
        }
    }
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            return Err(format!($($msg)*));
        }
    };
}

/// A lone node (a cluster of its own) hosting every shard of `type_key` on `journal`; its
/// seeds terms start above the journal's fences, as a node's do.
async fn lone_node(
    journal: &Arc<dyn Journal>,
    cluster: &str,
    type_key: &str,
) -> Result<(Cluster, EventSourcedHandle<Sum>), String> {
    let floor = journal.highest_term().await.map_err(|e| format!("highest term: {e}"))?;
    let c = Cluster::builder()
        .cluster_name(cluster)
        .node_name(cluster)
        .membership(Gossip::new(Vec::<String>::new()).term_floor(floor))
        .build()
        .await
        .map_err(|e| format!("{cluster} starts: {e}"))?;
    let settings = EntitySettings::new(type_key).shards(4).journal(journal.clone()).ask_timeout(Duration::from_secs(3));
    let h = c
        .register_event_sourced::<Sum>(settings, EventSourcedSettings::default())
        .await
        .map_err(|e| format!("{cluster} registers: {e}"))?;
    Ok((c, h))
}

/// The events of entity `id` of `type_key`, in order: their sequence numbers must run 1, 2, …
/// without a gap, and each must decode; returns the values added.
async fn stored_adds(journal: &Arc<dyn Journal>, type_key: &str, id: &str) -> Result<Vec<u64>, String> {
    let pid = crate::entity::event_sourced::persistence_id(type_key, id);
    let events = journal.read(&pid, 1).await.map_err(|e| format!("{pid}: read: {e}"))?;
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    ensure!(seqs.iter().copied().eq(1..=seqs.len() as u64), "{pid}: one linear history from 1, found {seqs:?}");
    events
        .iter()
        .map(|e| postcard::from_bytes::<Added>(&e.event.payload).map(|Added(k)| k))
        .collect::<Result<Vec<u64>, _>>()
        .map_err(|e| format!("{pid}: an event cannot be decoded: {e}"))
}

/// The epoch at which `h`'s node hosts `shard`.
fn hosted_at(h: &EventSourcedHandle<Sum>, shard: ShardId, who: &str) -> Result<Epoch, String> {
    let hosted = h.entity_handle().hosted_epochs();
    hosted.iter().find(|(s, _)| *s == shard).map(|(_, e)| *e).ok_or(format!("{who} does not host {shard}: {hosted:?}"))
}

/// Two nodes host the same shard: each is a cluster of its own on one journal (a split brain,
/// forced). The second starts later, so at a newer epoch; once it has written, every write of
/// the first is refused by the database as fenced and applies nothing, and the entity's history
/// is one line: the first node's events, then the second's.
///
/// The first owner's writes carry the sequence number the journal holds at that moment, so no
/// sequence conflict can refuse them: only the fence can.
pub async fn two_owners_of_one_shard(journal: Arc<dyn Journal>, prefix: &str) -> Check {
    let type_key = format!("{prefix}-owners");
    let (old, old_h) = lone_node(&journal, &format!("{prefix}-old"), &type_key).await?;
    for k in 1..=3 {
        old_h.ask("e", SumCmd::Add(k)).await.map_err(|e| format!("the first owner's write {k}: {e}"))?;
    }
    let (new, new_h) = lone_node(&journal, &format!("{prefix}-new"), &type_key).await?;
    ensure!(new_h.ask("e", SumCmd::Get).await == Ok(6), "the second owner recovers the first one's events");
    ensure!(new_h.ask("e", SumCmd::Add(10)).await == Ok(16), "the second owner writes");
    let shard = old_h.entity_handle().shard_of("e");
    let old_epoch = hosted_at(&old_h, shard, "the first owner")?;
    let new_epoch = hosted_at(&new_h, shard, "the second owner")?;
    ensure!(old_epoch < new_epoch, "the second owner hosts at {new_epoch}, not newer than the first's {old_epoch}");

    // The first owner appends as its entity would, at its own epoch, after the last event stored
    // (read just now): the sequence number is right, the epoch is not.
    let pid = crate::entity::event_sourced::persistence_id(&type_key, "e");
    let last = journal.last_seq(&pid).await.map_err(|e| format!("last seq: {e}"))?;
    ensure!(last == 4, "four events before the first owner's late write, found {last}");
    let payload = postcard::to_allocvec(&Added(100)).map_err(|e| format!("an event cannot be encoded: {e}"))?;
    let late = AppendRequest {
        fence: Fence { type_key: type_key.clone(), shard, epoch: old_epoch },
        persistence_id: pid.clone(),
        entity_id: "e".into(),
        expected_seq: last,
        events: vec![EventRecord { type_name: Sum::EVENT_TYPE.into(), schema_version: Sum::SCHEMA_VERSION, payload }],
        remember: false,
        reply: None,
        keep_replies: Duration::from_secs(60),
        reminders: Vec::new(),
    };
    match journal.append(late).await {
        Err(JournalError::Fenced { mine, stored: Some(stored), .. }) if mine == old_epoch && stored >= new_epoch => {}
        other => {
            return Err(format!(
                "the first owner's append at {old_epoch} after event {last} (the last stored) is not refused as \
                 fenced at {new_epoch}: {other:?}"
            ))
        }
    }

    // The same through the first owner's entity, which still believes it owns the shard. Its
    // first write carries the sequence number it last saw (3); once refused, the entity reads
    // its history again, so its second write carries the current one (4) and only the fence
    // stands in its way.
    for attempt in 1..=2 {
        match old_h.ask("e", SumCmd::Add(100)).await {
            Err(e) if e.is_safe_to_retry() => {}
            other => return Err(format!("the first owner's entity, write {attempt} after the second's: {other:?}")),
        }
        let now = journal.last_seq(&pid).await.map_err(|e| format!("last seq: {e}"))?;
        ensure!(now == last, "the first owner's entity, write {attempt}: {now} events stored, {last} before");
    }
    ensure!(new_h.ask("e", SumCmd::Add(20)).await == Ok(36), "the newer owner goes on");
    let adds = stored_adds(&journal, &type_key, "e").await?;
    ensure!(adds == [1, 2, 3, 10, 20], "the first owner's events, then the second's, found {adds:?}");
    old.crash();
    new.crash();
    Ok(())
}

/// What one caller of [`outage_under_load`] was told, per entity: the operations acknowledged,
/// and those answered "not applied" and given up (never sent again).
#[derive(Default)]
struct Told {
    acked: BTreeMap<String, Vec<u64>>,
    not_applied: BTreeMap<String, Vec<u64>>,
}

/// A node under load from 4 callers, each sending `Add(op)` with a value `op` unique to the
/// operation and a request id; `cut` takes the database away, `restore` brings it back.
///
/// A caller resends an operation with its request id while its outcome is unknown (a timeout,
/// say), and gives it up once told it was not applied (that is the answer a caller can act on:
/// the operation is not in the journal, and never will be). Asks must fail while the database is
/// away, each with an error that says whether it was applied; afterwards the same node serves
/// again, and per entity the journal holds every acknowledged operation exactly once, none of
/// those given up, and nothing else.
pub async fn outage_under_load<C, R>(journal: Arc<dyn Journal>, prefix: &str, cut: C, restore: R) -> Check
where
    C: Future<Output = ()>,
    R: Future<Output = ()>,
{
    const ENTITIES: u64 = 8;
    let type_key = format!("{prefix}-outage");
    let (node, h) = lone_node(&journal, &type_key, &type_key).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let next_op = Arc::new(AtomicU64::new(1));
    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let errors: Arc<Mutex<Vec<Error>>> = Arc::default();
    let mut callers = Vec::new();
    for _ in 0..4 {
        let (h, stop, next_op, answered, failed, errors) =
            (h.clone(), stop.clone(), next_op.clone(), answered.clone(), failed.clone(), errors.clone());
        let prefix = prefix.to_string();
        callers.push(tokio::spawn(async move {
            let mut told = Told::default();
            while !stop.load(Ordering::Acquire) {
                let op = next_op.fetch_add(1, Ordering::AcqRel);
                let id = format!("s{}", op % ENTITIES);
                let rid = crate::RequestId::new(format!("{prefix}-op-{op}"));
                // Whether an earlier attempt may have been applied: then only an answer (or the
                // recorded one) settles it, and the operation is sent until it comes.
                let mut maybe_applied = false;
                let give_up = Instant::now() + Duration::from_secs(60);
                loop {
                    let e = match h.ask_with_request_id(&id, SumCmd::Add(op), rid.clone()).await {
                        Ok(_) => {
                            told.acked.entry(id.clone()).or_default().push(op);
                            answered.fetch_add(1, Ordering::AcqRel);
                            break;
                        }
                        Err(e) => e,
                    };
                    failed.fetch_add(1, Ordering::AcqRel);
                    errors.lock().unwrap_or_else(|e| e.into_inner()).push(e.clone());
                    let processed = e.processed();
                    maybe_applied |= processed == Processed::Maybe;
                    if processed == Processed::Yes {
                        return Err(format!("{id} op {op}: applied, yet unanswered, during an outage: {e:?}"));
                    }
                    if Instant::now() >= give_up {
                        return Err(format!("{id} op {op} ({rid}) unanswered for 60 s: {e}"));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if !maybe_applied {
                        told.not_applied.entry(id.clone()).or_default().push(op);
                        break;
                    }
                }
            }
            Ok(told)
        }));
    }
    // Waits until `counter` is `more` past `from`.
    let wait_for = |counter: &Arc<AtomicU64>, from: u64, more: u64, what: &'static str| {
        let counter = counter.clone();
        async move {
            let target = from + more;
            let give_up = Instant::now() + Duration::from_secs(60);
            while counter.load(Ordering::Acquire) < target {
                ensure!(Instant::now() < give_up, "{what}: fewer than {more} in 60 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(())
        }
    };
    let now = |counter: &Arc<AtomicU64>| counter.load(Ordering::Acquire);
    wait_for(&answered, now(&answered), 50, "answers before the outage").await?;
    let failed_before = now(&failed);
    cut.await;
    // The outage lasts a few seconds, and at least until the callers felt it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    wait_for(&failed, failed_before, 8, "asks failing while the database is away").await?;
    restore.await;
    wait_for(&answered, now(&answered), 50, "answers after the database came back").await?;
    stop.store(true, Ordering::Release);
    let mut told = Told::default();
    for c in callers {
        let t = c.await.map_err(|e| format!("a caller panicked: {e}"))??;
        for (id, ops) in t.acked {
            told.acked.entry(id).or_default().extend(ops);
        }
        for (id, ops) in t.not_applied {
            told.not_applied.entry(id).or_default().extend(ops);
        }
    }
    let errors = errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for e in &errors {
        ensure!(
            matches!(e, Error::Unavailable(_) | Error::OutcomeUnknown(_) | Error::Timeout(_)),
            "an outage error that does not say whether it was applied: {e:?}"
        );
    }
    for n in 0..ENTITIES {
        let id = format!("s{n}");
        let acked = told.acked.get(&id).cloned().unwrap_or_default();
        let not_applied = told.not_applied.get(&id).cloned().unwrap_or_default();
        let mut stored: BTreeMap<u64, usize> = BTreeMap::new();
        for op in stored_adds(&journal, &type_key, &id).await? {
            *stored.entry(op).or_default() += 1;
        }
        for op in &acked {
            match stored.get(op).copied().unwrap_or(0) {
                1 => {}
                0 => return Err(format!("{id}: op {op} was acknowledged and is not in the journal")),
                k => return Err(format!("{id}: op {op} was acknowledged once and is in the journal {k} times")),
            }
        }
        for op in &not_applied {
            ensure!(!stored.contains_key(op), "{id}: op {op} was answered \"not applied\", and is in the journal");
        }
        let unknown: Vec<u64> = stored.keys().filter(|op| !acked.contains(op)).copied().collect();
        ensure!(unknown.is_empty(), "{id}: ops in the journal that no caller was told of: {unknown:?}");
        // The node serves the journal's state, not one of its own.
        let total = h.ask(&id, SumCmd::Get).await.map_err(|e| format!("{id} after the outage: {e}"))?;
        let want: u64 = acked.iter().sum();
        ensure!(total == want, "{id}: the acknowledged ops add up to {want}, the entity answers {total}");
    }
    node.crash();
    Ok(())
}
