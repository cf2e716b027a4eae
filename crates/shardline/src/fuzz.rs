//! Entry points of the fuzz targets (`fuzz/` at the repository's root), and the seeds of their
//! corpus. Not an API: the `fuzzing` feature exists for them alone.
//!
//! Each entry takes bytes as a peer or a coordination store could send them and must return
//! without panicking, waiting, or holding more memory than its input justifies: whatever the
//! bytes, the worst they may do is close their own connection (or be reported as an unreadable
//! value). The entries run the node's own code: the frame reader, the message decoders, the
//! handshake's rules, the gossip engine and the lease value decoders.

use shardline_core::Engine;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use shardline_core::gossip::{GossipConfig, GossipEngine, GossipId};
use shardline_core::lease::{LeaderRecord, MemberRecord, StoreValue, ValueKind};
use shardline_core::{
    CoordinatorConfig, CoordinatorEngine, DomainEvent, LeastShards, Member, MemberStatus, MembershipView, NodeId,
    RegionConfig, RegionEngine, RegionMessage, ShardId, ShardMap, ToCoordinator, ToRegion, TypeKey,
};

use crate::cluster::admin::{AdminAnswer, AdminQuery};
use crate::membership::lease::keepalive::{self, KeepAlive};
use crate::membership::lease::shard_maps::{decode_map, encode_map};
use crate::membership::lease::values::{decode_entry, encode_value};
use crate::membership::lease::Entry;
use crate::membership::PeerLink;
use crate::sharding::message::PeerMessage;
use crate::sharding::message::{ReplyAddr, WireEnvelope};
use crate::transport::handshake::{accept_answer, accept_hello, unreadable_hello};
use crate::transport::{read_frame, Wire, DEFAULT_MAX_FRAME};

/// The fuzz targets, by name (a folder of `fuzz/corpus` each).
pub const TARGETS: [&str; 4] = ["frames", "message", "handshake", "lease_value"];

/// Runs a future over bytes in memory, which never waits: one that does is a bug.
fn at_once<T>(f: impl Future<Output = T>) -> T {
    match pin!(f).as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(t) => t,
        Poll::Pending => panic!("reading bytes in memory waited"),
    }
}

/// A connection's bytes after the handshake: frames as the node reads them, each message given
/// to what the node gives it to: the protocol's engines (a coordinator that leads, a region
/// that hosts), the gossip engine, and the decoders of the encodings nested in messages.
pub fn frames(data: &[u8]) {
    let mut node = Engines::new();
    let mut rest = data;
    let mut now = 1;
    while let Ok(frame) = at_once(read_frame::<PeerMessage, _>(&mut rest, DEFAULT_MAX_FRAME)) {
        // Anything but a message after the handshake closes the connection.
        let Wire::Message(msg) = frame else { return };
        now += 100;
        node.take(now, msg);
        node.run(now);
    }
    // Time passes: every timer the messages left fires.
    node.run(now + 60_000);
}

/// The sans-IO engines of one node, as the peer `peer` talks to it.
struct Engines {
    peer: NodeId,
    gossip: Option<GossipEngine>,
    coordinator: Option<CoordinatorEngine>,
    region: RegionEngine<WireEnvelope>,
}

const SHARDS: u32 = 16;
const TERM: u64 = 3;

impl Engines {
    fn new() -> Engines {
        let (me, peer) = (NodeId::new("fuzz", 1), NodeId::new("peer", 1));
        let mut view = MembershipView::new();
        for n in [&me, &peer] {
            let _ = view.add(Member::new(n.clone(), 1).with_status(MemberStatus::Up));
        }
        let strategy = Box::new(LeastShards::unlimited());
        let coordinator =
            CoordinatorEngine::new(CoordinatorConfig::new(SHARDS), me.clone(), TERM, strategy, view, None, 0).ok();
        let mut region = RegionEngine::new(RegionConfig::new(SHARDS), me);
        region.handle_coordinator_changed(0, peer.clone(), TERM);
        Engines { peer, gossip: gossip_engine(), coordinator, region }
    }

