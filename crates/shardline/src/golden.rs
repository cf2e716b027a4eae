//! The golden encodings (`golden/` in this crate): every stored record and every frame, as each
//! version of Shardline wrote it, read by today's code. Test support: it names every layer.
//!
//! - `golden/stored/v{N}/`: coordination store records in layout N (0: before records carried a
//!   version). Files of layout 0 and the frames of `wire/v3` that the fuzz corpus held were
//!   written by the last build of before the layout versions.
//! - `golden/wire/v{N}/`: frame bodies as a node of protocol version N sends them.
//!
//! Today's encoding of each sample must be its file in the newest folder, byte for byte: a
//! change of layout fails here until it gets a new version (a `read_version` arm for a stored
//! record, a protocol version for a frame) and a new folder. `write_missing_goldens` (ignored)
//! writes the files of today's layout that are missing; it never overwrites one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use shardline_core::lease::{LeaderRecord, MemberRecord, SplitBrainRecord};
use shardline_core::{
    BounceReason, DomainEvent, EntityId, Epoch, MemberStatus, NodeId, RebalanceReason, RegionMessage, ShardHome,
    ShardId, ShardMap, ToCoordinator, ToRegion, TypeKey,
};

use crate::cluster::admin::{AdminAnswer, AdminError, AdminQuery, RebalancingReport};
use crate::format::{decode, encode, encode_as, Stored};
use crate::membership::lease::keepalive::KeepAlive;
use crate::membership::lease::shard_maps::{encode_map, StoredMap};
use crate::membership::lease::values::{SlotHolder, TermCounter};
use crate::sharding::message::PeerMessage;
use crate::sharding::message::{ReplyAddr, WireEnvelope};
use crate::trace::TraceContext;
use crate::transport::{Wire, OLDEST_PROTOCOL, PROTOCOL_VERSION};
use crate::Error;

/// Reads a golden file and encodes what it read as today's code writes it.
type Read = Box<dyn Fn(&[u8]) -> Result<Vec<u8>, String>>;

struct Sample {
    /// `stored` or `wire`.
    dir: &'static str,
    name: String,
    /// The newest layout, whose folder holds `current`.
    version: u32,
    current: Vec<u8>,
    read: Read,
    /// What reading the file of an older version gives, where that is not `current`.
    older: Vec<(u32, Vec<u8>)>,
}

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

fn stored<T: Stored + 'static>(name: &str, record: T) -> Sample {
    Sample {
        dir: "stored",
        name: name.into(),
        version: T::VERSION,
        current: encode(&record).expect("a sample encodes"),
        read: Box::new(|bytes| decode::<T>(bytes).map_err(|e| e.to_string()).and_then(|t| ok(encode(&t)))),
        older: Vec::new(),
    }
}

fn ok(r: Result<Vec<u8>, postcard::Error>) -> Result<Vec<u8>, String> {
    r.map_err(|e| e.to_string())
}

fn body(frame: &Wire<PeerMessage>) -> Vec<u8> {
    let mut buf = Vec::new();
    frame.encode_into(&mut buf).expect("a sample encodes");
    buf.split_off(4)
}

/// Decodes a frame, and the encodings nested in its messages (keep-alives, admin questions and
/// answers, handed-over state), each of which must read back as it was.
fn read_frame(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let frame = Wire::<PeerMessage>::decode(bytes).map_err(|e| e.to_string())?;
    let same = |nested: &[u8], again: Result<Vec<u8>, postcard::Error>| match ok(again)? {
        a if a == nested => Ok(()),
        _ => Err("a nested encoding reads back otherwise".to_string()),
    };
    match &frame {
        Wire::Message(PeerMessage::Membership(data)) => {
            let k: KeepAlive = postcard::from_bytes(data).map_err(|e| e.to_string())?;
            same(data, postcard::to_allocvec(&k))?;
        }
        Wire::Message(PeerMessage::Admin { query, .. }) => {
            let q: AdminQuery = postcard::from_bytes(query).map_err(|e| e.to_string())?;
            same(query, postcard::to_allocvec(&q))?;
        }
        Wire::Message(PeerMessage::ToRegion { msg: ToRegion::HandedState { data, .. }, .. }) => {
            let h = shardline_core::host::decode_handover(data).map_err(|e| e.to_string())?;
            same(data, postcard::to_allocvec(&h))?;
        }
        _ => {}
    }
    Ok(body(&frame))
}

