//! A hosted shard's entities: which are state in memory, which run, when a running one goes
//! back to being state, and what a stopping shard hands its next owner.
//!
//! ```text
//!   deliver(id) ──────────────┐                    ┌──► Mailbox (put it in the running entity's)
//!   wake(id) ─────────────────┤                    ├──► Spawn (start a task, fresh or from state)
//!   marker taken (nudge, stop)┤                    ├──► Full / Stopping (answer: not processed)
//!   passivated(id) ───────────┼──►  HostEngine  ───┼──► Stay / Idle (the state back in the map)
//!   linger tick ──────────────┤   (residents,      ├──► Retire (stop hook, then hand over)
//!   passivate idle, stop ─────┤    epoch, handover)├──► Abort (fenced: no hook runs)
//!   kill, task failed ────────┘                    └──► handed-over state, encoded
//! ```
//!
//! The engine holds each entity as a resident: its state while it is idle, and while it runs the
//! driver's mailbox handle (`M`, opaque here, asked only how much room it has). A driver runs
//! one task per running entity; the task reports the markers it takes from its mailbox, and the
//! engine answers whether it stays, goes idle or stops. Every such decision is made under the
//! driver's one lock over the engine, where no message can arrive in between: that is what
//! keeps a message from landing in a mailbox nobody reads (I3, I4).

mod active_limit;
mod engine;
mod handover;

pub use active_limit::{ActiveLimit, PassivationPolicy};
pub use engine::{
    AfterMarker, Delivery, Evicted, HostConfig, HostEngine, Mailbox, Marker, Unleased, WakeDecision, LINGER_MS,
};
pub use handover::{decode_handover, encode_handover, HandedOver};
