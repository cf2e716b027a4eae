//! The journal conformance suite on the in-memory journal (SQLite and PostgreSQL run the same
//! suite against real databases in their crates).

use std::sync::Arc;

use shardline::journal::conformance::{append, run_all};
use shardline::journal::{Fence, InMemoryJournal, Journal, JournalError};
use shardline::{Epoch, ShardId};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_journal_passes_the_conformance_suite() {
    run_all(Arc::new(InMemoryJournal::new()), "mem").await.unwrap();
}

/// A journal that is down refuses everything as unavailable and keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_that_is_down_is_unavailable_and_writes_nothing() {
    let j = InMemoryJournal::new();
    let f = Fence { type_key: "t".into(), shard: ShardId(0), epoch: Epoch { term: 1, seq: 1 } };
    j.raise_fence(&f).await.unwrap();
    j.set_down(true);
    let r = j.append(append(&f, "t|a", 0, 1)).await;
    assert!(matches!(&r, Err(e @ JournalError::Unavailable(_)) if e.is_transient()), "{r:?}");
    j.set_down(false);
    assert!(j.read("t|a", 1).await.unwrap().is_empty());
    assert_eq!(j.append(append(&f, "t|a", 0, 1)).await, Ok(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_two_owners_of_one_shard() {
    shardline::drills::two_owners_of_one_shard(Arc::new(InMemoryJournal::new()), "mem").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_outage_under_load() {
    let j = InMemoryJournal::new();
    let (down, up) = (j.clone(), j.clone());
    let cut = async move { down.set_down(true) };
    let restore = async move { up.set_down(false) };
    shardline::drills::outage_under_load(Arc::new(j), "mem", cut, restore).await.unwrap();
}
