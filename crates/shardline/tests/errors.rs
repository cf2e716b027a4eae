//! Every error a caller can get says whether its message was processed: one test per variant.
//! The probe entity counts what it processed, so each test checks the claim against the entity.

mod common;

use std::time::Duration;

use common::{eventually, logs};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use shardline::{
    Cluster, Entity, EntityContext, EntityHandle, EntityId, EntitySettings, Error, Gossip, Processed, TransportConfig,
};

#[derive(Debug, Serialize, Deserialize)]
enum Probe {
    /// Replies with how many messages this entity processed (itself included).
    Count,
    Sleep(u64),
    Panic,
    /// Processed; its reply cannot be encoded.
    UnencodableReply,
    /// Processed; its reply cannot be decoded by the asker.
    UndecodableReply,
    /// Cannot be encoded, so it never leaves the asking node.
    Unencodable(#[serde(serialize_with = "refuse")] u8),
    /// A message larger than the transport's largest frame.
    Big(Vec<u8>),
    /// Asks for a reply of this many bytes.
    BigReply(u32),
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
enum ProbeReply {
    Count(u64),
    Unencodable(#[serde(serialize_with = "refuse")] u8),
    Undecodable(#[serde(deserialize_with = "refuse_to_read")] u8),
    Bytes(Vec<u8>),
}

fn refuse<S: Serializer>(_: &u8, _: S) -> Result<S::Ok, S::Error> {
    Err(serde::ser::Error::custom("refused on purpose"))
}

fn refuse_to_read<'de, D: Deserializer<'de>>(_: D) -> Result<u8, D::Error> {
    Err(serde::de::Error::custom("refused on purpose"))
}

struct Counting(u64);

impl Entity for Counting {
    type Message = Probe;
    type Reply = ProbeReply;

    fn new(_id: &EntityId) -> Self {
        Counting(0)
    }

    async fn handle(&mut self, _ctx: &mut EntityContext, msg: Probe) -> ProbeReply {
        self.0 += 1;
        match msg {
            Probe::Count | Probe::Unencodable(_) | Probe::Big(_) => ProbeReply::Count(self.0),
            Probe::BigReply(n) => ProbeReply::Bytes(vec![7; n as usize]),
            Probe::Sleep(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                ProbeReply::Count(self.0)
            }
            Probe::Panic => panic!("the probe panics on purpose"),
            Probe::UnencodableReply => ProbeReply::Unencodable(0),
            Probe::UndecodableReply => ProbeReply::Undecodable(0),
        }
    }
}

fn settings() -> EntitySettings {
    EntitySettings::new("probe").shards(8).ask_timeout(Duration::from_secs(10))
}

async fn lone(name: &str) -> (Cluster, EntityHandle<Counting>) {
    logs();
    let c = Cluster::builder().cluster_name(name).build().await.expect("node starts");
    let h = c.register::<Counting>(settings()).await.expect("type registers");
    (c, h)
}

/// Largest frame of the clusters that test oversized messages.
const MAX_FRAME: usize = 64 * 1024;

/// Two nodes; returns the asking handle on `a` and an entity id whose shard `b` hosts.
async fn remote_pair(cluster: &str) -> (Cluster, Cluster, EntityHandle<Counting>, EntityHandle<Counting>, String) {
    logs();
    let transport = TransportConfig { max_frame: MAX_FRAME, ..TransportConfig::new(cluster) };
    let a = Cluster::builder()
        .cluster_name(cluster)
        .node_name("a")
        .transport(transport.clone())
        .build()
        .await
        .expect("a starts");
    let ha = a.register::<Counting>(settings()).await.expect("registers");
    let b = Cluster::builder()
        .cluster_name(cluster)
        .node_name("b")
        .transport(transport)
        .membership(Gossip::new([a.local_addr().to_string()]))
        .build()
        .await
        .expect("b starts");
    let hb = b.register::<Counting>(settings()).await.expect("registers");
    let hb2 = hb.clone();
    eventually("b hosts a shard", Duration::from_secs(30), move || !hb2.hosted_shards().is_empty()).await;
    let on_b = hb.hosted_shards();
    let id = (0..).map(|i| format!("p{i}")).find(|id| on_b.contains(&ha.shard_of(id))).expect("some id lands on b");
    // a knows b's shard once an ask went through.
    let r = ha.entity_ref(&id).ask(Probe::Count).await;
    assert_eq!(r, Ok(ProbeReply::Count(1)));
    (a, b, ha, hb, id)
}

async fn count(h: &EntityHandle<Counting>, id: &str) -> u64 {
    match h.entity_ref(id).ask(Probe::Count).await {
        Ok(ProbeReply::Count(n)) => n - 1,
        other => panic!("count of {id}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_may_have_been_processed() {
    let (_c, h) = lone("err-timeout").await;
    let e = h.entity_ref("slow");
    let err = e.ask_timeout(Probe::Sleep(300), Duration::from_millis(20)).await.expect_err("too slow");
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    assert_eq!(err.processed(), Processed::Maybe);
    // It was, in fact, processed after the caller gave up.
    assert_eq!(count(&h, "slow").await, 1);
}

/// A node that left refuses what is still sent through it, as not processed. The entity lives
/// on the other node, so its count shows whether the refused messages reached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_was_not_processed() {
    let (a, _b, ha, hb, id) = remote_pair("err-unavailable").await;
    assert_eq!(count(&hb, &id).await, 1, "remote_pair's ask");
    a.leave_within(Duration::from_secs(20)).await.expect("a leaves");
    let err = ha.entity_ref(&id).ask(Probe::Count).await.expect_err("the node left");
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert!(err.is_safe_to_retry());
    let told = ha.entity_ref(&id).tell(Probe::Count);
    assert!(matches!(told, Err(Error::Unavailable(_))), "{told:?}");
    // Only remote_pair's ask and the first count: the refused ask, which would have been
    // processed before its answer came, did not reach the entity.
    assert_eq!(count(&hb, &id).await, 2, "the entity processed a message its sender was told was not");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overloaded_was_not_processed() {
    logs();
    let c = Cluster::builder().cluster_name("err-overloaded").build().await.unwrap();
    let h = c.register::<Counting>(settings().mailbox(1)).await.unwrap();
    let e = h.entity_ref("busy");
    let slow = {
        let e = e.clone();
        tokio::spawn(async move { e.ask(Probe::Sleep(400)).await })
    };
    eventually("the slow message runs", Duration::from_secs(10), || h.active_entities() == 1).await;
    let mut asks = Vec::new();
    for _ in 0..5 {
        let e = e.clone();
        asks.push(tokio::spawn(async move { e.ask(Probe::Count).await }));
    }
    let mut refused = 0;
    for a in asks {
        if let Err(err) = a.await.unwrap() {
            assert!(matches!(err, Error::Overloaded(_)), "{err:?}");
            assert!(err.is_safe_to_retry());
            refused += 1;
        }
    }
    slow.await.unwrap().unwrap();
    assert!(refused >= 1, "a mailbox of 1 refused something");
    // Sleep + the accepted asks, and not one refused ask.
    assert_eq!(count(&h, "busy").await, 1 + 5 - refused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_was_not_processed() {
    let (_a, _b, ha, _hb, id) = remote_pair("err-rejected").await;
    let err = ha.entity_ref(&id).ask(Probe::Unencodable(0)).await.expect_err("cannot be encoded");
    assert!(matches!(err, Error::Rejected(_)), "{err:?}");
    assert!(err.is_safe_to_retry());
    // Too large for a frame: refused before it is written, and the connection stays up.
    let err = ha.entity_ref(&id).ask(Probe::Big(vec![1; MAX_FRAME + 1])).await.expect_err("too large");
    assert!(matches!(err, Error::Rejected(_)), "{err:?}");
    assert!(err.to_string().contains("exceeds the maximum"), "{err}");
    assert_eq!(count(&ha, &id).await, 1, "only the first Count ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_lost_was_processed() {
    let (_a, _b, ha, _hb, id) = remote_pair("err-reply-lost").await;
    for (msg, what) in [(Probe::UnencodableReply, "encode"), (Probe::UndecodableReply, "decode")] {
        let err = ha.entity_ref(&id).ask(msg).await.expect_err("the reply is lost");
        assert!(matches!(err, Error::ReplyLost(_)), "{what}: {err:?}");
        assert!(err.to_string().contains(what), "{err}");
        assert_eq!(err.processed(), Processed::Yes);
        assert!(!err.is_safe_to_retry());
    }
    // A reply too large for a frame: the entity ran, the asker hears that the reply was lost.
    let err = ha.entity_ref(&id).ask(Probe::BigReply(MAX_FRAME as u32 + 1)).await.expect_err("reply too large");
    assert!(matches!(err, Error::ReplyLost(_)), "{err:?}");
    assert!(err.to_string().contains("exceeds the maximum"), "{err}");
    assert_eq!(count(&ha, &id).await, 4, "Count, then the three messages whose replies were lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcome_unknown_when_the_entity_panics() {
    let (c, h) = lone("err-panic").await;
    let err = h.entity_ref("boom").ask(Probe::Panic).await.expect_err("it panicked");
    assert!(matches!(err, Error::OutcomeUnknown(_)), "{err:?}");
    assert_eq!(err.processed(), Processed::Maybe);
    // The panic cost that instance only: the next message starts a fresh one, and the shard
    // still stops (the node can leave).
    assert_eq!(count(&h, "boom").await, 0);
    c.leave_within(Duration::from_secs(20)).await.expect("leaves after an entity panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcome_unknown_when_a_remote_entity_panics() {
    let (_a, _b, ha, _hb, id) = remote_pair("err-panic-remote").await;
    // The asker on the other node hears of the panic at once, not when its ask times out.
    let err = ha.entity_ref(&id).ask_timeout(Probe::Panic, Duration::from_secs(30)).await.expect_err("it panicked");
    assert!(matches!(err, Error::OutcomeUnknown(_)), "{err:?}");
    assert!(err.to_string().contains("panicked"), "{err}");
    assert_eq!(count(&ha, &id).await, 0, "a fresh instance");
}