    fn take(&mut self, now: u64, msg: PeerMessage) {
        match msg {
            PeerMessage::Membership(data) => {
                if let Some(g) = &mut self.gossip {
                    g.handle_data(now, &data);
                }
                let _ = keepalive::receive(&Sink, &self.peer, &data);
            }
            PeerMessage::ToCoordinator { msg, .. } => {
                if let Some(c) = &mut self.coordinator {
                    c.handle_message(now, &self.peer, msg);
                }
            }
            PeerMessage::ToRegion { msg, .. } => {
                if let ToRegion::HandedState { data, .. } = &msg {
                    let _ = shardline_core::host::decode_handover(data);
                }
                self.region.handle_coordinator_message(now, &self.peer, msg);
            }
            PeerMessage::Region { msg, .. } => self.region.handle_region_message(now, &self.peer, msg),
            other => nested(other),
        }
    }

    /// Fires the timers due by `now` and drops what the engines would send.
    fn run(&mut self, now: u64) {
        if let Some(g) = &mut self.gossip {
            if g.poll_timeout().is_some_and(|t| t <= now) {
                g.handle_timeout(now);
            }
            g.drain_commands().for_each(drop);
        }
        if let Some(c) = &mut self.coordinator {
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
            c.drain_commands().for_each(drop);
        }
        if self.region.poll_timeout().is_some_and(|t| t <= now) {
            self.region.handle_timeout(now);
        }
        self.region.drain_commands().for_each(drop);
    }
}

/// The encodings inside the other messages, decoded as the node decodes them.
fn nested(msg: PeerMessage) {
    match msg {
        PeerMessage::Admin { query, .. } => {
            let _ = postcard::from_bytes::<AdminQuery>(&query);
        }
        PeerMessage::Reply { result: Ok(bytes), .. } => {
            let _ = postcard::from_bytes::<AdminAnswer>(&bytes);
        }
        _ => {}
    }
}

/// A gossip engine for one input (None only if the fixed identity were refused).
fn gossip_engine() -> Option<GossipEngine> {
    let me = GossipId {
        addr: "127.0.0.1:7000".into(),
        node: Some(NodeId::new("fuzz", 1)),
        app_version: "1".into(),
        roles: Vec::new(),
        weight: 1,
    };
    GossipEngine::new(GossipConfig::default(), me, &["127.0.0.1:7001".into()], 0, 1)
}

/// Where keep-alive answers go: nowhere (the entry looks at what the decoder does, not at
/// what it sends).
struct Sink;

impl PeerLink for Sink {
    fn send(&self, _: &NodeId, _: std::net::SocketAddr, _: Vec<u8>) -> Result<(), &'static str> {
        Ok(())
    }

    fn send_to_address(
        &self,
        _: std::net::SocketAddr,
        _: Vec<u8>,
    ) -> crate::membership::BoxFuture<'static, Result<NodeId, crate::TransportError>> {
        Box::pin(async { Err(crate::TransportError::HandshakeTimeout) })
    }

    fn identify(
        &self,
        _: std::net::SocketAddr,
    ) -> crate::membership::BoxFuture<'static, Result<NodeId, crate::TransportError>> {
        Box::pin(async { Err(crate::TransportError::HandshakeTimeout) })
    }
}

/// Whether a frame body decodes as the node decodes it.
pub fn decodes(data: &[u8]) -> bool {
    Wire::<PeerMessage>::decode(data).is_ok()
}

/// One frame body: decoded as the node decodes it; one that decodes must encode again, to the
/// same bytes as its own encoding decoded once more (nothing is lost or changed in a round trip).
pub fn message(data: &[u8]) {
    let Ok(frame) = Wire::<PeerMessage>::decode(data) else { return };
    let mut once = Vec::new();
    frame.encode_into(&mut once).expect("a frame that decoded encodes");
    let again = Wire::<PeerMessage>::decode(&once[4..]).expect("an encoded frame decodes");
    let mut twice = Vec::new();
    again.encode_into(&mut twice).expect("a frame that decoded encodes");
    assert_eq!(once, twice, "a frame changed in a round trip");
}

