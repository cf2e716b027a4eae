//! The attribute macros of Shardline, re-exported by it as [`shardline::messages`] and
//! [`shardline::commands`]: an entity's protocol written as methods, one per request, each with
//! its own reply type, instead of a message enum, a reply enum and a `match` by hand.
//!
//! [`shardline::messages`]: macro@messages
//! [`shardline::commands`]: macro@commands

mod expand;
mod handler;
mod kind;
mod self_type;

use proc_macro::TokenStream;

/// Writes an entity's `Message`, `Reply` and `handle` from its methods marked `#[message]`:
/// one request type per method, with its own reply type, as Orleans' typed grain methods give.
///
/// An entity still receives one message type and answers one reply type, because that is what
/// travels between nodes. On `impl Entity for T`, the attribute writes them from the marked
/// methods:
///
/// - a request type per method, named after it in CamelCase (`add_item` is `AddItem`), whose
///   public fields are the method's arguments (a method without arguments gives a unit struct),
///   with the method's doc comment, `Serialize`, `Deserialize`, `Debug` and `Clone`;
/// - `TMessage` and `TReply`, a variant per request in the order the methods are written: the
///   encoding numbers the variants, so a rolling update adds new requests last and reorders none;
/// - `impl Request<TMessage, TReply>` for each request type, so that `ask(AddItem { .. })`
///   answers what `add_item` returns;
/// - `handle`, which calls each method, and the methods themselves, moved to `impl T`.
///
/// A method may be `async` or not, takes `&self` or `&mut self`, owned arguments (they travel),
/// and, anywhere among them, `&EntityContext` or `&mut EntityContext` (not a field). The rest of
/// the impl (`new`, `started`, `reminded`, …) stays as written. What it writes is private to
/// the module, as any item: give the visibility a public entity type needs,
/// `#[shardline::messages(pub)]` (its fields get it too). Users need no dependency on serde for
/// it.
///
/// ```
/// use shardline::{Entity, EntityContext, EntityId};
///
/// struct Counter { n: i64 }
///
/// #[shardline::messages]
/// impl Entity for Counter {
///     fn new(_id: &EntityId) -> Self { Counter { n: 0 } }
///
///     /// Adds `by`; answers the new total.
///     #[message]
///     fn add(&mut self, by: i64) -> i64 { self.n += by; self.n }
///
///     /// Answers the total and the entity's id.
///     #[message]
///     async fn get(&self, ctx: &EntityContext) -> (String, i64) { (ctx.id().to_string(), self.n) }
///
///     #[message]
///     fn reset(&mut self) { self.n = 0 }
/// }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let cluster = shardline::Cluster::builder().build().await?;
/// let counters = cluster.register::<Counter>(shardline::EntitySettings::new("counter")).await?;
/// let c1 = counters.entity_ref("c-1");
/// let total: i64 = c1.ask(Add { by: 5 }).await?;
/// assert_eq!(total, 5);
/// assert_eq!(c1.ask(Get).await?, ("c-1".to_string(), 5));
/// c1.tell(Reset)?;
/// # cluster.leave().await?;
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
/// ```
///
/// `#[message(name = "GetStatus")]` names a request whose method's name would not do:
/// `fn status(&self) -> Status` would define a second `Status`, and two entities of one module
/// that both have a `get` would both define `Get`. A `#[cfg(…)]` on a method applies to all that
/// is written for it. `Self` and `Self::Reply` mean in a handler what they mean in the impl.
///
/// Misuse is a compile error that says what to change: a handler named like a method of
/// `Entity`, or whose request would shadow a type it uses or another request; one that takes a
/// reference other than the context, `impl Trait`, attributes on an argument, or no `&self`; a
/// generic, lifetime-bound or `unsafe` one; a `type Message`, `type Reply` or `handle` written by
/// hand beside the attribute; no `#[message]` at all.
///
/// Moving an entity from its hand-written message type to requests changes its encoding, as
/// any change of the enum would; within the requests, adding one last keeps the others'
/// encoding, while reordering them or changing a method's arguments does not (see the README on
/// rolling updates).
#[proc_macro_attribute]
pub fn messages(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(&kind::MESSAGES, attr.into(), item.into()).into()
}

/// Writes an event-sourced type's `Command`, `Reply` and `decide` from its methods marked
/// `#[command]`, as [`messages`](macro@messages) does for an entity: one request type per
/// command, answered with that command's reply.
///
/// On `impl EventSourced for T`, a command is a method that decides on `&self`, synchronously,
/// and returns what `decide` returns: `(Vec<Self::Event>, Reply)`, the events to persist and
/// the answer. The attribute writes `TCommand`, `TReply`, the request types and `decide`.
/// The rest stays as written: `type Event`, `EVENT_TYPE`, `empty`, `apply`, and
/// `decide_without_state` or `on_reminder` when the type has them (they name the commands as
/// `TCommand::AddItem(..)`). A decision that awaits, or needs the context, is `decide_with`,
/// written by hand with the enums.
///
/// ```
/// use std::collections::BTreeMap;
/// use serde::{Deserialize, Serialize};
/// use shardline::{EntityId, EventSourced};
///
/// #[derive(Default, Serialize, Deserialize)]
/// struct Cart { items: BTreeMap<String, u32> }
///
/// #[derive(Serialize, Deserialize)]
/// enum CartEvent { Added { item: String, qty: u32 } }
///
/// #[shardline::commands]
/// impl EventSourced for Cart {
///     type Event = CartEvent;
///     const EVENT_TYPE: &'static str = "cart";
///     fn empty(_id: &EntityId) -> Self { Cart::default() }
///     fn apply(&mut self, CartEvent::Added { item, qty }: &CartEvent) {
///         *self.items.entry(item.clone()).or_default() += qty;
///     }
///
///     /// Adds `qty` of `item`; answers how many the cart now has.
///     #[command]
///     fn add(&self, item: String, qty: u32) -> (Vec<Self::Event>, u32) {
///         let now = self.items.get(&item).copied().unwrap_or(0) + qty;
///         (vec![CartEvent::Added { item, qty }], now)
///     }
///
///     #[command]
///     fn items(&self) -> (Vec<CartEvent>, BTreeMap<String, u32>) {
///         (vec![], self.items.clone())
///     }
/// }
///
/// let cart = Cart::default();
/// let (events, now) = cart.decide(CartCommand::Add(Add { item: "pear".into(), qty: 2 }));
/// assert_eq!(events.len(), 1);
/// assert!(matches!(now, CartReply::Add(2)));
/// ```
///
/// On a node, `carts.ask("cart-1", Add { item: "pear".into(), qty: 2 })` answers the `u32`, as
/// do `ask_retrying` and `ask_with_request_id`.
#[proc_macro_attribute]
pub fn commands(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(&kind::COMMANDS, attr.into(), item.into()).into()
}