fn wire(name: &str, frame: Wire<PeerMessage>) -> Sample {
    Sample {
        dir: "wire",
        name: name.into(),
        version: PROTOCOL_VERSION,
        current: body(&frame),
        read: Box::new(read_frame),
        older: Vec::new(),
    }
}

fn message(name: &str, m: PeerMessage) -> Sample {
    let answer = name.starts_with("answer-");
    let mut s = wire(name, Wire::Message(m));
    if answer {
        s.read = Box::new(read_answer);
    }
    s
}

/// A reply whose bytes are an admin answer (a reply's bytes are otherwise the entity's own).
fn read_answer(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let Wire::Message(PeerMessage::Reply { result: Ok(answer), .. }) =
        Wire::<PeerMessage>::decode(bytes).map_err(|e| e.to_string())?
    else {
        return Err("not a reply".into());
    };
    let a: Result<AdminAnswer, AdminError> = postcard::from_bytes(&answer).map_err(|e| e.to_string())?;
    if ok(postcard::to_allocvec(&a))? != answer {
        return Err("the admin answer reads back otherwise".into());
    }
    read_frame(bytes)
}

fn hello(to: Option<NodeId>, newest: u32) -> Wire<PeerMessage> {
    Wire::Hello {
        protocol: OLDEST_PROTOCOL,
        cluster: "fuzz".into(),
        from: NodeId::new("a", 1_700_000_000_001),
        listen: "127.0.0.1:7100".parse().expect("a literal address"),
        to,
        newest,
    }
}

fn encoded<T: serde::Serialize>(t: &T) -> Vec<u8> {
    postcard::to_allocvec(t).expect("a sample encodes")
}

