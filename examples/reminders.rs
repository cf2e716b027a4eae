//! Durable reminders: orders that expire unless paid, on three nodes of one process with the
//! SQLite journal. The node hosting an unpaid order crashes before the order is due to expire;
//! another node takes its shard, finds the reminder in the journal and expires the order there.
//!
//! - Placing an order stores `Placed`, whose reminder ("expire", in 1.5 s) is written in the
//!   same transaction ([`EventSourced::reminders`]); paying stores `Paid`, which cancels it.
//! - When the reminder is due, [`EventSourced::on_reminder`] turns it into the `Expire`
//!   command, applied once under the firing's id even if the firing is delivered again.
//! - A plain entity sets reminders from its handler with `ctx.remind(name, When::…)` and
//!   receives them in `Entity::reminded`.
//!
//! ```sh
//! cargo run -p shardline-sqlite --example reminders
//! ```

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline::entity::Remind;
use shardline::{
    Cluster, EntityId, EntitySettings, EventSourced, EventSourcedSettings, Gossip, Reminder, RetryPolicy, When,
};
use shardline_sqlite::SqliteJournal;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
enum Order {
    #[default]
    New,
    Placed,
    Paid,
    Expired,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum OrderCmd {
    Place,
    Pay,
    Expire,
    Status,
}

#[derive(Serialize, Deserialize)]
enum OrderEvent {
    Placed,
    Paid,
    Expired,
}

impl EventSourced for Order {
    type Command = OrderCmd;
    type Event = OrderEvent;
    type Reply = Order;
    const EVENT_TYPE: &'static str = "order";

    fn empty(_id: &EntityId) -> Self {
        Order::New
    }

    fn apply(&mut self, event: &OrderEvent) {
        *self = match event {
            OrderEvent::Placed => Order::Placed,
            OrderEvent::Paid => Order::Paid,
            OrderEvent::Expired => Order::Expired,
        };
    }

    fn decide(&self, cmd: OrderCmd) -> (Vec<OrderEvent>, Order) {
        match (cmd, self) {
            (OrderCmd::Place, Order::New) => (vec![OrderEvent::Placed], Order::Placed),
            (OrderCmd::Pay, Order::Placed) => (vec![OrderEvent::Paid], Order::Paid),
            (OrderCmd::Expire, Order::Placed) => (vec![OrderEvent::Expired], Order::Expired),
            (_, state) => (vec![], *state),
        }
    }

    // The reminders an event sets or cancels, stored with it.
    fn reminders(event: &OrderEvent) -> Vec<Remind> {
        match event {
            OrderEvent::Placed => vec![Remind::set("expire", When::After(Duration::from_millis(1_500)))],
            OrderEvent::Paid => vec![Remind::cancel("expire")],
            OrderEvent::Expired => vec![],
        }
    }

    fn on_reminder(&self, reminder: &Reminder) -> Option<OrderCmd> {
        (reminder.name() == "expire").then_some(OrderCmd::Expire)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("shardline-reminders-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let journal = Arc::new(SqliteJournal::open(dir.join("orders.db"))?);
    let mut nodes = Vec::new();
    for name in ["a", "b", "c"] {
        let mut builder = Cluster::builder().cluster_name("orders").node_name(name);
        if let Some(first) = nodes.first().map(|(c, _): &(Cluster, _)| c.local_addr().to_string()) {
            builder = builder.membership(Gossip::new([first]));
        }
        let cluster = builder.build().await?;
        // `.reminders()`: this type keeps durable reminders in its journal.
        let settings = EntitySettings::new("order").shards(16).journal(journal.clone()).reminders();
        let orders = cluster.register_event_sourced::<Order>(settings, EventSourcedSettings::default()).await?;
        nodes.push((cluster, orders));
    }
    nodes[0].0.formed(3).await?;

    let (_, orders) = &nodes[0];
    // An unpaid order on b or c (a is the others' seed and stays up), and one that is paid.
    let homes = orders.entity_handle().shard_homes();
    let home = |id: &str| homes[orders.entity_handle().shard_of(id).index()].clone();
    let unpaid = (0..100)
        .map(|i| format!("order-{i}"))
        .find(|id| home(id).is_some_and(|h| h != *nodes[0].0.node_id()))
        .ok_or("b and c host no order")?;
    orders.ask_retrying(&unpaid, OrderCmd::Place, RetryPolicy::default()).await?;
    orders.ask_retrying("order-paid", OrderCmd::Place, RetryPolicy::default()).await?;
    orders.ask_retrying("order-paid", OrderCmd::Pay, RetryPolicy::default()).await?;

    let crashed = (1..3).find(|&i| home(&unpaid).as_ref() == Some(nodes[i].0.node_id())).unwrap_or(2);
    nodes[crashed].0.crash();
    println!("{unpaid} placed; crashed node {}, which hosted it, before it expired", nodes[crashed].0.node_id());

    let patient = RetryPolicy { attempts: 40, timeout: Duration::from_secs(2), ..RetryPolicy::default() };
    let mut status = Order::Placed;
    for _ in 0..60 {
        status = orders.ask_retrying(&unpaid, OrderCmd::Status, patient).await?;
        if status == Order::Expired {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("{unpaid}: {status:?} (expired by its reminder on a surviving node)");
    let paid = orders.ask_retrying("order-paid", OrderCmd::Status, patient).await?;
    println!("order-paid: {paid:?} (its reminder was cancelled by the payment)");
    if status != Order::Expired || paid != Order::Paid {
        return Err(format!("expected Expired and Paid, got {status:?} and {paid:?}").into());
    }
    for (i, (cluster, _)) in nodes.iter().enumerate().rev() {
        if i != crashed {
            cluster.leave().await?;
        }
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
