//! Failure drills for a [`Journal`] backend, run by event-sourced entities on real nodes: what
//! the [`conformance`](crate::journal::conformance) suite checks call by call, these check end to end,
//! against the real database in each backend's tests.
//!
//! - [`two_owners_of_one_shard`]: two nodes that both believe they own a shard write to it; the
//!   database refuses the older epoch, and the entity's history stays one line.
//! - [`outage_under_load`]: the database goes away under load and comes back; asks fail
//!   meanwhile, callers resend with their request ids, and afterwards every acknowledged command
//!   is applied exactly once, by the same node, which was never restarted.
//!
//! Each returns a description of the first broken promise.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shardline_core::EntityId;

use crate::entity::{EventSourced, EventSourcedHandle, EventSourcedSettings};
use crate::journal::conformance::Check;
use crate::journal::Journal;
use crate::{Cluster, EntitySettings, Error, Gossip};

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

/// Two nodes host the same shard: each is a cluster of its own on one journal (a split brain,
/// forced). The second starts later, so at a newer epoch; once it has written, every write of
/// the first is refused by the database as fenced and applies nothing, and the entity's history
/// is one line: the first node's events, then the second's.
pub async fn two_owners_of_one_shard(journal: Arc<dyn Journal>, prefix: &str) -> Check {
    let type_key = format!("{prefix}-owners");
    let (old, old_h) = lone_node(&journal, &format!("{prefix}-old"), &type_key).await?;
    for k in 1..=3 {
        old_h.ask("e", SumCmd::Add(k)).await.map_err(|e| format!("the first owner's write {k}: {e}"))?;
    }
    let (new, new_h) = lone_node(&journal, &format!("{prefix}-new"), &type_key).await?;
    ensure!(new_h.ask("e", SumCmd::Get).await == Ok(6), "the second owner recovers the first one's events");
    ensure!(new_h.ask("e", SumCmd::Add(10)).await == Ok(16), "the second owner writes");
    // The first still believes it owns the shard, and its entity holds its own state.
    let refused = old_h.ask("e", SumCmd::Add(100)).await;
    match &refused {
        Err(e) if e.is_safe_to_retry() => {}
        other => return Err(format!("the older owner's write after the newer one's: {other:?}")),
    }
    ensure!(new_h.ask("e", SumCmd::Add(20)).await == Ok(36), "the newer owner goes on");
    let pid = crate::entity::event_sourced::persistence_id(&type_key, "e");
    let events = journal.read(&pid, 1).await.map_err(|e| format!("read: {e}"))?;
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    ensure!(seqs == (1..=5).collect::<Vec<_>>(), "one linear history 1..=5, found {seqs:?}");
    let adds: Result<Vec<u64>, _> =
        events.iter().map(|e| postcard::from_bytes::<Added>(&e.event.payload).map(|Added(k)| k)).collect();
    let adds = adds.map_err(|e| format!("an event cannot be decoded: {e}"))?;
    ensure!(adds == [1, 2, 3, 10, 20], "the first owner's events, then the second's, found {adds:?}");
    old.crash();
    new.crash();
    Ok(())
}

/// Per entity: request ids acknowledged.
type Acked = Arc<Mutex<BTreeMap<String, u64>>>;

/// A node under load from `callers` callers, each resending an unanswered `Add(1)` with its
/// request id; `cut` takes the database away, `restore` brings it back. Asks must fail while it
/// is away (and say whether they were applied); afterwards the same node serves again, and each
/// entity's total is exactly the number of acknowledged adds.
pub async fn outage_under_load<C, R>(journal: Arc<dyn Journal>, prefix: &str, cut: C, restore: R) -> Check
where
    C: Future<Output = ()>,
    R: Future<Output = ()>,
{
    const ENTITIES: u64 = 8;
    let (node, h) = lone_node(&journal, &format!("{prefix}-outage"), &format!("{prefix}-outage")).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Acked = Arc::default();
    let answered = Arc::new(AtomicU64::new(0));
    let errors: Arc<Mutex<Vec<Error>>> = Arc::default();
    let mut callers = Vec::new();
    for c in 0..4u64 {
        let (h, stop, acked, answered, errors) =
            (h.clone(), stop.clone(), acked.clone(), answered.clone(), errors.clone());
        callers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) {
                n += 1;
                let id = format!("s{}", (c + n) % ENTITIES);
                let rid = format!("{c}-{n}");
                let give_up = Instant::now() + Duration::from_secs(60);
                loop {
                    match h.ask_with_request_id(&id, SumCmd::Add(1), rid.clone()).await {
                        Ok(_) => {
                            *acked.lock().unwrap_or_else(|e| e.into_inner()).entry(id.clone()).or_default() += 1;
                            answered.fetch_add(1, Ordering::AcqRel);
                            break;
                        }
                        Err(e) if Instant::now() < give_up => {
                            errors.lock().unwrap_or_else(|e| e.into_inner()).push(e);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => return Err(format!("{id} request {rid} unanswered for 60 s: {e}")),
                    }
                }
            }
            Ok(())
        }));
    }
    let wait_for_answers = |more: u64, what: &'static str| {
        let answered = answered.clone();
        async move {
            let target = answered.load(Ordering::Acquire) + more;
            let give_up = Instant::now() + Duration::from_secs(60);
            while answered.load(Ordering::Acquire) < target {
                ensure!(Instant::now() < give_up, "{what}: fewer than {more} answers in 60 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(())
        }
    };
    wait_for_answers(50, "before the outage").await?;
    cut.await;
    let during = answered.load(Ordering::Acquire);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let failed_during = errors.lock().unwrap_or_else(|e| e.into_inner()).len();
    // A command admitted just before the cut may still complete; nothing much more than that.
    let answered_during = answered.load(Ordering::Acquire) - during;
    restore.await;
    wait_for_answers(50, "after the database came back").await?;
    stop.store(true, Ordering::Release);
    for c in callers {
        c.await.map_err(|e| format!("a caller panicked: {e}"))??;
    }
    ensure!(failed_during > 0, "no ask failed while the database was away");
    ensure!(answered_during <= 8, "{answered_during} asks were answered while the database was away");
    let errors = errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for e in &errors {
        ensure!(
            matches!(e, Error::Unavailable(_) | Error::OutcomeUnknown(_) | Error::Timeout(_)),
            "an outage error that does not say whether it was applied: {e:?}"
        );
    }
    let acked = acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (id, n) in &acked {
        let total = h.ask(id, SumCmd::Get).await.map_err(|e| format!("{id} after the outage: {e}"))?;
        ensure!(total == *n, "{id}: {n} acknowledged adds, total {total}");
    }
    node.crash();
    Ok(())
}
