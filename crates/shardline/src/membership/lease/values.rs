//! The lease engine's values as the coordination store keeps them: each record in the versioned
//! layout of [`format`](crate::format), so that two Shardline versions share one store during a
//! rolling update.

use serde::{Deserialize, Serialize};
use shardline_core::lease::{LeaderRecord, MemberRecord, SplitBrainRecord, StoreValue, StoredEntry, ValueKind};
use shardline_core::{NodeId, Term};
use tracing::warn;

use super::store::Entry;
use crate::format::{self, Stored};

/// A value of the coordination store that cannot be written or read. Never replaced by a
/// default: an empty member record or a term read as 0 (terms would repeat) is worse than
/// skipping the step, which fails safe (a lease not renewed fences this node; a term not taken
/// means no leadership).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseValueError {
    /// Encoding failed; nothing was written.
    #[error("cannot encode the {what}: {reason}")]
    Encode {
        /// What the value is.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A stored value cannot be read.
    #[error("cannot read the {what} at {key}: {reason}")]
    Decode {
        /// What the value is.
        what: &'static str,
        /// Where it is stored.
        key: String,
        /// Why.
        reason: String,
    },
}

impl Stored for MemberRecord {
    const WHAT: &'static str = "member record";
    const VERSION: u32 = 1;
    const READABLE_FROM: u32 = 1;
}

impl Stored for LeaderRecord {
    const WHAT: &'static str = "leader record";
    const VERSION: u32 = 1;
    const READABLE_FROM: u32 = 1;
}

impl Stored for SplitBrainRecord {
    const WHAT: &'static str = "split-brain record";
    const VERSION: u32 = 1;
    const READABLE_FROM: u32 = 1;
}

/// The term counter's value: the last term taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TermCounter(pub Term);

impl Stored for TermCounter {
    const WHAT: &'static str = "term counter";
    const VERSION: u32 = 1;
    const READABLE_FROM: u32 = 1;
}

/// A slot key's value: the node that holds the slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SlotHolder(pub NodeId);

impl Stored for SlotHolder {
    const WHAT: &'static str = "slot holder";
    const VERSION: u32 = 1;
    const READABLE_FROM: u32 = 1;
}

/// Encodes a value to write; a failure is logged and counted, and nothing is written.
fn encode<T: Stored>(v: &T) -> Result<Vec<u8>, LeaseValueError> {
    format::encode(v).map_err(|e| refused(LeaseValueError::Encode { what: T::WHAT, reason: e.to_string() }))
}

fn refused(e: LeaseValueError) -> LeaseValueError {
    warn!(error = %e, "coordination store value refused");
    metrics::counter!("shardline_lease_bad_values_total").increment(1);
    e
}

pub(crate) fn encode_value(v: &StoreValue) -> Result<Vec<u8>, LeaseValueError> {
    match v {
        StoreValue::Member(r) => encode(r),
        StoreValue::Leader(r) => encode(r),
        StoreValue::Term(t) => encode(&TermCounter(*t)),
        StoreValue::SlotHolder(n) => encode(&SlotHolder(n.clone())),
        StoreValue::SplitBrain(r) => encode(r),
    }
}

/// Decodes a stored value as the engine expects it; an unreadable one is an error naming why,
/// which the engine reports (and never replaces with a default).
pub(crate) fn decode_entry(e: Entry, kind: ValueKind) -> StoredEntry {
    let value = match kind {
        ValueKind::Member => format::decode(&e.value).map(StoreValue::Member),
        ValueKind::Leader => format::decode(&e.value).map(StoreValue::Leader),
        ValueKind::Term => format::decode(&e.value).map(|TermCounter(t)| StoreValue::Term(t)),
        ValueKind::SlotHolder => format::decode(&e.value).map(|SlotHolder(n)| StoreValue::SlotHolder(n)),
        ValueKind::SplitBrain => format::decode(&e.value).map(StoreValue::SplitBrain),
    }
    .map_err(|err| err.to_string());
    StoredEntry { key: e.key, value, revision: e.revision }
}
