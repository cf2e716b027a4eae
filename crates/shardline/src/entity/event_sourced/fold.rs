//! [`EventSourced`]: what a user implements for state that is the fold of its events.

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;
use shardline_core::EntityId;

use super::decode_old;
use super::reminders::Remind;
use crate::entity::EntityContext;

/// State that is the fold of its events. See the [module docs](super).
pub trait EventSourced: Serialize + DeserializeOwned + Sized + Send + 'static {
    /// What it is asked to do.
    type Command: Serialize + DeserializeOwned + Send + 'static;
    /// What it persists.
    type Event: Serialize + DeserializeOwned + Send + 'static;
    /// What it answers.
    type Reply: Serialize + DeserializeOwned + Send + 'static;

    /// The type name stored with every event; a reader refuses events of another name.
    const EVENT_TYPE: &'static str;
    /// The schema version stored with every event and snapshot; a reader refuses newer ones,
    /// reads older events through [`upcast`](Self::upcast), and skips an older snapshot (it
    /// replays the events instead, which the journal keeps).
    const SCHEMA_VERSION: u32 = 1;

    /// The state before any event.
    fn empty(id: &EntityId) -> Self;

    /// Folds one event into the state.
    fn apply(&mut self, event: &Self::Event);

    /// Decides what a command does: the events to persist (none for a read) and the reply, which
    /// the caller gets only once the events are durable.
    fn decide(&self, command: Self::Command) -> (Vec<Self::Event>, Self::Reply);

    /// Decides with what the entity's node offers: its id and shard (`ctx.id()`), the other
    /// entity types (`ctx.entities()`, to ask another entity before deciding), and anything it
    /// awaits (a lookup in a service). The default calls [`decide`](Self::decide); implement
    /// one or the other. While it awaits, the entity takes no other command, so the decision is
    /// made on the state it started from. It must not ask its own entity: that ask would wait
    /// behind this one until it times out. Awaiting with `&self` held needs the state to be
    /// `Sync`.
    ///
    /// A decision can be made more than once for one request: a retry of a command whose append
    /// failed or whose outcome was unknown (a lost connection, a crash, a moved shard) is
    /// decided again, and a decision that writes no event is recorded only under a caller's
    /// request id. So an ask made here is at least once unless it is idempotent: ask an
    /// event-sourced entity with `ask_with_request_id` under an id derived from the command's own,
    /// `ctx.request_id()` (present for every command but a read sent without a caller's id), as
    /// `rid.derive("reserve")`; a decision run again then gets its first answer, and the ask is
    /// applied once. And a reply is recorded
    /// under the caller's request id like any other, a failure of the inner ask included: a
    /// retry with that id gets the same failure until the id expires, so a caller that should
    /// try again gets a reply that says so and sends a new id.
    ///
    /// ```
    /// # use serde::{Deserialize, Serialize};
    /// # use shardline::{EntityContext, EntityId, EventSourced};
    /// # #[derive(Serialize, Deserialize)] struct Catalog;
    /// # impl EventSourced for Catalog {
    /// #     type Command = (); type Event = (); type Reply = u64; const EVENT_TYPE: &'static str = "catalog";
    /// #     fn empty(_: &EntityId) -> Self { Catalog }
    /// #     fn apply(&mut self, _: &()) {}
    /// #     fn decide(&self, _: ()) -> (Vec<()>, u64) { (vec![], 7) }
    /// # }
    /// #[derive(Serialize, Deserialize)]
    /// struct Order { total: u64 }
    ///
    /// impl EventSourced for Order {
    ///     type Command = String; // an item to add, priced by the catalog
    ///     type Event = u64;
    ///     type Reply = Result<u64, String>;
    ///     const EVENT_TYPE: &'static str = "order";
    ///
    ///     fn empty(_: &EntityId) -> Self { Order { total: 0 } }
    ///     fn apply(&mut self, price: &u64) { self.total += price }
    ///     fn decide(&self, _: String) -> (Vec<u64>, Self::Reply) { (vec![], Err("decided with its context".into())) }
    ///
    ///     async fn decide_with(&self, ctx: &EntityContext, item: String) -> (Vec<u64>, Self::Reply) {
    ///         let Some(catalog) = ctx.entities().event_sourced::<Catalog>() else {
    ///             return (vec![], Err("no catalog on this node".into()));
    ///         };
    ///         match catalog.ask(&item, ()).await {
    ///             Ok(price) => (vec![price], Ok(self.total + price)),
    ///             Err(e) => (vec![], Err(e.to_string())),
    ///         }
    ///     }
    /// }
    /// ```
    fn decide_with(
        &self,
        ctx: &EntityContext,
        command: Self::Command,
    ) -> impl Future<Output = (Vec<Self::Event>, Self::Reply)> + Send {
        let _ = ctx;
        std::future::ready(self.decide(command))
    }

    /// Reads an event that version `version` (older than [`SCHEMA_VERSION`](Self::SCHEMA_VERSION))
    /// of this type stored: an upcaster, as Akka's event adapters. The default reads it as the
    /// current event type, which holds while every change kept the encoding; see
    /// [`decode_old`] for what does not, and an example.
    fn upcast(version: u32, payload: &[u8]) -> Result<Self::Event, String> {
        let _ = version;
        decode_old(payload)
    }

    /// The events and reply of a command that needs no state (a fact to log, a value to set),
    /// or None (the default) when it does. Such a command sent to an entity that has not been
    /// recovered yet is appended without reading its history; once recovered, every command goes
    /// through [`decide_with`](Self::decide_with) ([`decide`](Self::decide) by default), which
    /// must agree.
    fn decide_without_state(command: &Self::Command) -> Option<(Vec<Self::Event>, Self::Reply)> {
        let _ = command;
        None
    }

    /// The durable reminders an event sets or cancels, stored in the transaction that stores
    /// the event (so a command's reminder exists exactly when its events do). Called once, when
    /// the event is decided, not on replay. Needs [`EntitySettings::reminders`](crate::EntitySettings::reminders).
    fn reminders(event: &Self::Event) -> Vec<Remind> {
        let _ = event;
        Vec::new()
    }

    /// The command a due reminder runs, or None to do nothing. It runs with the firing's id as
    /// its request id ([`Reminder::firing_id`](crate::entity::Reminder::firing_id)), so a firing
    /// delivered again (after a crash, a move) is applied once.
    fn on_reminder(&self, reminder: &crate::entity::Reminder) -> Option<Self::Command> {
        let _ = reminder;
        None
    }
}
