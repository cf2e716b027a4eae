//! The two ways the runtime runs an engine of the core ([`shardline_core::Engine`]), each
//! written once: [`shared`] (behind a lock, fed by any task, one wake-up task) for the engines
//! every caller on a node feeds (regions, coordinators); [`owned`] (one task that owns the
//! engine and sleeps until its next deadline) for the membership engines, fed by their own
//! channels.

pub(crate) mod owned;
pub(crate) mod shared;
