//! `HostEngine`: one test per handler, each asserting what it decides.

use std::cell::Cell;
use std::rc::Rc;

use shardline_core::host::{
    decode_handover, AfterMarker, Delivery, HostConfig, HostEngine, Mailbox, Marker, WakeDecision,
};
use shardline_core::{EntityId, Epoch};

/// A mailbox whose free places a test sets; `puts` counts what went in.
#[derive(Clone, Debug, Default)]
struct TestBox {
    free: Rc<Cell<usize>>,
    puts: Rc<Cell<usize>>,
    name: &'static str,
}

impl Mailbox for TestBox {
    fn free(&self) -> usize {
        self.free.get()
    }
}

/// Mailboxes hold 4 messages, plus the marker's place.
const SIZE: usize = 4;

fn engine() -> HostEngine<String, TestBox> {
    HostEngine::new(HostConfig::new(SIZE), epoch(1))
}

fn epoch(n: u64) -> Epoch {
    Epoch { term: 1, seq: n }
}

fn id(s: &str) -> EntityId {
    EntityId::new(s)
}

fn empty_box(name: &'static str) -> TestBox {
    TestBox { free: Rc::new(Cell::new(SIZE + 1)), puts: Rc::default(), name }
}

/// Delivers `msg` to `who`; a spawn gets `fresh` as its mailbox. Returns a summary of the decision.
fn deliver(e: &mut HostEngine<String, TestBox>, who: &str, fresh: &TestBox) -> String {
    let d = e.deliver(
        &id(who),
        "msg",
        |m, _msg| {
            m.puts.set(m.puts.get() + 1);
            m.name
        },
        || fresh.clone(),
    );
    match d {
        Delivery::Put(name) => format!("put in {name}"),
        Delivery::Spawn { state, mailbox, first } => format!("spawn {state:?} with {} first {first}", mailbox.name),
        Delivery::Full(m) => format!("full {m}"),
        Delivery::Stopping(m) => format!("stopping {m}"),
    }
}

/// Runs `who` to idle with `state`: spawned, then its mailbox empties at a stop-less retire.
fn make_idle(e: &mut HostEngine<String, TestBox>, who: &str, state: &str, now_ms: u64) {
    deliver(e, who, &empty_box("b"));
    let after = e.marker(&id(who), Marker::Retire, false, state.to_string(), now_ms);
    assert_eq!(after, AfterMarker::Idle);
}

#[test]
fn deliver_spawns_a_new_instance_then_puts_in_its_mailbox() {
    let mut e = engine();
    assert_eq!(deliver(&mut e, "a", &empty_box("a1")), "spawn None with a1 first msg");
    assert_eq!((e.len(), e.active_len()), (1, 1));
    // Running: the message goes to its mailbox, never to a second instance.
    assert_eq!(deliver(&mut e, "a", &empty_box("a2")), "put in a1");
    assert_eq!(e.active_len(), 1);
}

#[test]
fn deliver_spawns_an_idle_entity_with_its_state() {
    let mut e = engine();
    make_idle(&mut e, "a", "counted 3", 0);
    assert_eq!((e.len(), e.active_len()), (1, 0));
    assert_eq!(deliver(&mut e, "a", &empty_box("a2")), "spawn Some(\"counted 3\") with a2 first msg");
    assert_eq!(e.active_len(), 1);
}

#[test]
fn deliver_keeps_the_last_place_for_the_linger_marker() {
    let mut e = engine();
    let b = empty_box("a");
    deliver(&mut e, "a", &b);
    b.free.set(2);
    assert_eq!(deliver(&mut e, "a", &b), "put in a");
    // One place left, and no marker in: it is the marker's.
    b.free.set(1);
    assert_eq!(deliver(&mut e, "a", &b), "full msg");
    // Once the marker is in, the last place is a message's.
    b.free.set(SIZE + 1);
    e.nudge(|_| true);
    b.free.set(1);
    assert_eq!(deliver(&mut e, "a", &b), "put in a");
}

