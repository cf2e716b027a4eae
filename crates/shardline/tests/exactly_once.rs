//! Exactly once for as long as a caller may retry: a retried request is applied once however many
//! requests came between (more than an entity keeps in memory), a retry issued longer ago than
//! replies are kept is refused and not applied, a read with a caller's request id answers its
//! retry the same, and many callers retrying at once, interleaved every way a property test
//! finds, never apply a request twice.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use shardline::journal::{InMemoryJournal, Journal};
use shardline::{
    Cluster, EntityId, EntitySettings, Error, EventSourced, EventSourcedHandle, EventSourcedSettings, Processed,
    RequestId,
};

/// The operations applied to it, in order: a request applied twice shows twice.
#[derive(Default, Serialize, Deserialize)]
struct Ops {
    applied: Vec<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
enum OpsCmd {
    Apply(u64),
    List,
}

#[derive(Serialize, Deserialize)]
struct Applied(u64);

impl EventSourced for Ops {
    type Command = OpsCmd;
    type Event = Applied;
    type Reply = Vec<u64>;
    const EVENT_TYPE: &'static str = "ops.applied";

    fn empty(_id: &EntityId) -> Self {
        Ops::default()
    }

    fn apply(&mut self, Applied(op): &Applied) {
        self.applied.push(*op);
    }

    fn decide(&self, command: OpsCmd) -> (Vec<Applied>, Vec<u64>) {
        match command {
            OpsCmd::Apply(op) => {
                let mut after = self.applied.clone();
                after.push(op);
                (vec![Applied(op)], after)
            }
            OpsCmd::List => (Vec::new(), self.applied.clone()),
        }
    }
}

async fn solo(journal: &InMemoryJournal, es: EventSourcedSettings) -> (Cluster, EventSourcedHandle<Ops>) {
    common::logs();
    let c = Cluster::builder().cluster_name("exactly-once").node_name("solo").build().await.expect("node starts");
    let settings = EntitySettings::new("ops").shards(4).journal(Arc::new(journal.clone()));
    let h = c.register_event_sourced::<Ops>(settings, es).await.expect("registers");
    (c, h)
}

/// Only a few replies in memory: a retry behind 100 later requests is answered by the journal
/// with its first reply, and nothing is applied again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_behind_many_later_requests_is_applied_once() {
    let journal = InMemoryJournal::new();
    let es = EventSourcedSettings { replies_in_memory: 4, ..EventSourcedSettings::default() };
    let (_c, h) = solo(&journal, es).await;
    let first = RequestId::new("first");
    assert_eq!(h.ask_with_request_id("x", OpsCmd::Apply(1), first.clone()).await.unwrap(), vec![1]);
    for k in 2..=101 {
        h.ask_with_request_id("x", OpsCmd::Apply(k), RequestId::new(format!("later-{k}"))).await.unwrap();
    }
    assert_eq!(h.ask_with_request_id("x", OpsCmd::Apply(1), first).await.unwrap(), vec![1], "its first reply");
    let applied = h.ask("x", OpsCmd::List).await.unwrap();
    assert_eq!(applied, (1..=101).collect::<Vec<u64>>(), "applied once, in order");
    assert_eq!(journal.read("ops|x", 1).await.unwrap().len(), 101);
}

/// A retry of a request issued longer ago than replies are kept: refused as expired, which says
/// it may have been processed, and not applied now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_older_than_the_retention_is_refused_not_applied() {
    let journal = InMemoryJournal::new();
    let es = EventSourcedSettings { reply_retention: Duration::from_secs(60), ..EventSourcedSettings::default() };
    let (_c, h) = solo(&journal, es).await;
    let old = RequestId::issued_at("old", SystemTime::now() - Duration::from_secs(120));
    let err = h.ask_with_request_id("x", OpsCmd::Apply(7), old).await.expect_err("expired");
    assert!(matches!(err, Error::RequestExpired(_)), "{err:?}");
    assert_eq!(err.processed(), Processed::Maybe);
    assert_eq!(h.ask("x", OpsCmd::List).await.unwrap(), Vec::<u64>::new(), "not applied");
    assert!(journal.read("ops|x", 1).await.unwrap().is_empty());
    // Within the retention it goes through.
    let recent = RequestId::issued_at("recent", SystemTime::now() - Duration::from_secs(30));
    assert_eq!(h.ask_with_request_id("x", OpsCmd::Apply(8), recent).await.unwrap(), vec![8]);
}

/// A request id issued further ahead of this node's clock than the skew margin: its age would
/// read short by the skew, so a retry could pass as recognisable after its reply was dropped. It
/// is refused as expired (an earlier attempt may have been applied), and not applied now; within
/// the margin it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_issued_ahead_of_the_nodes_clock_past_the_margin_is_refused_not_applied() {
    let journal = InMemoryJournal::new();
    let (_c, h) = solo(&journal, EventSourcedSettings::default()).await;
    let ahead = RequestId::issued_at("ahead", SystemTime::now() + shardline::entity::CLOCK_SKEW_MARGIN * 2);
    let err = h.ask_with_request_id("x", OpsCmd::Apply(7), ahead).await.expect_err("refused");
    assert!(matches!(err, Error::RequestExpired(_)), "{err:?}");
    assert_eq!(err.processed(), Processed::Maybe);
    assert_eq!(h.ask("x", OpsCmd::List).await.unwrap(), Vec::<u64>::new(), "not applied");
    let near = RequestId::issued_at("near", SystemTime::now() + shardline::entity::CLOCK_SKEW_MARGIN / 2);
    assert_eq!(h.ask_with_request_id("x", OpsCmd::Apply(8), near).await.unwrap(), vec![8]);
}