fn samples() -> Vec<Sample> {
    let a = NodeId::new("a", 1_700_000_000_001);
    let b = NodeId::new("b", 1_700_000_000_002);
    let t = TypeKey::new("account");
    let epoch = Epoch { term: 3, seq: 4 };
    let home = ShardHome { owner: b.clone(), epoch };
    let me = NodeId::new("me", 7);

    let member = MemberRecord {
        node: a.clone(),
        addr: "127.0.0.1:7100".into(),
        app_version: "1".into(),
        roles: vec!["worker".into()],
        weight: 1,
        status: MemberStatus::Up,
        slot: Some(0),
        downed: Vec::new(),
    };
    let mut map = ShardMap::new(4).expect("four shards");
    for i in [0, 2] {
        map.assign(ShardId(i), a.clone(), 3).expect("a shard of the map");
    }
    let stored_map: StoredMap = decode(&encode_map("account", 3, &map).expect("a map encodes")).expect("reads back");
    let mut out = vec![
        stored("member", member),
        stored("leader", LeaderRecord { node: a.clone(), term: 3 }),
        stored("term", TermCounter(3)),
        stored("slot", SlotHolder(b.clone())),
        stored("split-brain", SplitBrainRecord { winner: a.clone(), downed: vec![b.clone()] }),
        stored("shard-map", stored_map),
    ];
    // A map is written from a borrowed view; it must be the record's own encoding.
    assert_eq!(out[5].current, encode_as::<StoredMap>(&decode::<StoredMap>(&out[5].current).unwrap()).unwrap());

    // A handshake of an older version reads as what that version said: its own newest.
    let mut h = wire("hello", hello(Some(me.clone()), PROTOCOL_VERSION));
    h.older.push((3, body(&hello(Some(me.clone()), 3))));
    h.older.push((4, body(&hello(Some(me.clone()), 4))));
    out.push(h);
    let mut h = wire("hello-by-address", hello(None, PROTOCOL_VERSION));
    h.older.push((3, body(&hello(None, 3))));
    h.older.push((4, body(&hello(None, 4))));
    out.push(h);
    let mut ok = wire("hello-ok", Wire::HelloOk { node: me.clone(), protocol: Some(PROTOCOL_VERSION) });
    ok.older.push((3, body(&Wire::HelloOk { node: me.clone(), protocol: None })));
    ok.older.push((4, body(&Wire::HelloOk { node: me.clone(), protocol: Some(4) })));
    out.push(ok);
    out.push(wire("refuse", Wire::Refuse { reason: "cluster name mismatch".into() }));

    let envelope = WireEnvelope {
        entity: EntityId::new("acct-1"),
        payload: vec![1, 2, 3],
        reply: Some(ReplyAddr { node: a.clone(), req_id: 9 }),
        trace: None,
    };
    // Protocol 5: the same envelope with its caller's trace in the frame's trailer.
    let traced = WireEnvelope {
        trace: Some(TraceContext { trace_id: [0x4b; 16], span_id: [0xf0; 8], flags: 1 }),
        ..envelope.clone()
    };
    let to_coordinator = |msg| PeerMessage::ToCoordinator { type_key: t.clone(), msg };
    let to_region = |msg| PeerMessage::ToRegion { type_key: t.clone(), msg };
    let region = |msg| PeerMessage::Region { type_key: t.clone(), msg };
    let admin = |q: AdminQuery| PeerMessage::Admin { req_id: 5, query: encoded(&q) };
    let answer = |a: Result<AdminAnswer, AdminError>| PeerMessage::Reply { req_id: 5, result: Ok(encoded(&a)) };
    let reply = |e: Error| PeerMessage::Reply { req_id: 5, result: Err(e) };
    let handed = encoded(&vec![("acct-1".to_string(), vec![7u8])]);
    let events = vec![
        DomainEvent::NodeJoined { node: b.clone() },
        DomainEvent::NodeLeft { node: b.clone() },
        DomainEvent::NodeFailed { node: b.clone() },
        DomainEvent::LeaderElected { node: a.clone(), term: 3 },
        DomainEvent::LeadershipLost { node: a.clone(), term: 3 },
        DomainEvent::Deposed { node: a.clone(), term: 3, by: 4 },
        DomainEvent::ShardAssigned { shard: ShardId(1), home: home.clone() },
        DomainEvent::ShardMigrated { shard: ShardId(1), from: a.clone(), to: home.clone() },
        DomainEvent::HandOffTimedOut { shard: ShardId(1), owner: a.clone(), abandoned: true },
        DomainEvent::RebalancingTriggered { term: 3, reason: RebalanceReason::Membership, planned: 2 },
        DomainEvent::RebalancingTriggered { term: 3, reason: RebalanceReason::Periodic, planned: 2 },
        DomainEvent::RebalancingTriggered { term: 3, reason: RebalanceReason::Strategy, planned: 2 },
        DomainEvent::RebalancingTriggered { term: 3, reason: RebalanceReason::Requested, planned: 2 },
        DomainEvent::RebalancingCompleted { term: 3, moved: 2 },
        DomainEvent::StaleShardStopped { shard: ShardId(1), node: b.clone(), epoch },
    ];
    let messages = vec![
        ("gossip-ping", PeerMessage::Membership(encoded(&KeepAlive::Ping { addr: "127.0.0.1:7100".into() }))),
        ("gossip-pong", PeerMessage::Membership(encoded(&KeepAlive::Pong))),
        (
            "register",
            to_coordinator(ToCoordinator::Register { term: 3, hosted: vec![(ShardId(1), epoch)], hosting: true }),
        ),
        ("get-shard-home", to_coordinator(ToCoordinator::GetShardHome { shard: ShardId(1) })),
        ("begin-hand-off-ack", to_coordinator(ToCoordinator::BeginHandOffAck { term: 3, shard: ShardId(1) })),
        (
            "shard-stopped",
            to_coordinator(ToCoordinator::ShardStopped {
                term: 3,
                shard: ShardId(1),
                epoch,
                handover: Some(handed.clone()),
            }),
        ),
        ("coordinator-started", to_region(ToRegion::CoordinatorStarted { term: 3 })),
        ("welcome", to_region(ToRegion::Welcome { term: 3, homes: vec![(ShardId(1), home.clone())] })),
        ("shard-homes", to_region(ToRegion::ShardHomes { term: 3, homes: vec![(ShardId(1), home.clone())] })),
        ("begin-hand-off", to_region(ToRegion::BeginHandOff { term: 3, shard: ShardId(2) })),
        ("handover", to_region(ToRegion::HandedState { term: 3, shard: ShardId(2), epoch, data: handed })),
        ("hand-off", to_region(ToRegion::HandOff { term: 3, shard: ShardId(2), epoch })),
        (
            "forward",
            region(RegionMessage::Forward {
                shard: ShardId(1),
                epoch,
                seq: 1,
                stream: 2,
                position: 1,
                msg: envelope.clone(),
            }),
        ),
        (
            "forward-traced",
            region(RegionMessage::Forward {
                shard: ShardId(1),
                epoch,
                seq: 1,
                stream: 2,
                position: 1,
                msg: traced.clone(),
            }),
        ),
        (
            "bounce-traced",
            region(RegionMessage::Bounce { shard: ShardId(1), seq: 1, reason: BounceReason::NotOwner, msg: traced }),
        ),
        (
            "bounce",
            region(RegionMessage::Bounce {
                shard: ShardId(1),
                seq: 1,
                reason: BounceReason::NotOwner,
                msg: envelope.clone(),
            }),
        ),
        (
            "bounce-rebalancing",
            region(RegionMessage::Bounce {
                shard: ShardId(1),
                seq: 1,
                reason: BounceReason::RebalanceInProgress,
                msg: envelope,
            }),
        ),
        ("flush", region(RegionMessage::Flush { shard: ShardId(1), token: 6 })),
        ("flush-ack", region(RegionMessage::FlushAck { shard: ShardId(1), token: 6 })),
        (
            "events",
            PeerMessage::Events { type_key: t.clone(), events: vec![DomainEvent::NodeJoined { node: b.clone() }] },
        ),
        ("events-all", PeerMessage::Events { type_key: t.clone(), events }),
        ("admin", admin(AdminQuery::Hosting)),
        ("admin-shard-map", admin(AdminQuery::ShardMap { type_key: t.clone() })),
        ("admin-rebalancing", admin(AdminQuery::Rebalancing { type_key: t.clone() })),
        ("admin-rebalance", admin(AdminQuery::Rebalance { type_key: t.clone() })),
        ("admin-assign", admin(AdminQuery::Assign { type_key: t.clone(), assignments: vec![(1, "b".into())] })),
        ("admin-drain", admin(AdminQuery::Drain)),
        ("admin-signed", admin(AdminQuery::Signed { at_ms: 17, query: encoded(&AdminQuery::Drain), tag: vec![9; 32] })),
        ("answer-draining", answer(Ok(AdminAnswer::Draining))),
        (
            "answer-rebalancing",
            answer(Ok(AdminAnswer::Rebalancing(RebalancingReport {
                type_key: "account".into(),
                in_progress: true,
                reason: Some("requested".into()),
                moved: 1,
                total: 2,
                moved_since_leading: 3,
                rounds: 4,
            }))),
        ),
        ("answer-unknown-type", answer(Err(AdminError::UnknownType("x".into())))),
        ("answer-unknown-node", answer(Err(AdminError::UnknownNode("x".into())))),
        ("answer-already-leaving", answer(Err(AdminError::AlreadyLeaving("x".into())))),
        ("answer-no-leader", answer(Err(AdminError::NoLeader("x".into())))),
        ("answer-invalid", answer(Err(AdminError::Invalid("x".into())))),
        ("answer-no-answer", answer(Err(AdminError::NoAnswer { node: "b".into(), reason: "x".into() }))),
        ("answer-unauthorized", answer(Err(AdminError::Unauthorized("x".into())))),
        ("reply", reply(Error::Timeout(Duration::from_secs(5)))),
        ("reply-ok", PeerMessage::Reply { req_id: 5, result: Ok(vec![1, 2]) }),
        ("reply-unavailable", reply(Error::Unavailable("x".into()))),
        ("reply-overloaded", reply(Error::Overloaded("x".into()))),
        ("reply-rejected", reply(Error::Rejected("x".into()))),
        ("reply-lost", reply(Error::ReplyLost("x".into()))),
        ("reply-outcome-unknown", reply(Error::OutcomeUnknown("x".into()))),
        ("reply-expired", reply(Error::RequestExpired("x".into()))),
    ];
    out.extend(messages.into_iter().map(|(name, m)| message(name, m)));
    out
}

