//! `EventSourced::decide_with`: a command decided after an ask of another entity, with the
//! entity's context; its retry is answered with the recorded reply, not decided again.

use serde::{Deserialize, Serialize};
use shardline::journal::InMemoryJournal;
use shardline::{Cluster, EntityContext, EntityId, EntitySettings, EventSourced, EventSourcedSettings, RequestId};

/// Prices by item: the item is the entity id.
#[derive(Serialize, Deserialize)]
struct Price(u64);

#[derive(Clone, Debug, Serialize, Deserialize)]
enum PriceCmd {
    Set(u64),
    Get,
}

impl EventSourced for Price {
    type Command = PriceCmd;
    type Event = u64;
    type Reply = u64;
    const EVENT_TYPE: &'static str = "price";

    fn empty(_: &EntityId) -> Self {
        Price(0)
    }
    fn apply(&mut self, p: &u64) {
        self.0 = *p;
    }
    fn decide(&self, c: PriceCmd) -> (Vec<u64>, u64) {
        match c {
            PriceCmd::Set(p) => (vec![p], p),
            PriceCmd::Get => (vec![], self.0),
        }
    }
}

/// An order adds items at the price the catalog has when it decides.
#[derive(Serialize, Deserialize)]
struct Order {
    total: u64,
}

#[derive(Serialize, Deserialize)]
struct Line {
    item: String,
    price: u64,
}

impl EventSourced for Order {
    type Command = String;
    type Event = Line;
    type Reply = Result<(String, u64), String>;
    const EVENT_TYPE: &'static str = "order";

    fn empty(_: &EntityId) -> Self {
        Order { total: 0 }
    }
    fn apply(&mut self, l: &Line) {
        self.total += l.price;
    }
    fn decide(&self, _: String) -> (Vec<Line>, Self::Reply) {
        (vec![], Err("decided with its context only".into()))
    }