/// The first bytes of a connection, both ways: as the acceptor reads a `Hello` and decides, and
/// as a dialer reads the answer and decides.
pub fn handshake(data: &[u8]) {
    let me = NodeId::new("me", 7);
    let no_tls = |_: &str| Ok(());
    let mut rest = data;
    match at_once(read_frame::<PeerMessage, _>(&mut rest, DEFAULT_MAX_FRAME)) {
        Ok(first) => {
            let _ = accept_hello(first, &me, "fuzz", no_tls);
        }
        Err(e) => {
            let _ = unreadable_hello(e).to_string();
        }
    }
    let mut rest = data;
    if let Ok(answer) = at_once(read_frame::<PeerMessage, _>(&mut rest, DEFAULT_MAX_FRAME)) {
        let _ = accept_answer(answer, Some(&me), no_tls);
    }
}

/// A value read from the coordination store (etcd, NATS KV), as each kind of key, and as a
/// stored shard map.
pub fn lease_value(data: &[u8]) {
    for kind in [ValueKind::Member, ValueKind::Leader, ValueKind::Term, ValueKind::SlotHolder, ValueKind::SplitBrain] {
        let entry = Entry { key: "fuzz/key".into(), value: data.to_vec(), revision: 1 };
        if let Ok(value) = decode_entry(entry, kind).value {
            // What was read can be written back.
            encode_value(&value).expect("a value that decoded encodes");
        }
    }
    if let Ok((_, stored)) = decode_map("fuzz", data) {
        // What a new coordinator does with a stored map: resumes from it, then allocates its
        // shards again, each at an epoch above the one it had, or refuses to; never at one that
        // is not above it (a lower epoch would let the previous owner's messages through its
        // fence).
        let Ok(mut map) = ShardMap::resume(stored.num_shards(), Some(&stored)) else { return };
        let shards: Vec<ShardId> = map.iter().map(|(s, _)| s).take(64).collect();
        for shard in shards {
            let before = map.slot(shard).map(|s| s.epoch);
            if let Ok(epoch) = map.assign(shard, NodeId::new("fuzz", 1), 7) {
                assert!(Some(epoch) > before, "{shard} allocated at {epoch}, not above {before:?}");
            }
        }
    }
}