/// The golden files of `dir`: (version, file name, bytes).
fn files(dir: &str) -> Vec<(u32, String, Vec<u8>)> {
    let mut out = Vec::new();
    for v in std::fs::read_dir(golden().join(dir)).expect("the golden folder") {
        let v = v.expect("a golden folder's entry").path();
        let name = v.file_name().and_then(|n| n.to_str()).expect("a folder name").to_string();
        let version: u32 =
            name.strip_prefix('v').and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{name}: not v{{N}}"));
        for f in std::fs::read_dir(&v).expect("a version folder") {
            let f = f.expect("a golden file").path();
            let file = f.file_stem().and_then(|n| n.to_str()).expect("a file name").to_string();
            out.push((version, file, std::fs::read(&f).expect("a golden file reads")));
        }
    }
    out
}

#[test]
fn every_golden_file_of_every_version_reads_as_its_sample() {
    let samples = samples();
    let mut read = 0;
    for dir in ["stored", "wire"] {
        for (version, name, bytes) in files(dir) {
            let s = samples
                .iter()
                .find(|s| s.dir == dir && s.name == name)
                .unwrap_or_else(|| panic!("{dir}/v{version}/{name}.bin: no sample of that name"));
            let got = (s.read)(&bytes).unwrap_or_else(|e| panic!("{dir}/v{version}/{name}.bin does not read: {e}"));
            let want = s.older.iter().find(|(v, _)| *v == version).map_or(&s.current, |(_, w)| w);
            assert_eq!(&got, want, "{dir}/v{version}/{name}.bin reads as something else than its sample");
            read += 1;
        }
    }
    assert!(read >= samples.len(), "only {read} golden files");
}

