//! Requests with a reply type each (`#[shardline::messages]`, `#[shardline::commands]`), asked
//! across a real connection between two nodes: the request's own reply comes back, a tell
//! arrives, a retried command is applied once, and an answer of another request's variant is
//! `ReplyLost` (processed), not a wrong value.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline::journal::InMemoryJournal;
use shardline::{
    Cluster, Entity, EntityContext, EntityHandle, EntityId, EntitySettings, Error, EventSourced, EventSourcedSettings,
    Gossip, Processed, Request, RequestId, RetryPolicy,
};

/// A chat room in memory.
struct Room {
    members: Vec<String>,
}

#[shardline::messages]
impl Entity for Room {
    fn new(_id: &EntityId) -> Self {
        Room { members: Vec::new() }
    }

    /// Adds `who`; answers how many are in.
    #[message]
    fn join(&mut self, who: String) -> usize {
        self.members.push(who);
        self.members.len()
    }

    #[message]
    async fn leave(&mut self, who: String) {
        self.members.retain(|m| *m != who);
    }

    /// The room's id and who is in, in the order they joined.
    #[message]
    fn members(&self, ctx: &EntityContext) -> (String, Vec<String>) {
        (ctx.id().to_string(), self.members.clone())
    }
}

/// A request that says it is answered by `join` but is sent as `members`: a hand-written
/// `Request` that lies, as a bug in one would.
struct Lying;

impl Request<RoomMessage, RoomReply> for Lying {
    type Reply = usize;
    fn into_message(self) -> RoomMessage {
        RoomMessage::Members(Members)
    }
    fn from_reply(reply: RoomReply) -> Result<usize, RoomReply> {
        match reply {
            RoomReply::Join(n) => Ok(n),
            other => Err(other),
        }
    }
}

/// A tally kept in a journal.
#[derive(Default, Serialize, Deserialize)]
struct Tally {
    counts: BTreeMap<String, u64>,
}

#[derive(Serialize, Deserialize)]
struct Counted {
    what: String,
    n: u64,
}

#[shardline::commands]
impl EventSourced for Tally {
    type Event = Counted;
    const EVENT_TYPE: &'static str = "tally";

    fn empty(_id: &EntityId) -> Self {
        Tally::default()
    }

    fn apply(&mut self, e: &Counted) {
        *self.counts.entry(e.what.clone()).or_default() += e.n;
    }

    /// Counts `n` more of `what`; answers the new count.
    #[command]
    fn count(&self, what: String, n: u64) -> (Vec<Self::Event>, u64) {
        let now = self.counts.get(&what).copied().unwrap_or(0) + n;
        (vec![Counted { what, n }], now)
    }

    #[command]
    fn counts(&self) -> (Vec<Counted>, BTreeMap<String, u64>) {
        (vec![], self.counts.clone())
    }
}

/// A node of the test cluster, with both types.
async fn node(name: &str, seed: Option<std::net::SocketAddr>, journal: Arc<InMemoryJournal>) -> Cluster {
    let mut b = Cluster::builder().cluster_name("requests").node_name(name);
    if let Some(s) = seed {
        b = b.membership(Gossip::new([s.to_string()]));
    }
    let c = b.build().await.expect("node starts");
    c.register::<Room>(EntitySettings::new("room").shards(8)).await.expect("registers");
    let tally = EntitySettings::new("tally").shards(8).journal(journal);
    c.register_event_sourced::<Tally>(tally, EventSourcedSettings::default()).await.expect("registers");
    c
}

/// An id whose shard `h` sees at home on `node`, once every shard has a home and `node` has some.
async fn id_on<E: Entity>(h: &EntityHandle<E>, node: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let homes = h.shard_homes();
        if homes.iter().all(Option::is_some) {
            let home = |id: &String| homes[h.shard_of(id).index()].as_ref().is_some_and(|n| &*n.name == node);
            if let Some(id) = (0..10_000).map(|i| format!("x{i}")).find(home) {
                return id;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "{node} never got a shard");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_gets_its_own_reply_across_nodes() {
    let journal = Arc::new(InMemoryJournal::new());
    let a = node("a", None, journal.clone()).await;
    let b = node("b", Some(a.local_addr()), journal).await;
    a.formed(2).await.expect("the two nodes form a cluster");
    let rooms = a.entities().handle::<Room>().expect("registered");
    // Asked on a, handled on b: the request, the message enum and the reply enum cross the wire.
    let room = rooms.entity_ref(id_on(&rooms, "b").await);

    let n: usize = room.ask(Join { who: "ann".into() }).await.expect("joins");
    assert_eq!(n, 1);
    assert_eq!(room.ask(Join { who: "bob".into() }).await.expect("joins"), 2);
    room.tell(Leave { who: "ann".into() }).expect("told");
    // Messages from one sender arrive in the order sent: the tell is handled before this ask.
    let (id, members) = room.ask(Members).await.expect("answers");
    assert_eq!((id.as_str(), members), (room.id().as_str(), vec!["bob".to_string()]));
    // The whole message still works, answered with the whole reply.
    match room.ask(RoomMessage::Join(Join { who: "cy".into() })).await {
        Ok(RoomReply::Join(2)) => {}
        Ok(RoomReply::Join(n)) => panic!("bob and cy are in, not {n}"),
        Ok(_) => panic!("join answered with another variant"),
        Err(e) => panic!("join failed: {e}"),
    }

    // Processed (the room answered `members`), but not the answer the request names.
    match room.ask(Lying).await {
        Err(e @ Error::ReplyLost(_)) => assert_eq!(e.processed(), Processed::Yes, "{e}"),
        other => panic!("a reply of another request must be ReplyLost, got {other:?}"),
    }

    let tallies = a.entities().event_sourced::<Tally>().expect("registered");
    let on_b = id_on(tallies.entity_handle(), "b").await;
    let now: u64 = tallies
        .ask_retrying(&on_b, Count { what: "pears".into(), n: 2 }, RetryPolicy::default())
        .await
        .expect("counts");
    assert_eq!(now, 2);
    // The same request id twice: applied once, the first reply both times.
    let rid = RequestId::new("count-apples-1");
    let first =
        tallies.ask_with_request_id(&on_b, Count { what: "apples".into(), n: 5 }, rid.clone()).await.expect("counts");
    let again = tallies.ask_with_request_id(&on_b, Count { what: "apples".into(), n: 5 }, rid).await.expect("answered");
    assert_eq!((first, again), (5, 5));
    let counts = tallies.ask(&on_b, Counts).await.expect("answers");
    assert_eq!(counts, BTreeMap::from([("apples".to_string(), 5), ("pears".to_string(), 2)]));

    b.leave().await.expect("b leaves");
    a.leave().await.expect("a leaves");
}
