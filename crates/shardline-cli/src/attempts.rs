//! What a caller that resends one request may conclude when it gives up.
//!
//! Each attempt's error says whether that attempt was processed. A request resent with its
//! request id after an attempt of unknown outcome (a timeout, a node killed under it) may be
//! applied already, whatever a later attempt says: "this node cannot route the message" on the
//! last try says nothing about the first. A driver that reported the last error counted such a
//! request as not applied, and the journal then held a write its history said was refused.

use shardline::{Error, Processed};

/// The attempts of one request so far.
///
/// ```
/// use shardline::{Error, Processed};
/// use shardline_cli::attempts::Attempts;
///
/// let mut attempts = Attempts::default();
/// attempts.failed(&Error::Timeout(std::time::Duration::from_secs(5)));
/// let last = Error::Unavailable("this node cannot route the message".into());
/// assert_eq!(last.processed(), Processed::No);
/// assert_eq!(attempts.verdict(last).processed(), Processed::Maybe);
/// ```
#[derive(Debug, Default)]
pub struct Attempts {
    /// The first error that left an attempt's outcome open, if any.
    open: Option<String>,
}

impl Attempts {
    /// Notes an attempt that failed with `e`.
    pub fn failed(&mut self, e: &Error) {
        if e.processed() != Processed::No && self.open.is_none() {
            self.open = Some(e.to_string());
        }
    }

    /// The error to report when the caller gives up after `last`: `last`, unless it says "not
    /// processed" while an earlier attempt may have been.
    pub fn verdict(&self, last: Error) -> Error {
        match &self.open {
            Some(first) if last.processed() == Processed::No => {
                Error::OutcomeUnknown(format!("{last}, but an earlier attempt may have been applied ({first})"))
            }
            _ => last,
        }
    }
}