#[test]
fn todays_encoding_of_every_sample_is_its_newest_golden_file() {
    for s in samples() {
        let path = golden().join(s.dir).join(format!("v{}", s.version)).join(format!("{}.bin", s.name));
        let kept = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (a new sample: `cargo test -p shardline --lib write_missing_goldens -- --ignored`)",
                path.display()
            )
        });
        assert_eq!(
            kept,
            s.current,
            "{} changed: a new layout needs a new version (see the `format` module), and its own folder",
            path.display()
        );
    }
}

/// A node of version 3 speaks to this one, and this one to it: frames of version 3 are frames
/// this build still writes on a connection that agreed on 3. A traced message has no frame of
/// its own there: on such a connection it is written without its trailer, as its untraced self.
#[test]
fn the_oldest_protocol_has_its_golden_files() {
    let v3: Vec<String> =
        files("wire").into_iter().filter(|(v, ..)| *v == OLDEST_PROTOCOL).map(|(_, name, _)| name).collect();
    for s in samples().iter().filter(|s| s.dir == "wire") {
        let untraced = s.name.strip_suffix("-traced").unwrap_or(&s.name);
        assert!(v3.iter().any(|n| n == untraced), "{}: no frame of protocol {OLDEST_PROTOCOL}", s.name);
    }
}

#[test]
#[ignore = "writes the golden files of today's layouts that are missing"]
fn write_missing_goldens() {
    for s in samples() {
        let dir = golden().join(s.dir).join(format!("v{}", s.version));
        std::fs::create_dir_all(&dir).expect("the golden folder");
        let path = dir.join(format!("{}.bin", s.name));
        if !path.exists() {
            std::fs::write(&path, &s.current).expect("a golden file");
        }
    }
}
