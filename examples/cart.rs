//! An event-sourced shopping cart on three nodes of one process, with the SQLite journal: the
//! example to copy for durable entities.
//!
//! - `Cart` is an [`EventSourced`] type: `decide` turns a command into events and a reply,
//!   `apply` folds an event into the state. Shardline persists the events before it answers, and
//!   a cart recovers from its journal wherever its shard goes next.
//! - `ask_retrying` sends each command with one request id for all its attempts: a retry after a
//!   timeout gets the first reply and changes nothing.
//! - The node that hosts a cart crashes; another node takes its shards and the cart is intact.
//!
//! ```sh
//! cargo run -p shardline-sqlite --example cart
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline::{Cluster, EntityId, EntitySettings, EventSourced, EventSourcedSettings, Gossip, RetryPolicy};
use shardline_sqlite::SqliteJournal;

type Contents = BTreeMap<String, u32>;

#[derive(Default, Serialize, Deserialize)]
struct Cart {
    items: Contents,
    checked_out: bool,
}

#[derive(Serialize, Deserialize)]
enum CartEvent {
    Added { item: String, qty: u32 },
    CheckedOut,
}

// Each `#[command]` method is a request with its own reply: `Add { item, qty }` answers the
// items or why not, `Items` answers them. The attribute writes those types, the enums
// that travel and `decide`.
#[shardline::commands]
impl EventSourced for Cart {
    type Event = CartEvent;
    const EVENT_TYPE: &'static str = "cart";

    fn empty(_id: &EntityId) -> Self {
        Cart::default()
    }

    fn apply(&mut self, event: &CartEvent) {
        match event {
            CartEvent::Added { item, qty } => *self.items.entry(item.clone()).or_default() += qty,
            CartEvent::CheckedOut => self.checked_out = true,
        }
    }

    /// Adds `qty` of `item`; answers the cart's items after it, or why not.
    #[command]
    fn add(&self, item: String, qty: u32) -> (Vec<CartEvent>, Result<Contents, String>) {
        if self.checked_out {
            return (vec![], Err("checked out".into()));
        }
        let mut after = self.items.clone();
        *after.entry(item.clone()).or_default() += qty;
        (vec![CartEvent::Added { item, qty }], Ok(after))
    }

    #[command]
    fn check_out(&self) -> (Vec<CartEvent>, Result<(), String>) {
        match () {
            _ if self.checked_out => (vec![], Err("checked out".into())),
            _ if self.items.is_empty() => (vec![], Err("empty".into())),
            _ => (vec![CartEvent::CheckedOut], Ok(())),
        }
    }

    #[command]
    fn items(&self) -> (Vec<CartEvent>, Contents) {
        (vec![], self.items.clone())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("shardline-cart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // One journal file for the three nodes (one per host in production, or PostgreSQL).
    let journal = Arc::new(SqliteJournal::open(dir.join("carts.db"))?);
    let mut nodes = Vec::new();
    for name in ["a", "b", "c"] {
        let mut builder = Cluster::builder().cluster_name("carts").node_name(name);
        if let Some(first) = nodes.first().map(|(c, _): &(Cluster, _)| c.local_addr().to_string()) {
            builder = builder.membership(Gossip::new([first]));
        }
        let cluster = builder.build().await?;
        let settings =
            EntitySettings::new("cart").shards(16).journal(journal.clone()).rebalance_interval(Duration::from_secs(1));
        let carts = cluster.register_event_sourced::<Cart>(settings, EventSourcedSettings::default()).await?;
        nodes.push((cluster, carts));
    }
    // Send nothing before the three nodes serve.
    nodes[0].0.formed(3).await?;

    let add = |item: &str, qty| Add { item: item.into(), qty };
    let (_, carts) = &nodes[1];
    carts.ask_retrying("cart-1", add("apple", 2), RetryPolicy::default()).await??;
    carts.ask_retrying("cart-1", add("pear", 1), RetryPolicy::default()).await??;
    carts.ask_retrying("cart-1", add("apple", 1), RetryPolicy::default()).await??;

    // Crash the node hosting cart-1 (or c, when it is the first, the others' seed); its shards
    // move to the others, which read the cart back from the journal.
    let home = carts.entity_handle().shard_homes()[carts.entity_handle().shard_of("cart-1").index()].clone();
    let crashed = (1..3).find(|&i| Some(nodes[i].0.node_id()) == home.as_ref()).unwrap_or(2);
    nodes[crashed].0.crash();
    println!("crashed node {}, which hosted cart-1", nodes[crashed].0.node_id());
    let (_, survivor) = &nodes[if crashed == 1 { 2 } else { 1 }];
    // Retries ride out the failover (the crashed node's shards are taken once it is declared down).
    let patient = RetryPolicy { attempts: 40, timeout: Duration::from_secs(2), ..RetryPolicy::default() };
    let items = survivor.ask_retrying("cart-1", Items, patient).await?;
    println!("cart-1 after the crash: {items:?}");
    if items != Contents::from([("apple".to_string(), 3), ("pear".to_string(), 1)]) {
        return Err(format!("cart-1 lost its contents: {items:?}").into());
    }
    survivor.ask_retrying("cart-1", CheckOut, patient).await??;
    let refused = survivor.ask_retrying("cart-1", add("plum", 1), patient).await?;
    println!("adding to a checked-out cart: {refused:?}");
    for (i, (cluster, _)) in nodes.iter().enumerate().rev() {
        if i != crashed {
            cluster.leave().await?;
        }
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