#[test]
fn deliver_gives_the_message_back_once_the_shard_stops() {
    let mut e = engine();
    e.stop(|_| ());
    assert_eq!(deliver(&mut e, "a", &empty_box("a")), "stopping msg");
    assert!(e.is_empty(), "a stopping shard starts nothing");
}

#[test]
fn wake_starts_only_what_is_not_in_memory() {
    let mut e = engine();
    assert_eq!(e.wake(&id("a")), WakeDecision::Deliver);
    make_idle(&mut e, "a", "s", 0);
    assert_eq!(e.wake(&id("a")), WakeDecision::Present);
    e.stop(|_| ());
    assert_eq!(e.wake(&id("b")), WakeDecision::Stopping);
}

#[test]
fn nudge_marks_only_empty_mailboxes_without_a_marker() {
    let mut e = engine();
    let (a, b) = (empty_box("a"), empty_box("b"));
    deliver(&mut e, "a", &a);
    deliver(&mut e, "b", &b);
    // b has a message waiting: no marker behind it.
    b.free.set(SIZE);
    assert_eq!(sweep(&mut e, true), ["a"]);
    // a has its marker: none more until it is taken.
    assert!(sweep(&mut e, true).is_empty());
    e.nudge_taken(&id("a"));
    assert_eq!(sweep(&mut e, false), ["a"]);
    // The put failed: the marker is not in, so the next sweep tries again.
    assert_eq!(sweep(&mut e, true), ["a"]);
}

/// One linger sweep whose puts answer `goes_in`: the mailboxes offered a marker.
fn sweep(e: &mut HostEngine<String, TestBox>, goes_in: bool) -> Vec<&'static str> {
    let mut offered = Vec::new();
    e.nudge(|m| {
        offered.push(m.name);
        goes_in
    });
    offered
}

#[test]
fn marker_keeps_a_busy_entity_and_idles_a_quiet_one() {
    let mut e = engine();
    deliver(&mut e, "a", &empty_box("a"));
    // A message came since the last nudge: stay for the next one.
    assert_eq!(e.marker(&id("a"), Marker::Nudge { busy: true }, false, "s".into(), 0), AfterMarker::Stay("s".into()));
    // A message waits behind the marker: stay and handle it.
    assert_eq!(e.marker(&id("a"), Marker::Nudge { busy: false }, true, "s".into(), 0), AfterMarker::Stay("s".into()));
    assert_eq!(e.marker(&id("a"), Marker::Retire, true, "s".into(), 0), AfterMarker::Stay("s".into()));
    // Quiet and empty: the state goes back to the map.
    assert_eq!(e.marker(&id("a"), Marker::Nudge { busy: false }, false, "s".into(), 0), AfterMarker::Idle);
    assert_eq!((e.len(), e.active_len()), (1, 0));
}

#[test]
fn marker_retires_the_entity_of_a_stopping_shard() {
    let mut e = engine();
    deliver(&mut e, "a", &empty_box("a"));
    let (markers, idle) = e.stop(|m| m.name);
    assert_eq!((markers, idle.len()), (vec!["a"], 0));
    // Busy or not, a stopping shard's entity does not wait for another nudge.
    assert_eq!(e.marker(&id("a"), Marker::Nudge { busy: true }, false, "s".into(), 0), AfterMarker::Retire("s".into()));
    assert!(e.is_empty(), "its slot is gone");
}

#[test]
fn a_taken_nudge_lets_the_next_one_in() {
    let mut e = engine();
    let a = empty_box("a");
    deliver(&mut e, "a", &a);
    e.nudge(|_| true);
    // The marker is in: the last place is a message's now.
    a.free.set(1);
    assert_eq!(deliver(&mut e, "a", &a), "put in a");
    e.nudge_taken(&id("a"));
    assert_eq!(deliver(&mut e, "a", &a), "full msg");
}

