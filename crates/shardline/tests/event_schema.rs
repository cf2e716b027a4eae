//! Event schema evolution: history written by an older version of an entity's event type is
//! read through its `upcast`, and a snapshot of the older version is skipped for the events.

mod common;

use std::sync::Arc;

use common::logs;
use serde::{Deserialize, Serialize};
use shardline::entity::decode_old;
use shardline::journal::{InMemoryJournal, Journal};
use shardline::{Cluster, EntityId, EntitySettings, EventSourced, EventSourcedSettings, Gossip};

/// Version 1: a tally of amounts.
#[derive(Default, Serialize, Deserialize)]
struct TallyV1 {
    n: u64,
}

#[derive(Serialize, Deserialize)]
enum EventV1 {
    Added(u64),
}

impl EventSourced for TallyV1 {
    type Command = u64;
    type Event = EventV1;
    type Reply = u64;
    const EVENT_TYPE: &'static str = "tally";

    fn empty(_id: &EntityId) -> Self {
        TallyV1::default()
    }

    fn apply(&mut self, EventV1::Added(k): &EventV1) {
        self.n += k;
    }

    fn decide(&self, k: u64) -> (Vec<EventV1>, u64) {
        (vec![EventV1::Added(k)], self.n + k)
    }
}

/// Version 2: each amount carries a note, and the state keeps the notes (so neither the events
/// nor the snapshots of version 1 decode as version 2's).
#[derive(Default, Serialize, Deserialize)]
struct TallyV2 {
    n: u64,
    notes: Vec<String>,
}

#[derive(Serialize, Deserialize)]
enum EventV2 {
    Added { amount: u64, note: String },
}

#[derive(Debug, Serialize, Deserialize)]
enum CmdV2 {
    Add(u64, String),
    Get,
}

impl EventSourced for TallyV2 {
    type Command = CmdV2;
    type Event = EventV2;
    type Reply = (u64, Vec<String>);
    const EVENT_TYPE: &'static str = "tally";
    const SCHEMA_VERSION: u32 = 2;

    fn empty(_id: &EntityId) -> Self {
        TallyV2::default()
    }

    fn apply(&mut self, EventV2::Added { amount, note }: &EventV2) {
        self.n += amount;
        self.notes.push(note.clone());
    }

    fn decide(&self, cmd: CmdV2) -> (Vec<EventV2>, (u64, Vec<String>)) {
        match cmd {
            CmdV2::Add(amount, note) => {
                let mut notes = self.notes.clone();
                notes.push(note.clone());
                (vec![EventV2::Added { amount, note }], (self.n + amount, notes))
            }
            CmdV2::Get => (vec![], (self.n, self.notes.clone())),
        }
    }

    fn upcast(version: u32, payload: &[u8]) -> Result<EventV2, String> {
        match version {
            1 => decode_old(payload).map(|EventV1::Added(amount)| EventV2::Added { amount, note: "v1".into() }),
            v => Err(format!("no upcaster from version {v}")),
        }
    }
}

/// Version 1 writes five events and a snapshot after four; a cluster running version 2 on the
/// same journal reads them all, through the upcaster, and goes on writing version 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_written_by_an_older_event_type_is_read_through_its_upcaster() {
    logs();
    let journal = InMemoryJournal::new();
    let settings = || EntitySettings::new("tally").shards(4).journal(Arc::new(journal.clone()));
    let snapshot_every_4 = EventSourcedSettings { snapshot_every: 4, ..EventSourcedSettings::default() };
    let old = Cluster::builder().cluster_name("schema-v1").build().await.unwrap();
    let v1 = old.register_event_sourced::<TallyV1>(settings(), snapshot_every_4).await.unwrap();
    for k in 1..=5 {
        v1.ask("t", k).await.unwrap();
    }
    old.leave().await.unwrap();

    // A new run on the same journal: its terms start above the old run's fences.
    let floor = journal.highest_term().await.unwrap();
    let gossip = Gossip::new(Vec::<String>::new()).term_floor(floor);
    let new = Cluster::builder().cluster_name("schema-v2").membership(gossip).build().await.unwrap();
    let v2 = new.register_event_sourced::<TallyV2>(settings(), EventSourcedSettings::default()).await.unwrap();
    let (n, notes) = v2.ask("t", CmdV2::Get).await.unwrap();
    assert_eq!((n, notes.len()), (15, 5), "version 2 read version 1's history: {notes:?}");
    assert!(notes.iter().all(|n| n == "v1"));
    let (n, notes) = v2.ask("t", CmdV2::Add(10, "v2".into())).await.unwrap();
    assert_eq!((n, notes.last().map(String::as_str)), (25, Some("v2")));
    new.leave().await.unwrap();
}
