//! `SplitJournal` over in-memory journals: each entity's history in one part, its fence checked
//! there, the whole conformance suite and the two-owners drill across parts. (PostgreSQL runs the
//! suite on two real databases in its crate.)

use std::sync::Arc;

use shardline::journal::conformance::{append, run_all};
use shardline::journal::{Fence, InMemoryJournal, Journal, JournalError, SplitJournal, SLICES};
use shardline::{Epoch, ShardId};

fn split(n: usize) -> (SplitJournal, Vec<InMemoryJournal>) {
    let parts: Vec<InMemoryJournal> = (0..n).map(|_| InMemoryJournal::new()).collect();
    let dyn_parts = parts.iter().map(|p| Arc::new(p.clone()) as Arc<dyn Journal>).collect();
    (SplitJournal::new(dyn_parts).expect("parts"), parts)
}

#[test]
fn slices_spread_over_the_parts_in_ranges() {
    assert!(SplitJournal::new(Vec::new()).is_none(), "no parts");
    let (j, _) = split(2);
    let mut counts = [0usize; 2];
    for i in 0..10_000 {
        counts[j.part_of(&format!("account|{i}"))] += 1;
    }
    assert!(counts.iter().all(|c| (4_000..6_000).contains(c)), "{counts:?}");
    // Ranges of slices: slice 0 in the first part, the last slice in the last.
    let slice = |p: &str| shardline_core::shard_of(p, SLICES).0;
    let first = (0..).map(|i| format!("x|{i}")).find(|p| slice(p) == 0).expect("a pid in slice 0");
    let last = (0..).map(|i| format!("x|{i}")).find(|p| slice(p) == SLICES - 1).expect("a pid in the last slice");
    assert_eq!((j.part_of(&first), j.part_of(&last)), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_is_written_in_one_part_and_fenced_there() {
    let (j, parts) = split(2);
    let fence = Fence { type_key: "t".into(), shard: ShardId(3), epoch: Epoch { term: 1, seq: 1 } };
    assert_eq!(j.raise_fence(&fence).await, Ok(fence.epoch));
    for p in &parts {
        assert_eq!(p.raise_fence(&fence).await, Ok(fence.epoch), "every part holds the fence");
    }
    let pid = "t|e1";
    assert_eq!(j.append(append(&fence, pid, 0, 2)).await, Ok(2));
    let home = j.part_of(pid);
    assert_eq!(parts[home].last_seq(pid).await, Ok(2));
    assert_eq!(parts[1 - home].last_seq(pid).await, Ok(0), "written once, in its own part");
    // A newer owner's claim that reached the entity's part only: that part refuses the old owner.
    let newer = Fence { epoch: Epoch { term: 2, seq: 0 }, ..fence.clone() };
    parts[home].raise_fence(&newer).await.expect("raised");
    let stale = j.append(append(&fence, pid, 2, 1)).await;
    assert!(matches!(stale, Err(JournalError::Fenced { .. })), "{stale:?}");
    assert_eq!(j.raise_fence(&fence).await, Ok(newer.epoch), "the newest fence of any part");
    assert_eq!(j.highest_term().await, Ok(2));
    // A part that is down fails the claims of every shard, and nothing else.
    parts[1 - home].set_down(true);
    let claim = j.raise_fence(&Fence { epoch: Epoch { term: 3, seq: 0 }, ..fence.clone() }).await;
    assert!(matches!(claim, Err(JournalError::Unavailable(_))), "{claim:?}");
    assert_eq!(j.last_seq(pid).await, Ok(2), "the entity's own part still answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_journal_passes_the_conformance_suite() {
    let (j, _) = split(3);
    run_all(Arc::new(j), "split").await.expect("conformance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_journal_keeps_two_owners_of_one_shard_apart() {
    let (j, _) = split(2);
    shardline::drills::two_owners_of_one_shard(Arc::new(j), "split").await.expect("drill");
}