/// A command that writes no event, with a caller's request id: its retry gets the first answer,
/// not one decided again on the newer state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_read_gets_its_first_answer() {
    let journal = InMemoryJournal::new();
    let (_c, h) = solo(&journal, EventSourcedSettings::default()).await;
    let read = RequestId::new("read-1");
    assert_eq!(h.ask_with_request_id("x", OpsCmd::List, read.clone()).await.unwrap(), Vec::<u64>::new());
    h.ask("x", OpsCmd::Apply(3)).await.unwrap();
    assert_eq!(h.ask_with_request_id("x", OpsCmd::List, read).await.unwrap(), Vec::<u64>::new(), "the first answer");
    assert_eq!(h.ask("x", OpsCmd::List).await.unwrap(), vec![3]);
}

/// One caller's request: which entity, and how it is sent.
#[derive(Debug, Clone)]
struct Request {
    entity: u8,
    /// Sends of the same request id: how many at once, then how many later, after the other
    /// callers' next requests.
    at_once: u8,
    later: u8,
}

fn request() -> impl Strategy<Value = Request> {
    (0u8..3, 1u8..4, 0u8..3).prop_map(|(entity, at_once, later)| Request { entity, at_once, later })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Callers that each send their requests in turn, every one of them several times, some sends
    /// at once and some after the other callers moved on, with two replies in memory per entity:
    /// each entity applied every request exactly once, and every send of a request got the same
    /// answer.
    #[test]
    fn many_callers_retrying_apply_each_request_once(
        callers in prop::collection::vec(prop::collection::vec(request(), 1..8), 1..5)
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let journal = InMemoryJournal::new();
            let es = EventSourcedSettings { replies_in_memory: 2, ..EventSourcedSettings::default() };
            let (c, h) = solo(&journal, es).await;
            let mut tasks = Vec::new();
            for (caller, requests) in callers.iter().cloned().enumerate() {
                let h = h.clone();
                tasks.push(tokio::spawn(async move {
                    // (entity, op) of every request, and every answer it got.
                    let mut sent: Vec<(u8, u64, Vec<Vec<u64>>)> = Vec::new();
                    let mut late: Vec<(usize, RequestId)> = Vec::new();
                    let mut retries = Vec::new();
                    for (i, r) in requests.iter().enumerate() {
                        let op = (caller as u64) * 1000 + i as u64;
                        let rid = RequestId::new(format!("c{caller}-{i}"));
                        let id = format!("e{}", r.entity);
                        let sends: Vec<_> = (0..r.at_once)
                            .map(|_| {
                                let (h, id, rid) = (h.clone(), id.clone(), rid.clone());
                                tokio::spawn(async move { h.ask_with_request_id(id, OpsCmd::Apply(op), rid).await })
                            })
                            .collect();
                        let mut answers: Vec<Vec<u64>> = Vec::new();
                        for s in sends {
                            answers.push(s.await.expect("send").expect("answered"));
                        }
                        sent.push((r.entity, op, answers));
                        // Each earlier request retried once more, now that this one went.
                        for (j, rid) in std::mem::take(&mut late) {
                            let (entity, op, _) = sent[j].clone();
                            let (h, id) = (h.clone(), format!("e{entity}"));
                            retries.push((j, tokio::spawn(async move { h.ask_with_request_id(id, OpsCmd::Apply(op), rid).await })));
                        }
                        for _ in 0..r.later {
                            late.push((i, rid.clone()));
                        }
                    }
                    for (j, rid) in late {
                        let (entity, op, _) = sent[j].clone();
                        let (h, id) = (h.clone(), format!("e{entity}"));
                        retries.push((j, tokio::spawn(async move { h.ask_with_request_id(id, OpsCmd::Apply(op), rid).await })));
                    }
                    for (j, r) in retries {
                        sent[j].2.push(r.await.expect("retry").expect("answered"));
                    }
                    sent
                }));
            }
            let mut want: BTreeMap<u8, BTreeSet<u64>> = BTreeMap::new();
            for t in tasks {
                for (entity, op, answers) in t.await.expect("caller") {
                    want.entry(entity).or_default().insert(op);
                    let first = &answers[0];
                    prop_assert!(first.contains(&op), "op {op}: its answer {first:?} does not include it");
                    for a in &answers {
                        prop_assert_eq!(a, first, "op {}: every send the same answer", op);
                    }
                }
            }
            for (entity, ops) in want {
                let applied = h.ask(format!("e{entity}"), OpsCmd::List).await.expect("listed");
                let distinct: BTreeSet<u64> = applied.iter().copied().collect();
                prop_assert_eq!(applied.len(), distinct.len(), "e{}: a request applied twice: {:?}", entity, applied);
                prop_assert_eq!(distinct, ops, "e{}: what was applied", entity);
            }
            c.leave().await.ok();
            Ok(())
        })?;
    }
}
