//! Deliberately broken behaviours, switched on only by tests that prove a check catches them.
//!
//! A check that passes with its guard removed proves nothing. The runtime simulation runs whole
//! nodes with one of these switched on and must report a violation. They exist only with the
//! `sabotage` feature, are off unless a test turns one on, and hold for the thread that turned
//! it on: the simulation runs every node of a schedule on one thread.

#[cfg(feature = "sabotage")]
use std::cell::Cell;

/// A guard the runtime skips.
#[cfg_attr(not(feature = "sabotage"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// Nothing is broken.
    None,
    /// Messages are processed whether or not the node's hosting lease is valid, and a message
    /// that arrives after the lease ran out does not fence the node (its membership still does,
    /// when its own timer fires).
    IgnoreLease,
    /// An event-sourced entity neither looks a request id up nor hands it to its journal, so a
    /// retry is applied again.
    SkipRequestIdLookup,
    /// An event-sourced entity answers as if its append had committed, whatever the journal
    /// said.
    AckBeforeCommit,
    /// An event-sourced entity does not look in the replies it holds, as an instance whose
    /// state is not the journal's would not know them (a second instance, a recovery that raced
    /// an append). The journal refuses the retry, so nothing is applied twice; the entity's watch
    /// for a request applied behind its back must count it.
    ForgetReplies,
}

#[cfg(feature = "sabotage")]
thread_local! {
    static ON: Cell<Sabotage> = const { Cell::new(Sabotage::None) };
}

/// Breaks the runtime of this thread this way, until set to [`Sabotage::None`].
#[cfg(feature = "sabotage")]
pub fn set(s: Sabotage) {
    ON.with(|on| on.set(s));
}

/// Whether the runtime of this thread is broken this way.
#[cfg(feature = "sabotage")]
pub(crate) fn is(s: Sabotage) -> bool {
    ON.with(|on| on.get() == s)
}

/// Never, without the feature: no check costs anything.
#[cfg(not(feature = "sabotage"))]
#[inline(always)]
pub(crate) fn is(_: Sabotage) -> bool {
    false
}
