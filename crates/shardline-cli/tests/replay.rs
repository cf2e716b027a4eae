//! An entity with a million events recovers in bounded memory: its history is read a page at a
//! time (`Journal::read_page`), so what recovery holds does not grow with the history. The heap
//! is counted by the allocator the `shardline` binary counts its benchmarks' heap with.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use shardline::journal::{AppendRequest, EventRecord, Fence, Journal};
use shardline::{Cluster, EntityId, EntitySettings, Epoch, EventSourced, EventSourcedSettings};
use shardline_cli::heap;
use shardline_sqlite::SqliteJournal;

#[global_allocator]
static ALLOCATOR: heap::Counting = heap::Counting;

#[derive(Default, Serialize, Deserialize)]
struct Counter {
    n: u64,
}

#[derive(Debug, Serialize, Deserialize)]
enum CounterCmd {
    Add(u64),
    Get,
}

#[derive(Serialize, Deserialize)]
struct Added(u64);

impl EventSourced for Counter {
    type Command = CounterCmd;
    type Event = Added;
    type Reply = u64;
    const EVENT_TYPE: &'static str = "counter.added";

    fn empty(_id: &EntityId) -> Self {
        Counter::default()
    }

    fn apply(&mut self, Added(k): &Added) {
        self.n += k;
    }

    fn decide(&self, command: CounterCmd) -> (Vec<Added>, u64) {
        match command {
            CounterCmd::Add(k) => (vec![Added(k)], self.n + k),
            CounterCmd::Get => (Vec::new(), self.n),
        }
    }
}

const EVENTS: u64 = 1_000_000;
/// What recovery may hold at its peak beyond what was live before it. Read whole, the history
/// alone took about 100 bytes an event: 100 MB.
const HEAP_CAP: i64 = 32 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_events_recover_in_bounded_memory() {
    let dir = std::env::temp_dir().join(format!("shardline-sqlite-{}-replay", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let journal = Arc::new(SqliteJournal::open(dir.join("journal.db")).expect("journal"));
    let cluster = Cluster::builder().cluster_name("replay").build().await.expect("cluster");
    let settings = EntitySettings::new("counter").shards(4).journal(journal.clone());
    let counters =
        cluster.register_event_sourced::<Counter>(settings, EventSourcedSettings::default()).await.expect("registered");
    assert_eq!(counters.ask("big", CounterCmd::Add(1)).await.expect("first add"), 1);
    // The rest of the history written straight into the journal under the shard's fence, which
    // the first command raised (a raise to nothing answers the stored one).
    let shard = counters.entity_handle().shard_of("big");
    let lowest = Fence { type_key: "counter".into(), shard, epoch: Epoch { term: 0, seq: 0 } };
    let epoch = journal.raise_fence(&lowest).await.expect("the stored fence");
    let fence = Fence { epoch, ..lowest };
    let payload = postcard::to_allocvec(&Added(1)).expect("encoded");
    let mut last = 1;
    while last < EVENTS {
        let n = 20_000.min(EVENTS - last);
        let event = EventRecord { type_name: "counter.added".into(), schema_version: 0, payload: payload.clone() };
        let request = AppendRequest {
            fence: fence.clone(),
            persistence_id: "counter|big".into(),
            entity_id: "big".into(),
            expected_seq: last,
            events: vec![event; n as usize],
            remember: false,
            reply: None,
            keep_replies: std::time::Duration::ZERO,
            reminders: Vec::new(),
        };
        last = journal.append(request).await.expect("appended");
    }
    // The entity's next write finds a longer history than it knew: refused, its state dropped.
    assert!(counters.ask("big", CounterCmd::Add(1)).await.is_err(), "a write behind the history");
    // Counted from zero here: the peak is what recovery added.
    heap::start();
    let start = Instant::now();
    let total = counters.ask_timeout("big", CounterCmd::Get, std::time::Duration::from_secs(120)).await;
    let took = start.elapsed();
    let grown = heap::peak();
    assert_eq!(total.expect("recovered"), EVENTS, "every event applied once");
    println!("recovered {EVENTS} events in {took:?}; the heap grew at most {grown} bytes");
    assert!(grown < HEAP_CAP, "recovery held {grown} bytes at its peak, over {HEAP_CAP}");
    let _ = cluster.leave().await;
    let _ = std::fs::remove_dir_all(&dir);
}
