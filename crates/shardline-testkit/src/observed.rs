//! What the world sees from inside the nodes: which instance of an entity decided each
//! command, on which host and when, the panics of the nodes' tasks, and the runtime's own watch
//! for a request applied behind an instance's back.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use metrics::{Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use serde::{Deserialize, Serialize};
use std::future::Future;

use shardline::entity::{EventSourced, EventSourcedHandle};
use shardline::{EntityContext, EntityId};

/// Takes the panics of this thread (a task of a node, whose runtime would swallow them): each one is a
/// violation of the schedule.
pub fn take_panics() -> Vec<String> {
    PANICS.with(|p| p.take())
}

/// Installs the hook that records panics per thread (once per process).
pub fn record_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let host = CURRENT.with(|c| c.borrow().clone());
            PANICS.with(|p| p.borrow_mut().push(format!("{host}: {info}")));
            default(info);
        }));
    });
}

thread_local! {
    /// The panics of this thread's runtimes.
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    /// The host whose runtime the world is running (entity code reads it).
    pub static CURRENT: RefCell<String> = const { RefCell::new(String::new()) };
    /// Every command an entity instance decided.
    pub static DECIDED: RefCell<Vec<Decided>> = const { RefCell::new(Vec::new()) };
    static NEXT_INSTANCE: Cell<u64> = const { Cell::new(1) };
    /// The world's time (ms), as entity code reads it.
    pub static NOW_MS: Cell<u64> = const { Cell::new(0) };
}

/// One command decided: by which instance of which entity, on which host, when (world ms).
#[derive(Clone, Debug)]
pub struct Decided {
    /// The entity's id.
    pub entity: String,
    /// The instance: a state made by `empty` or read from bytes is a new one.
    pub instance: u64,
    /// The host whose runtime ran it.
    pub host: String,
    /// The world's time.
    pub at_ms: u64,
}

fn fresh_instance() -> u64 {
    NEXT_INSTANCE.with(|n| {
        let i = n.get();
        n.set(i + 1);
        i
    })
}

/// The user's entity as the world runs it: the same state, events, commands and replies, and it
/// tells the world which instance decided each command (a state made by `empty` or read from
/// bytes, as a recovery or a hand-off does, is a new instance).
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound = "")]
pub struct Watched<E: EventSourced> {
    id: String,
    inner: E,
    #[serde(skip, default = "fresh_instance")]
    instance: u64,
}

impl<E: EventSourced> EventSourced for Watched<E> {
    type Command = E::Command;
    type Event = E::Event;
    type Reply = E::Reply;
    const EVENT_TYPE: &'static str = E::EVENT_TYPE;
    const SCHEMA_VERSION: u32 = E::SCHEMA_VERSION;

    fn empty(id: &EntityId) -> Self {
        Watched { id: id.as_str().to_string(), inner: E::empty(id), instance: fresh_instance() }
    }

    fn apply(&mut self, event: &Self::Event) {
        self.inner.apply(event);
    }

    fn decide(&self, command: Self::Command) -> (Vec<Self::Event>, Self::Reply) {
        self.decided();
        self.inner.decide(command)
    }

    /// Logged when the decision starts: an instance that starts deciding is live.
    fn decide_with(
        &self,
        ctx: &EntityContext,
        command: Self::Command,
    ) -> impl Future<Output = (Vec<Self::Event>, Self::Reply)> + Send {
        self.decided();
        self.inner.decide_with(ctx, command)
    }

    fn upcast(version: u32, payload: &[u8]) -> Result<Self::Event, String> {
        E::upcast(version, payload)
    }

    fn decide_without_state(command: &Self::Command) -> Option<(Vec<Self::Event>, Self::Reply)> {
        E::decide_without_state(command)
    }

    fn reminders(event: &Self::Event) -> Vec<shardline::entity::Remind> {
        E::reminders(event)
    }

    fn on_reminder(&self, reminder: &shardline::entity::Reminder) -> Option<Self::Command> {
        self.inner.on_reminder(reminder)
    }
}

impl<E: EventSourced> Watched<E> {
    fn decided(&self) {
        let d = Decided {
            entity: self.id.clone(),
            instance: self.instance,
            host: CURRENT.with(|c| c.borrow().clone()),
            at_ms: NOW_MS.with(Cell::get),
        };
        DECIDED.with(|log| log.borrow_mut().push(d));
    }
}

/// The handle of a watched entity type.
pub type WatchedHandle<E> = EventSourcedHandle<Watched<E>>;

/// The counter an entity raises when the journal refuses a request as applied already while
/// the instance held every reply the journal keeps (`shardline_entity_unknown_duplicates_total`):
/// its state was not the journal's, from a second instance or a recovery that raced an append.
/// The journal's refusal keeps that from applying anything twice, so check (b) cannot see it;
/// this counter can. Installed per schedule thread, as the nodes all run on it.
#[derive(Default)]
pub struct UnknownDuplicates(Arc<AtomicU64>);

const WATCHED: &str = "shardline_entity_unknown_duplicates_total";

impl UnknownDuplicates {
    /// A counter at 0.
    pub fn new() -> Self {
        UnknownDuplicates(Arc::default())
    }

    /// What the runtime counted.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

struct Count(Arc<AtomicU64>);

impl CounterFn for Count {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }

    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

impl Recorder for UnknownDuplicates {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        if key.name() == WATCHED {
            Counter::from_arc(Arc::new(Count(self.0.clone())))
        } else {
            Counter::noop()
        }
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
