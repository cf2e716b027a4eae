//! The user's side of a simulation: a sequential model of the entity type, and the clients that
//! ask its commands on the world's client node and record what they saw.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardline::entity::{EntitySettings, EventSourced, RetryPolicy};
use shardline::{Error, Processed};
use tokio::runtime::Runtime;
use tokio::time::Instant;

use super::linearizable::{Answer, Op};
use super::observed::WatchedHandle;
use super::rng::Rng;
use super::schedule::HEAL_AT;
use super::world::{Answered, Slot, Workload};

/// The command type of a model's entity.
pub type Command<M> = <<M as Model>::Entity as EventSourced>::Command;
/// The reply type of a model's entity.
pub type Reply<M> = <<M as Model>::Entity as EventSourced>::Reply;

/// What an entity type must do, said sequentially: the kit runs the real entity on a simulated
/// cluster under faults, and checks that every answer its clients got is one this model allows
/// in some order that respects real time (linearizability).
///
/// The kit registers this one type: an entity whose `decide_with` asks another type finds none
/// there (`ctx.entities()` answers `None`).
///
/// A model of a counter entity:
///
/// ```
/// use shardline::entity::{EntitySettings, EventSourced};
/// use shardline::EntityId;
/// use shardline_testkit::{Model, Rng};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize)] pub struct Counter { n: u64 }
/// # #[derive(Clone, Debug, Serialize, Deserialize)] pub enum Cmd { Add(u64), Get }
/// # impl EventSourced for Counter {
/// #     type Command = Cmd; type Event = u64; type Reply = u64;
/// #     const EVENT_TYPE: &'static str = "counter";
/// #     fn empty(_: &EntityId) -> Self { Counter { n: 0 } }
/// #     fn apply(&mut self, e: &u64) { self.n += e }
/// #     fn decide(&self, c: Cmd) -> (Vec<u64>, u64) {
/// #         match c { Cmd::Add(k) => (vec![k], self.n + k), Cmd::Get => (vec![], self.n) }
/// #     }
/// # }
///
/// struct CounterModel;
///
/// impl Model for CounterModel {
///     type Entity = Counter;
///     type State = u64;
///
///     fn settings(&self) -> EntitySettings {
///         EntitySettings::new("counter")
///     }
///     fn initial(&self) -> u64 {
///         0
///     }
///     fn command(&self, rng: &mut Rng) -> Cmd {
///         if rng.chance(70) { Cmd::Add(1 + rng.below(9)) } else { Cmd::Get }
///     }
///     fn read(&self) -> Cmd {
///         Cmd::Get
///     }
///     fn step(&self, total: &mut u64, command: &Cmd) -> u64 {
///         if let Cmd::Add(k) = command {
///             *total += k;
///         }
///         *total
///     }
/// }
/// ```
pub trait Model: Send + Sync + 'static {
    /// The entity type under test.
    type Entity: EventSourced<Command: Clone + Debug + Send + Sync, Reply: PartialEq + Debug>;
    /// What the model keeps of one entity.
    type State: Clone + Eq + Hash + Debug;

    /// The entity type's settings: its type name and whatever else it needs. The kit sets its
    /// shards and its journal.
    fn settings(&self) -> EntitySettings;

    /// The state of an entity that nothing has been asked yet.
    fn initial(&self) -> Self::State;

    /// A command for a client to ask, drawn from the schedule's generator.
    fn command(&self, rng: &mut Rng) -> Command<Self>;

    /// A command that changes nothing, asked of every entity once the faults have healed: its
    /// answer shows each entity's final state to the check.
    fn read(&self) -> Command<Self>;

    /// What `command` does to `state`, and the reply the entity must give.
    fn step(&self, state: &mut Self::State, command: &Command<Self>) -> Reply<Self>;
}

/// One operation of a model's entity, as its client saw it.
pub type ModelOp<M> = Op<Command<M>, Reply<M>>;

/// One operation a client asked, on which entity.
pub struct Asked<M: Model> {
    /// The entity's id.
    pub entity: String,
    /// The operation, in world milliseconds.
    pub op: ModelOp<M>,
}

/// A model's entities and clients on the world.
pub struct ModelWorkload<M: Model> {
    model: Arc<M>,
    entities: Vec<String>,
    clients: usize,
    /// Operations that ended, and those in flight by their invocation's tick.
    done: Arc<Mutex<Vec<Asked<M>>>>,
    in_flight: Arc<Mutex<BTreeMap<u64, Asked<M>>>>,
}

