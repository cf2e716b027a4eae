//! Event schema evolution: reading events that an older version of an event type stored.

use serde::de::DeserializeOwned;

/// Decodes `payload` as `E` (postcard, as Shardline stores events): for an
/// [`upcast`](super::EventSourced::upcast) that reads an older event type.
///
/// Events are stored with postcard, which keeps no field names and stores variants by their
/// index: adding a variant at the end keeps old events readable as they are, but reordering
/// variants or changing a field does not. Then raise `SCHEMA_VERSION`, keep the old event type,
/// and decode into it here:
///
/// ```
/// # use serde::{Deserialize, Serialize};
/// # use shardline::{entity::decode_old, EntityId, EventSourced};
/// #[derive(Deserialize)]
/// enum AddedV1 { Added(u64) }
///
/// #[derive(Serialize, Deserialize)]
/// enum Event { Added { amount: u64, note: String } }
///
/// # #[derive(Default, Serialize, Deserialize)] struct Tally(u64);
/// impl EventSourced for Tally {
/// #   type Command = u64; type Event = Event; type Reply = u64;
/// #   const EVENT_TYPE: &'static str = "tally";
/// #   fn empty(_: &EntityId) -> Self { Tally(0) }
/// #   fn apply(&mut self, Event::Added { amount, .. }: &Event) { self.0 += amount; }
/// #   fn decide(&self, k: u64) -> (Vec<Event>, u64) { (vec![Event::Added { amount: k, note: String::new() }], self.0 + k) }
///     const SCHEMA_VERSION: u32 = 2;
///     fn upcast(version: u32, payload: &[u8]) -> Result<Event, String> {
///         match version {
///             1 => decode_old(payload).map(|AddedV1::Added(amount)| Event::Added { amount, note: String::new() }),
///             v => Err(format!("no upcaster from version {v}")),
///         }
///     }
/// }
/// ```
pub fn decode_old<E: DeserializeOwned>(payload: &[u8]) -> Result<E, String> {
    postcard::from_bytes(payload).map_err(|e| e.to_string())
}
