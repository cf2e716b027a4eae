//! What the world sees from inside the nodes: which instance of an account decided each
//! command, on which host and when, the panics of the nodes' tasks, and the runtime's own watch
//! for a request applied behind an instance's back.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use metrics::{Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use serde::{Deserialize, Serialize};
use shardline::entity::{EventSourced, EventSourcedHandle};
use shardline::EntityId;
use shardline_cli::account::{AccountCmd, AccountReply};
use shardline_cli::Account;

/// Panics of this thread (a task of a node, whose runtime would swallow them): each one is a
/// violation of the schedule.
pub fn take_panics() -> Vec<String> {
    PANICS.with(|p| p.take())
}

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
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    /// The host whose runtime the world is running (entity code reads it).
    pub static CURRENT: RefCell<String> = const { RefCell::new(String::new()) };
    /// Every command an account instance decided: (account, instance, host, world ms).
    pub static DECIDED: RefCell<Vec<Decided>> = const { RefCell::new(Vec::new()) };
    static NEXT_INSTANCE: Cell<u64> = const { Cell::new(1) };
    pub static NOW_MS: Cell<u64> = const { Cell::new(0) };
}

#[derive(Clone, Debug)]
pub struct Decided {
    pub account: String,
    pub instance: u64,
    pub host: String,
    pub at_ms: u64,
}

fn fresh_instance() -> u64 {
    NEXT_INSTANCE.with(|n| {
        let i = n.get();
        n.set(i + 1);
        i
    })
}

/// The demo's account, which also tells the world which instance decided each command: a
/// state made by `empty` or read from bytes (a recovery, a hand-off) is a new instance.
#[derive(Debug, Serialize, Deserialize)]
pub struct SimAccount {
    id: String,
    account: Account,
    #[serde(skip, default = "fresh_instance")]
    instance: u64,
}

impl EventSourced for SimAccount {
    type Command = AccountCmd;
    type Event = <Account as EventSourced>::Event;
    type Reply = AccountReply;
    const EVENT_TYPE: &'static str = Account::EVENT_TYPE;

    fn empty(id: &EntityId) -> Self {
        SimAccount { id: id.as_str().to_string(), account: Account::empty(id), instance: fresh_instance() }
    }

    fn apply(&mut self, event: &Self::Event) {
        self.account.apply(event);
    }

    fn decide(&self, command: AccountCmd) -> (Vec<Self::Event>, AccountReply) {
        let d = Decided {
            account: self.id.clone(),
            instance: self.instance,
            host: CURRENT.with(|c| c.borrow().clone()),
            at_ms: NOW_MS.with(Cell::get),
        };
        DECIDED.with(|log| log.borrow_mut().push(d));
        self.account.decide(command)
    }
}

pub type SimAccounts = EventSourcedHandle<SimAccount>;

/// The counter an entity raises when the journal refuses a request as applied already while
/// the instance held every reply the journal keeps (`shardline_entity_unknown_duplicates_total`):
/// its state was not the journal's, from a second instance or a recovery that raced an append.
/// The journal's refusal keeps that from applying anything twice, so check (b) cannot see it;
/// this counter can. Installed per schedule thread, as the nodes all run on it.
pub struct UnknownDuplicates(Arc<AtomicU64>);

const WATCHED: &str = "shardline_entity_unknown_duplicates_total";

impl UnknownDuplicates {
    pub fn new() -> Self {
        UnknownDuplicates(Arc::default())
    }

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
