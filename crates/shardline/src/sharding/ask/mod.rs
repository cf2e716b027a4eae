//! The bookkeeping of asks: replies awaited from other nodes ([`pending`]), the deadlines of
//! the asks waiting on this node ([`deadlines`]), and the counts and latencies the metrics show
//! ([`stats`]).

pub(crate) mod deadlines;
pub(crate) mod pending;
pub(crate) mod stats;