impl<M: Model> ModelWorkload<M> {
    /// `entities` entities (ids `e0`, `e1`, …) asked by `clients` clients (at least one of
    /// each).
    pub fn new(model: Arc<M>, entities: usize, clients: usize) -> Self {
        ModelWorkload {
            model,
            entities: (0..entities.max(1)).map(|i| format!("e{i}")).collect(),
            clients: clients.max(1),
            done: Arc::default(),
            in_flight: Arc::default(),
        }
    }

    /// What the clients saw, by entity: operations still in flight when the world stopped are
    /// of unknown outcome.
    pub fn history(&self) -> BTreeMap<String, Vec<ModelOp<M>>> {
        let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
        let done = std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()));
        let open = std::mem::take(&mut *self.in_flight.lock().unwrap_or_else(|e| e.into_inner()));
        for a in done.into_iter().chain(open.into_values()) {
            out.entry(a.entity).or_default().push(a.op);
        }
        out
    }
}

/// How the clients retry: as a user's service would, with one request id for every attempt.
const RETRIES: RetryPolicy = RetryPolicy {
    attempts: 4,
    timeout: Duration::from_secs(5),
    first_backoff: Duration::from_millis(200),
    max_backoff: Duration::from_secs(2),
};

impl<M: Model> Workload for ModelWorkload<M> {
    type Entity = M::Entity;

    fn settings(&self, shards: u32) -> EntitySettings {
        self.model.settings().shards(shards)
    }

    fn entities(&self) -> Vec<String> {
        self.entities.clone()
    }

    fn spawn_clients(&self, rt: &Runtime, node: Slot<M::Entity>, origin: Instant, seed: u64, answered: Answered) {
        let now_ms = move || (Instant::now() - origin).as_millis() as u64;
        let mut rng = Rng::new(seed ^ 0xC11E);
        // The order in which invocations and answers happened, all on the client node's thread:
        // the paused clock gives many of them one instant, and a tie would let a stale read
        // pass as concurrent with the write it missed.
        let tick = Arc::new(AtomicU64::new(1));
        for _ in 0..self.clients {
            let (model, entities, node, tick) = (self.model.clone(), self.entities.clone(), node.clone(), tick.clone());
            let (done, in_flight) = (self.done.clone(), self.in_flight.clone());
            let mut rng = Rng::new(rng.next());
            rt.spawn(async move {
                while now_ms() < HEAL_AT {
                    let handle = wait_for(&node).await;
                    let entity = entities[rng.below(entities.len() as u64) as usize].clone();
                    let command = model.command(&mut rng);
                    let invoke = tick.fetch_add(1, Ordering::Relaxed);
                    let op = Op { command: command.clone(), invoke, complete: u64::MAX, answer: Answer::Unknown };
                    in_flight
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(invoke, Asked { entity: entity.clone(), op });
                    let r = handle.ask_retrying(&entity, command.clone(), RETRIES).await;
                    in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&invoke);
                    let complete = tick.fetch_add(1, Ordering::Relaxed);
                    let op = Op { command, invoke, complete, answer: answer(r) };
                    done.lock().unwrap_or_else(|e| e.into_inner()).push(Asked { entity, op });
                    tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
                }
            });
        }
        let (model, entities, done) = (self.model.clone(), self.entities.clone(), self.done.clone());
        // From the heal: every entity is read until it answers, within the world's bound (a
        // client still retrying its last command may finish later; its answer is checked all
        // the same).
        rt.spawn(async move {
            while now_ms() < HEAL_AT {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            for entity in entities {
                loop {
                    let handle = wait_for(&node).await;
                    let invoke = tick.fetch_add(1, Ordering::Relaxed);
                    let r = handle.ask_retrying(&entity, model.read(), RETRIES).await;
                    let ok = r.is_ok();
                    let complete = tick.fetch_add(1, Ordering::Relaxed);
                    let op = Op { command: model.read(), invoke, complete, answer: answer(r) };
                    done.lock().unwrap_or_else(|e| e.into_inner()).push(Asked { entity: entity.clone(), op });
                    if ok {
                        answered.lock().unwrap_or_else(|e| e.into_inner()).insert(entity, now_ms());
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
    }
}

fn answer<R>(r: Result<R, Error>) -> Answer<R> {
    match r {
        Ok(reply) => Answer::Ok(reply),
        Err(e) if e.processed() == Processed::No => Answer::NotApplied,
        Err(_) => Answer::Unknown,
    }
}

/// The client node's current incarnation's handle (it rejoins when fenced).
async fn wait_for<E: EventSourced>(node: &Slot<E>) -> WatchedHandle<E> {
    loop {
        let n = node.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((_, handle)) = n {
            return handle;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
