//! Lease membership decided in the core: [`LeaseEngine`] keeps this node's member key alive in a
//! coordination store (etcd, NATS KV), fences the node before its lease can lapse, elects a
//! leader with terms that never repeat, and turns the store's member keys into a
//! [`MembershipView`](crate::MembershipView).
//!
//! Why here and not in the runtime: every one of these is a decision whose mistakes are two
//! owners of a shard or a cluster without a leader, and the mistakes hide in timing (a store that
//! answers late, answers one renewal and not the next, or a process paused past its lease). As a
//! state machine with time as an argument, the simulation can run thousands of such schedules
//! against the real engine (`tests/sim_lease`). The runtime only carries out its commands:
//! [`StoreOp`]s against the store, the hosting lease, and the views it publishes.
//!
//! The engine runs one store operation at a time, in rounds:
//! - **renew** every TTL/3: the member key (created, then refreshed by revision), then the
//!   leadership (renewed by the leader, claimed by an eligible member when nobody holds it: a new
//!   term from the durable counter by compare-and-set first, then the ephemeral leader key);
//! - **observe** often (TTL/25, at least 50 ms): the member keys; a key newly missing from a
//!   listing is confirmed with a read before the member counts as gone (a listing can miss a key
//!   being rewritten); followers then read who leads.
//!
//! With [`PeerChecks`], members also send each other keep-alives: a member not heard from is
//! unreachable (in the view, so that no rebalance starts), and once the unreachable members
//! stay the same for a while the members race for a split-brain key; the winner's side downs
//! the rest (see `split_brain.rs`). Without them, a member cut from its peers but not from the
//! store would keep its shards, unreachable, for as long as the cut lasts.
//!
//! Deadlines bound every operation: a member-key write still unanswered at the fencing deadline
//! (last renewal's start + TTL − safety margin) fences the node, a leader-key renewal unanswered at
//! the leadership deadline gives leadership up, and a read unanswered when the next renewal is due
//! (before the node holds a key, after a sixth of the TTL) is abandoned. A late answer is ignored,
//! but a claim of the leader key whose answer never came is found by the next read of the key:
//! it leads from the claim's start, as if the answer had come.

mod command;
mod engine;
mod records;
mod split_brain;
mod steps;

pub use command::{LeaseCommand, LeaseEvent, LeaseView, StoreAnswer, StoreOp};
pub use engine::{LeaseConfig, LeaseConfigError, LeaseEngine, LeaseKeys, PeerChecks};
pub use records::{LeaderRecord, MemberRecord, Revision, SplitBrainRecord, StoreValue, StoredEntry, ValueKind};
