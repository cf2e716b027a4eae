//! Gossip membership decided in the core: [`GossipEngine`] runs SWIM (the `foca` crate:
//! runtime- and transport-agnostic, timers as durations, randomness supplied) with time as an
//! argument, and turns it into a [`MembershipView`](crate::MembershipView).
//!
//! - **Who is alive** is SWIM's: members probe each other; a member that does not answer, even
//!   through others, is suspected (unreachable in the view) and, unless it refutes in time,
//!   declared down. A node declared down learns it and must come back as a new incarnation.
//! - **What each member does** (its status, the term it leads in) travels as status broadcasts:
//!   each member numbers its own, a newer one replaces an older one, and each member repeats its
//!   own now and then so that members who joined since learn it. A member whose status is not
//!   known yet is `Joining`.
//! - **Joining** goes through seeds, known by address only: they are kept as down placeholders,
//!   which foca announces to periodically until the real member at that address answers. The
//!   same announces let the sides of a healed partition find each other again.
//! - **The leader** is the oldest `Up` reachable member (proxies excluded); it takes a term above
//!   every term it has heard of and announces it in its status. A view names a leader only once
//!   its term is known. Only a formed cluster has one: the first seed forms it when its grace is
//!   over, and a member is part of it once it hears of a leader's term or of a formed member.
//!
//! - **Terms cannot collide**: a term is a counter above every term heard in its high half and a
//!   tag drawn once per engine in its low half. Two members that each believe they are first in
//!   line at once (a survivor suspecting an older member after a crash, a paused member declared
//!   down while it slept, the two sides of a partition) take different terms; with a plain
//!   "largest heard + 1", which seed membership uses, they took the same one (the simulation found
//!   it in about 3 % of its schedules; seed membership now takes its terms with [`term_above`]
//!   too). They collide only if their tags do (one in 2³²).
//!
//! - **Partitions** are resolved by [`GossipConfig::split_brain`] (`KeepMajority` by default):
//!   once the set of unreachable members has stayed the same for `stable_after`, the policy
//!   decides; the surviving side downs the others, a member of the losing side downs itself. A
//!   downed member is shown unreachable, not down, for a margin, so that its side has stopped
//!   before anyone takes its shards over.
//! - **A crash is not a partition**: a member that does not answer has its address checked,
//!   and a host that refuses the connection (or another node answering there) proves the
//!   process gone. It is downed at once and needs no margin ([`AddressAnswer`]), so a crashed
//!   process is replaced in seconds while a silent one waits for the resolver.
//!
//! The runtime's `membership::Gossip` provider carries out its commands over the node's transport.

mod engine;
mod identity;
mod rng;
mod split_brain_resolver;
mod status;

pub use engine::{term_above, AddressAnswer, GossipCommand, GossipConfig, GossipEngine, GossipEvent, GossipView};
pub use identity::GossipId;
pub use status::StatusError;