#[test]
fn passivated_restarts_only_for_a_waiting_message() {
    let mut e = engine();
    deliver(&mut e, "a", &empty_box("a"));
    assert!(e.passivated(&id("a"), true), "a message waits: a fresh instance handles it");
    assert_eq!(e.active_len(), 1);
    assert!(!e.passivated(&id("a"), false));
    assert!(e.is_empty(), "passivated and nothing waits: gone");
    assert_eq!(deliver(&mut e, "a", &empty_box("a2")), "spawn None with a2 first msg");
}

#[test]
fn task_failed_forgets_the_slot() {
    let mut e = engine();
    deliver(&mut e, "a", &empty_box("a1"));
    e.task_failed(&id("a"));
    assert!(e.is_empty());
    assert_eq!(deliver(&mut e, "a", &empty_box("a2")), "spawn None with a2 first msg", "a fresh instance");
}

#[test]
fn passivate_idle_takes_only_entities_idle_long_enough() {
    let mut e = engine();
    make_idle(&mut e, "old", "o", 1_000);
    make_idle(&mut e, "new", "n", 9_000);
    deliver(&mut e, "running", &empty_box("r"));
    let gone = e.passivate_idle(10_000, 5_000);
    assert_eq!(gone, vec![(id("old"), "o".to_string())]);
    assert_eq!((e.len(), e.active_len()), (2, 1));
}

#[test]
fn stop_retires_running_entities_and_returns_idle_ones() {
    let mut e = engine();
    make_idle(&mut e, "idle", "i", 0);
    deliver(&mut e, "running", &empty_box("r"));
    let (markers, idle) = e.stop(|m| m.name);
    assert_eq!(markers, ["r"]);
    assert_eq!(idle, vec![(id("idle"), "i".to_string())]);
    assert!(e.is_stopping());
    // The running one stops at its marker and hands its state over with the idle one's.
    assert_eq!(e.marker(&id("running"), Marker::Retire, false, "r".into(), 0), AfterMarker::Retire("r".into()));
    e.handed(&id("idle"), Some(b"i".to_vec()));
    e.handed(&id("running"), None);
    let handed = e.take_handover().expect("something was handed over");
    assert_eq!(decode_handover(&handed).unwrap(), vec![("idle".to_string(), b"i".to_vec())]);
    assert_eq!(e.take_handover(), None, "handed over once");
}

#[test]
fn kill_drops_every_slot_and_returns_the_running_ones_to_abort() {
    let mut e = engine();
    make_idle(&mut e, "idle", "i", 0);
    deliver(&mut e, "running", &empty_box("r"));
    let aborted: Vec<&str> = e.kill().iter().map(|m| m.name).collect();
    assert_eq!(aborted, ["r"]);
    assert!(e.is_empty() && e.is_stopping());
    assert_eq!(e.take_handover(), None, "a killed shard hands nothing over");
}

#[test]
fn restore_puts_handed_over_entities_in_the_map_idle() {
    let mut e = engine();
    let bytes = shardline_core::host::encode_handover(&[("a".into(), b"state".to_vec())]).unwrap();
    for (who, state) in decode_handover(&bytes).unwrap() {
        e.restore(id(&who), String::from_utf8(state).unwrap(), 0);
    }
    assert_eq!((e.len(), e.active_len()), (1, 0));
    assert_eq!(deliver(&mut e, "a", &empty_box("a")), "spawn Some(\"state\") with a first msg");
    assert!(decode_handover(&[0xff]).is_err(), "garbage is an error, not nothing");
}

#[test]
fn raise_epoch_never_lowers() {
    let mut e = engine();
    assert!(e.raise_epoch(epoch(3)));
    assert!(!e.raise_epoch(epoch(2)));
    assert!(!e.raise_epoch(epoch(3)));
    assert_eq!(e.epoch(), epoch(3));
}

#[test]
fn lingers_up_to_the_limit() {
    let c = HostConfig::new(SIZE);
    assert!(c.lingers(c.max_lingering));
    assert!(!c.lingers(c.max_lingering + 1));
}