    async fn decide_with(&self, ctx: &EntityContext, item: String) -> (Vec<Line>, Self::Reply) {
        let Some(prices) = ctx.entities().event_sourced::<Price>() else {
            return (vec![], Err("no prices on this node".into()));
        };
        match prices.ask(&item, PriceCmd::Get).await {
            Ok(0) => (vec![], Err(format!("{item} has no price"))),
            Ok(price) => (vec![Line { item, price }], Ok((ctx.id().as_str().to_string(), self.total + price))),
            Err(e) => (vec![], Err(e.to_string())),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_is_decided_after_an_ask_of_another_entity() {
    let a = Cluster::builder().cluster_name("decide-with").build().await.unwrap();
    let journal = std::sync::Arc::new(InMemoryJournal::new());
    let prices = a
        .register_event_sourced::<Price>(
            EntitySettings::new("price").shards(4).journal(journal.clone()),
            EventSourcedSettings::default(),
        )
        .await
        .unwrap();
    let orders = a
        .register_event_sourced::<Order>(
            EntitySettings::new("order").shards(4).journal(journal),
            EventSourcedSettings::default(),
        )
        .await
        .unwrap();
    assert_eq!(orders.ask("o1", String::from("pen")).await.unwrap(), Err("pen has no price".into()));
    prices.ask("pen", PriceCmd::Set(3)).await.unwrap();
    prices.ask("ink", PriceCmd::Set(10)).await.unwrap();
    assert_eq!(orders.ask("o1", String::from("pen")).await.unwrap(), Ok(("o1".into(), 3)));
    let rid = RequestId::new("o1-ink");
    assert_eq!(
        orders.ask_with_request_id("o1", String::from("ink"), rid.clone()).await.unwrap(),
        Ok(("o1".into(), 13))
    );
    // The price changes; the retry of the same request is its recorded reply, not a new decision.
    prices.ask("ink", PriceCmd::Set(99)).await.unwrap();
    assert_eq!(orders.ask_with_request_id("o1", String::from("ink"), rid).await.unwrap(), Ok(("o1".into(), 13)));
    assert_eq!(orders.ask("o1", String::from("ink")).await.unwrap(), Ok(("o1".into(), 112)));
    a.leave().await.unwrap();
}

/// Stock of an item (the entity id), in a journal of its own.
#[derive(Serialize, Deserialize)]
struct Stock {
    left: u32,
}

#[shardline::commands]
impl EventSourced for Stock {
    type Event = u32;
    const EVENT_TYPE: &'static str = "stock";

    fn empty(_: &EntityId) -> Self {
        Stock { left: 10 }
    }
    fn apply(&mut self, taken: &u32) {
        self.left -= taken;
    }

    /// Takes `n` out; answers what is left.
    #[command]
    fn take(&self, n: u32) -> (Vec<u32>, Result<u32, String>) {
        match self.left.checked_sub(n) {
            Some(left) => (vec![n], Ok(left)),
            None => (vec![], Err("out of stock".into())),
        }
    }

    #[command]
    fn left(&self) -> (Vec<u32>, u32) {
        (vec![], self.left)
    }
}

/// A basket takes each item it adds out of stock, before it decides.
#[derive(Serialize, Deserialize)]
struct Basket {
    items: u32,
}

impl EventSourced for Basket {
    type Command = String;
    type Event = String;
    type Reply = Result<u32, String>;
    const EVENT_TYPE: &'static str = "basket";

    fn empty(_: &EntityId) -> Self {
        Basket { items: 0 }
    }
    fn apply(&mut self, _: &String) {
        self.items += 1;
    }
    fn decide(&self, _: String) -> (Vec<String>, Self::Reply) {
        (vec![], Err("decided with its context only".into()))
    }

    async fn decide_with(&self, ctx: &EntityContext, item: String) -> (Vec<String>, Self::Reply) {
        let Some(stock) = ctx.entities().event_sourced::<Stock>() else {
            return (vec![], Err("no stock on this node".into()));
        };
        // Under an id derived from the basket's request: taken once, however often this runs.
        let taken = match ctx.request_id() {
            Some(rid) => stock.ask_with_request_id(&item, Take { n: 1 }, rid.derive("take")).await,
            None => stock.ask(&item, Take { n: 1 }).await,
        };
        match taken {
            Ok(Ok(_)) => (vec![item], Ok(self.items + 1)),
            Ok(Err(e)) => (vec![], Err(e)),
            Err(e) => (vec![], Err(e.to_string())),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_run_again_makes_its_ask_once() {
    let a = Cluster::builder().cluster_name("decide-twice").build().await.unwrap();
    let (stock_journal, basket_journal) = (InMemoryJournal::new(), InMemoryJournal::new());
    let stock = a
        .register_event_sourced::<Stock>(
            EntitySettings::new("stock").shards(4).journal(stock_journal),
            EventSourcedSettings::default(),
        )
        .await
        .unwrap();
    let baskets = a
        .register_event_sourced::<Basket>(
            EntitySettings::new("basket").shards(4).journal(basket_journal.clone()),
            EventSourcedSettings::default(),
        )
        .await
        .unwrap();
    assert_eq!(baskets.ask("b1", String::from("pen")).await.unwrap(), Ok(1));
    assert_eq!(stock.ask("pen", Left).await.unwrap(), 9);

    // The basket's journal fails the append after the decision took a pen out of stock.
    basket_journal.set_down(true);
    let rid = RequestId::new("b1-second-pen");
    let failed = baskets.ask_with_request_id("b1", String::from("pen"), rid.clone()).await;
    assert!(matches!(failed, Err(shardline::Error::Unavailable(_))), "the append fails: {failed:?}");
    assert_eq!(stock.ask("pen", Left).await.unwrap(), 8, "the decision did take a pen");
    basket_journal.set_down(false);

    // The retry is decided again; its take is the first one's, answered from the stock's journal.
    assert_eq!(baskets.ask_with_request_id("b1", String::from("pen"), rid).await.unwrap(), Ok(2));
    assert_eq!(stock.ask("pen", Left).await.unwrap(), 8, "one pen taken for one request");
    a.leave().await.unwrap();
}
