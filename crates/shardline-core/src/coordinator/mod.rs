//! The coordinator: owns the shard map of one entity type, runs the allocation strategy and
//! drives hand-offs. It runs on the leader; a new leader starts a new coordinator with a larger
//! term, which rebuilds the map from the regions' reports (and a stored map, where the
//! membership provider has a store).
//!
//! ```text
//!   membership view ──┐                         ┌──► SendShardHome / AnnounceShardHomes
//!   region messages ──┤                         ├──► SendBeginHandOff / SendHandOff
//!   node fenced ──────┼──► CoordinatorEngine ───┼──► RequestRegistration / SendWelcome
//!   map loaded/stored ┤    (map, hand-offs,     ├──► LoadShardMap / PersistShardMap
//!   assignments ──────┤     recovery)           └──► Emit(DomainEvent)
//!   timer (now) ──────┘
//! ```
//!
//! Calling contract, as in `quinn-proto`: feed inputs with the `handle_*` methods (each takes
//! `now` in milliseconds), then drain [`poll_command`](crate::Engine::poll_command) and sleep until
//! [`poll_timeout`](crate::Engine::poll_timeout), then call [`handle_timeout`](crate::Engine::handle_timeout).
//!
//! # Hand-off (planned move of shard S from A to B)
//! 1. `SendBeginHandOff` to every registered region; they buffer S and drain what they already
//!    sent to A, then acknowledge. If not all acknowledge within the hand-off timeout, the
//!    hand-off is abandoned and the current home re-announced (A never stopped: safe).
//! 2. `SendHandOff` to A; A lets messages in progress finish, stops S's entities and answers
//!    `ShardStopped`. `HandOff` is re-sent until it does.
//! 3. S → (B, new epoch): `PersistShardMap`, `AnnounceShardHomes` to every region.
//! 4. If A never answers, S moves only once A is fenced (down, lease expired), never earlier.

mod allocate;
mod assignments;
mod command;
mod engine;
mod hand_off;
mod held_view;
mod map_store;

pub use assignments::AssignError;
pub use command::CoordinatorCommand;
pub use engine::{CoordinatorConfig, CoordinatorEngine};
pub use map_store::{MapLoadError, MapWriteError, STORE_RETRY_MS};
