//! Counters on three in-process nodes whose state survives moves.
//!
//! One node starts, a thousand `Add(1)` asks go out from every node while two more nodes join
//! (so shards move mid-run), then one node leaves gracefully (its shards move again). The
//! counters implement `hand_over`/`take_over`, so their state travels with their shard: the sum
//! is 1,000 at the end. Without those two methods a moved counter would start again from zero,
//! which is the documented contract of an entity that keeps its state only in memory.
//!
//! ```sh
//! cargo run -p shardline --example counter
//! ```

use std::time::Duration;

use shardline::{Cluster, Entity, EntityHandle, EntityId, EntitySettings, Error, Gossip};

/// A number in memory. `hand_over` and `take_over` carry it to the next owner when its shard
/// moves by hand-off (rebalance, graceful leave). A crash still loses it: that takes a journal.
struct Counter {
    n: u64,
}

// `#[message]` methods are the counter's requests: `Add { by }` answers a `u64`, and so does
// `Get`. The attribute writes those types, the enums that travel and `handle`.
#[shardline::messages]
impl Entity for Counter {
    fn new(_id: &EntityId) -> Self {
        Counter { n: 0 }
    }

    /// Adds `by`; answers the new value.
    #[message]
    fn add(&mut self, by: u64) -> u64 {
        self.n += by;
        self.n
    }

    #[message]
    fn get(&self) -> u64 {
        self.n
    }

    fn hand_over(&self) -> Option<Vec<u8>> {
        Some(self.n.to_le_bytes().to_vec())
    }

    fn take_over(_id: &EntityId, data: &[u8]) -> Option<Self> {
        let n = u64::from_le_bytes(data.try_into().ok()?);
        Some(Counter { n })
    }
}

async fn node(
    name: &str,
    seed: Option<&Cluster>,
) -> Result<(Cluster, EntityHandle<Counter>), Box<dyn std::error::Error>> {
    let mut builder = Cluster::builder().cluster_name("counters").node_name(name).bind("127.0.0.1:0");
    if let Some(seed) = seed {
        builder = builder.membership(Gossip::new([seed.local_addr().to_string()]));
    }
    let cluster = builder.build().await?;
    let counters = cluster.register::<Counter>(EntitySettings::new("counter").shards(64)).await?;
    Ok((cluster, counters))
}

/// Adds 1, resending only what certainly did not run: a resend after a timeout could count twice.
async fn add_one(counters: &EntityHandle<Counter>, id: &str) -> Result<(), Error> {
    loop {
        match counters.entity_ref(id).ask(Add { by: 1 }).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_safe_to_retry() => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => return Err(e),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (a, on_a) = node("a", None).await?;
    let mut handles = vec![on_a.clone()];
    let mut nodes = vec![a.clone()];
    for i in 0..1_000u32 {
        if i == 200 || i == 500 {
            // Two nodes join mid-run: shards move to them while asks keep coming.
            let (c, h) = node(if i == 200 { "b" } else { "c" }, Some(&a)).await?;
            nodes.push(c);
            handles.push(h);
        }
        let via = &handles[i as usize % handles.len()];
        add_one(via, &format!("counter-{}", i % 50)).await?;
    }
    // b leaves gracefully: its shards, state included, move to a and c.
    nodes[1].leave().await?;
    let mut sum = 0;
    for k in 0..50 {
        sum += on_a.entity_ref(format!("counter-{k}")).ask(Get).await?;
    }
    let hosted: Vec<usize> = [&handles[0], &handles[2]].iter().map(|h| h.hosted_shards().len()).collect();
    println!("sum of 50 counters after 1,000 adds, two joins and a leave: {sum}; shards on a and c: {hosted:?}");
    if sum != 1_000 {
        return Err(format!("expected 1000, got {sum}").into());
    }
    Ok(())
}
