//! Bad input on the wire: handshake mismatches, oversized and garbage frames. The node refuses or
//! closes that connection and keeps serving.

mod common;

use std::time::Duration;

use common::*;
use shardline::transport::{Wire, PROTOCOL_VERSION};

/// The handshake's frames, whatever the messages after it.
type Frame = Wire<()>;
use shardline::NodeId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn hello(addr: std::net::SocketAddr, protocol: u32, cluster: &str) -> Frame {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    Frame::Hello {
        protocol,
        cluster: cluster.into(),
        from: NodeId::new("probe", 1),
        listen: "127.0.0.1:9".parse().unwrap(),
        to: None,
        newest: protocol,
    }
    .encode_into(&mut buf)
    .unwrap();
    s.write_all(&buf).await.unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    let mut body = vec![0; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.unwrap();
    Frame::decode(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_mismatches_are_refused_with_a_reason() {
    let (c, h) = node("t1", None).await;
    let addr = c.local_addr();
    match hello(addr, PROTOCOL_VERSION + 1, "test").await {
        Frame::Refuse { reason } => assert!(reason.contains("protocol version"), "{reason}"),
        other => panic!("expected Refuse, got {other:?}"),
    }
    match hello(addr, PROTOCOL_VERSION, "another-cluster").await {
        Frame::Refuse { reason } => assert!(reason.contains("cluster name"), "{reason}"),
        other => panic!("expected Refuse, got {other:?}"),
    }
    assert!(matches!(hello(addr, PROTOCOL_VERSION, "test").await, Frame::HelloOk { .. }));
    // A node of the oldest version still spoken is answered in it.
    let oldest = shardline::transport::OLDEST_PROTOCOL;
    assert!(matches!(hello(addr, oldest, "test").await, Frame::HelloOk { protocol: Some(v), .. } if v == oldest));
    // Still serving.
    assert_eq!(h.entity_ref("x").ask(Cmd::Append(5)).await.unwrap(), vec![5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_garbage_frames_close_only_that_connection() {
    let (c, h) = node("t2", None).await;
    let addr = c.local_addr();
    // Oversized: a length over 8 MiB is refused before anything is allocated.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&(64u32 * 1024 * 1024).to_be_bytes()).await.unwrap();
    let mut byte = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut byte)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "connection closed");
    // Garbage after a valid handshake.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    Frame::Hello {
        protocol: PROTOCOL_VERSION,
        cluster: "test".into(),
        from: NodeId::new("probe", 2),
        listen: "127.0.0.1:9".parse().unwrap(),
        to: None,
        newest: PROTOCOL_VERSION,
    }
    .encode_into(&mut buf)
    .unwrap();
    s.write_all(&buf).await.unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    let mut ok = vec![0; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut ok).await.unwrap();
    s.write_all(&[0, 0, 0, 6, 250, 251, 252, 253, 254, 255]).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut byte)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "connection closed after an unknown frame kind");
    // The node keeps serving.
    assert_eq!(h.entity_ref("y").ask(Cmd::Append(7)).await.unwrap(), vec![7]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_node_is_downed_and_its_shards_move() {
    let (a, ha) = node("k1", None).await;
    let seed = Some(a.local_addr());
    let (b, _hb) = node("k2", seed).await;
    all_homed(&ha).await;
    let ha2 = ha.clone();
    eventually("k2 hosts shards", Duration::from_secs(30), move || {
        ha2.shard_homes().iter().any(|o| o.as_ref().is_some_and(|n| &*n.name == "k2"))
    })
    .await;
    b.crash();
    // After the down timeout (5 s) every shard lives on k1 again and answers.
    let ha3 = ha.clone();
    eventually("shards moved off the crashed node", Duration::from_secs(30), move || ha3.hosted_shards().len() == 32)
        .await;
    for i in 0..40 {
        ha.entity_ref(format!("z{i}")).ask(Cmd::Append(1)).await.unwrap();
    }
}

/// Records what the transport reports.
#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<String>>);

impl shardline::transport::Inbound<String> for Recorder {
    fn on_frame(&self, _: &NodeId, _: String) {}
    fn on_link_down(&self, peer: &NodeId) {
        self.0.lock().unwrap().push(format!("down {peer}"));
    }
    fn on_undeliverable(&self, peer: &NodeId, _: String) {
        self.0.lock().unwrap().push(format!("undeliverable {peer}"));
    }
    fn on_unsendable(&self, peer: &NodeId, _: String, _: shardline::TransportError) {
        self.0.lock().unwrap().push(format!("unsendable {peer}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetting_a_peer_reports_its_link_down() {
    use shardline::transport::{SendError, Transport};
    // A peer that completes the handshake and then swallows every frame: from the sender's side,
    // what a process looks like that died with our frames in its socket buffer. No write fails.
    let ghost = NodeId::new("ghost", 7);
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_addr = hole.local_addr().unwrap();
    let (got_tx, mut got) = tokio::sync::mpsc::unbounded_channel();
    let g = ghost.clone();
    tokio::spawn(async move {
        let (mut s, _) = hole.accept().await.unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.unwrap();
        let mut hello = vec![0; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut hello).await.unwrap();
        let mut buf = Vec::new();
        Frame::HelloOk { node: g, protocol: Some(PROTOCOL_VERSION) }.encode_into(&mut buf).unwrap();
        s.write_all(&buf).await.unwrap();
        let mut sink = [0u8; 4096];
        while let Ok(n) = s.read(&mut sink).await {
            if n == 0 {
                return;
            }
            let _ = got_tx.send(n);
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let t = Transport::<String>::new(NodeId::new("me", 1), &listener, shardline::TransportConfig::new("test")).unwrap();
    let rec = std::sync::Arc::new(Recorder::default());
    t.start(listener, rec.clone());
    t.set_address(&ghost, hole_addr);
    t.send(&ghost, "swallowed".to_string()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), got.recv()).await.expect("the frame was written").unwrap();
    assert!(rec.0.lock().unwrap().is_empty(), "nothing failed: the sender cannot tell the frame was lost");
    // The membership declares the peer dead: the sender learns its link is down, and frames
    // for it come back at once.
    t.forget(&ghost);
    assert_eq!(*rec.0.lock().unwrap(), vec![format!("down {ghost}")]);
    assert!(matches!(t.send(&ghost, "late".to_string()), Err(SendError::NoRoute(_))));
}

/// A send queue of 4 frames to the peer overflows all the time under a burst of tells. A
/// forwarded message that finds the queue full goes back into its region's buffer and is sent
/// again later (it used to be dropped, silently for a tell): every value arrives, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_send_queue_loses_no_told_message() {
    use shardline::{Cluster, Gossip, TransportConfig};
    logs();
    let tiny = TransportConfig { send_queue: 4, ..TransportConfig::new("jam") };
    let a = Cluster::builder().cluster_name("jam").node_name("a").transport(tiny).build().await.unwrap();
    let ha = a.register::<Log>(settings()).await.unwrap();
    let b = Cluster::builder()
        .cluster_name("jam")
        .node_name("b")
        .membership(Gossip::new([a.local_addr().to_string()]))
        .build()
        .await
        .unwrap();
    let hb = b.register::<Log>(settings()).await.unwrap();
    let hb2 = hb.clone();
    eventually("b hosts shards", Duration::from_secs(30), move || hb2.hosted_shards().len() >= 8).await;
    all_homed(&ha).await;
    let on_b = hb.hosted_shards();
    let ids: Vec<String> =
        (0..).map(|i| format!("j{i}")).filter(|id| on_b.contains(&ha.shard_of(id))).take(8).collect();
    for id in &ids {
        ha.entity_ref(id).ask(Cmd::Get).await.unwrap();
    }
    // One sender per entity, all at once, so that the writer falls behind.
    let senders: Vec<_> = ids
        .iter()
        .map(|id| {
            let e = ha.entity_ref(id);
            tokio::spawn(async move {
                for v in 0..2_000u64 {
                    e.tell(Cmd::Append(v)).expect("buffered or sent, never refused here");
                }
            })
        })
        .collect();
    for s in senders {
        s.await.unwrap();
    }
    let want: Vec<u64> = (0..2_000).collect();
    for id in &ids {
        assert_eq!(ha.entity_ref(id).ask(Cmd::Get).await.unwrap(), want, "{id}");
    }
}

/// What a bare transport reads, for the tests that drive one directly.
struct Collect(tokio::sync::mpsc::UnboundedSender<(NodeId, String)>);

impl shardline::transport::Inbound<String> for Collect {
    fn on_frame(&self, from: &NodeId, msg: String) {
        let _ = self.0.send((from.clone(), msg));
    }
    fn on_link_down(&self, _peer: &NodeId) {}
    fn on_undeliverable(&self, _peer: &NodeId, _msg: String) {}
    fn on_unsendable(&self, _peer: &NodeId, _msg: String, _error: shardline::TransportError) {}
}

/// A peer that dials this node is answered at once, before membership has said where it
/// listens: the handshake tells. (An ask from a node that had only just joined used to lose its
/// reply, and its asker waited for the timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_dialed_is_answered_before_membership_names_it() {
    use shardline::transport::{Transport, TransportConfig};
    use std::sync::Arc;
    let (la, lb) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let (ida, idb) = (NodeId::new("a", 1), NodeId::new("b", 2));
    let a = Transport::<String>::new(ida.clone(), &la, TransportConfig::new("test")).unwrap();
    let b = Transport::<String>::new(idb.clone(), &lb, TransportConfig::new("test")).unwrap();
    let (txa, mut rxa) = tokio::sync::mpsc::unbounded_channel();
    let (txb, mut rxb) = tokio::sync::mpsc::unbounded_channel();
    a.start(la, Arc::new(Collect(txa)));
    b.start(lb, Arc::new(Collect(txb)));
    b.set_address(&ida, a.local_addr());
    assert!(!a.knows(&idb), "nobody told a where b listens");
    b.send(&ida, "ask".into()).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rxa.recv()).await.unwrap();
    assert_eq!(got, Some((idb.clone(), "ask".to_string())));
    a.send(&idb, "answer".into()).expect("a route to the peer that dialed");
    let got = tokio::time::timeout(Duration::from_secs(5), rxb.recv()).await.unwrap();
    assert_eq!(got, Some((ida, "answer".to_string())));
}