/// Seeds of each target's corpus: real encodings of what nodes and stores exchange, by target
/// and file name.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let a = NodeId::new("a", 1_700_000_000_001);
    let b = NodeId::new("b", 1_700_000_000_002);
    let t = TypeKey::new("account");
    let hello = Wire::<PeerMessage>::Hello {
        protocol: crate::transport::OLDEST_PROTOCOL,
        cluster: "fuzz".into(),
        from: a.clone(),
        listen: "127.0.0.1:7100".parse().expect("a literal address"),
        to: Some(NodeId::new("me", 7)),
        newest: crate::transport::PROTOCOL_VERSION,
    };
    let by_address = Wire::<PeerMessage>::Hello {
        protocol: crate::transport::OLDEST_PROTOCOL,
        cluster: "fuzz".into(),
        from: a.clone(),
        listen: "127.0.0.1:7100".parse().expect("a literal address"),
        to: None,
        newest: crate::transport::PROTOCOL_VERSION,
    };
    let mut gossip_data = Vec::new();
    if let Some(mut g) = gossip_engine() {
        g.handle_timeout(1_000);
        for c in g.drain_commands() {
            if let shardline_core::gossip::GossipCommand::Send { data, .. } = c {
                gossip_data.push(data);
            }
        }
    }
    let ping = postcard::to_allocvec(&KeepAlive::Ping { addr: "127.0.0.1:7100".into() }).unwrap_or_default();
    let envelope = WireEnvelope {
        entity: shardline_core::EntityId::new("acct-1"),
        payload: vec![1, 2, 3],
        reply: Some(ReplyAddr { node: a.clone(), req_id: 9 }),
        trace: Some(crate::trace::TraceContext { trace_id: [0x4b; 16], span_id: [0xf0; 8], flags: 1 }),
    };
    let epoch = shardline_core::Epoch { term: 3, seq: 4 };
    let mut messages = vec![
        ("gossip-ping", PeerMessage::Membership(ping)),
        (
            "register",
            PeerMessage::ToCoordinator {
                type_key: t.clone(),
                msg: ToCoordinator::Register { term: 3, hosted: vec![(ShardId(1), epoch)], hosting: true },
            },
        ),
        (
            "forward",
            PeerMessage::Region {
                type_key: t.clone(),
                msg: RegionMessage::Forward { shard: ShardId(1), epoch, seq: 1, stream: 2, position: 1, msg: envelope },
            },
        ),
        (
            "handover",
            PeerMessage::ToRegion {
                type_key: t.clone(),
                msg: ToRegion::HandedState {
                    term: 3,
                    shard: ShardId(2),
                    epoch,
                    data: postcard::to_allocvec(&vec![("acct-1".to_string(), vec![7u8])]).unwrap_or_default(),
                },
            },
        ),
        (
            "events",
            PeerMessage::Events { type_key: t.clone(), events: vec![DomainEvent::NodeJoined { node: b.clone() }] },
        ),
        (
            "admin",
            PeerMessage::Admin { req_id: 5, query: postcard::to_allocvec(&AdminQuery::Hosting).unwrap_or_default() },
        ),
        (
            "reply",
            PeerMessage::Reply { req_id: 5, result: Err(crate::Error::Timeout(std::time::Duration::from_secs(5))) },
        ),
    ];
    for (i, data) in gossip_data.into_iter().enumerate() {
        messages.push((if i == 0 { "gossip-swim" } else { "gossip-swim-more" }, PeerMessage::Membership(data)));
    }
    let mut out = Vec::new();
    let framed = |w: &Wire<PeerMessage>| {
        let mut buf = Vec::new();
        let _ = w.encode_into(&mut buf);
        buf
    };
    let mut stream = Vec::new();
    for (name, m) in messages {
        let frame = framed(&Wire::Message(m));
        out.push(("message", name.to_string(), frame[4..].to_vec()));
        stream.extend_from_slice(&frame);
    }
    out.push(("frames", "session".into(), stream));
    out.push(("handshake", "hello".into(), framed(&hello)));
    out.push(("handshake", "hello-by-address".into(), framed(&by_address)));
    out.push((
        "handshake",
        "hello-ok".into(),
        framed(&Wire::HelloOk { node: NodeId::new("me", 7), protocol: Some(crate::transport::PROTOCOL_VERSION) }),
    ));
    out.push(("handshake", "refuse".into(), framed(&Wire::Refuse { reason: "cluster name mismatch".into() })));
    let member = StoreValue::Member(MemberRecord {
        node: a.clone(),
        addr: "127.0.0.1:7100".into(),
        app_version: "1".into(),
        roles: vec!["worker".into()],
        weight: 1,
        status: shardline_core::MemberStatus::Up,
        slot: Some(0),
        downed: Vec::new(),
    });
    let leader = StoreValue::Leader(LeaderRecord { node: a.clone(), term: 3 });
    for (name, v) in
        [("member", member), ("leader", leader), ("term", StoreValue::Term(3)), ("slot", StoreValue::SlotHolder(b))]
    {
        if let Ok(bytes) = encode_value(&v) {
            out.push(("lease_value", name.into(), bytes));
        }
    }
    let mut map = ShardMap::new(4).expect("four shards");
    for (i, owner) in [(0, &a), (2, &a)] {
        let _ = map.assign(ShardId(i), owner.clone(), 3);
    }
    if let Ok(bytes) = encode_map("account", 3, &map) {
        out.push(("lease_value", "shard-map".into(), bytes));
    }
    out
}
