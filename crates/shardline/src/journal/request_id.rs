//! `RequestId`: what makes a retried command of an event-sourced entity apply once, and what
//! the journal records its reply under.
//!
//! A request id is a key chosen once per logical request and the time it was issued. The key is
//! what the journal records with the command's reply; the time is what lets an entity tell a
//! retry it can still recognise from one it cannot: replies are kept for
//! [`EventSourcedSettings::reply_retention`](crate::EventSourcedSettings::reply_retention), and a
//! request issued longer ago than that is refused with
//! [`Error::RequestExpired`](crate::Error::RequestExpired) instead of being applied a second
//! time. So the guarantee is a statement about time, which a caller controls (how long it keeps
//! retrying), not about how many requests other callers sent meanwhile, which it cannot know.
//!
//! Make the id once and resend that same value: a `RequestId` made again from the same key later
//! would carry a new time. A caller that keeps its own keys across restarts keeps their issue
//! time with them ([`RequestId::issued_at`]).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Identifies one logical request across its retries.
///
/// ```
/// use shardline::RequestId;
///
/// let id = RequestId::new("transfer-42");
/// let retry = id.clone(); // resend this one, not RequestId::new("transfer-42") again
/// assert_eq!(retry.key(), "transfer-42");
/// assert_eq!(retry.issued_ms(), id.issued_ms());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestId {
    key: String,
    /// Milliseconds since the Unix epoch, by the issuer's clock.
    issued_ms: u64,
    /// Made by the runtime for a plain `ask`, whose caller never resends it: only the runtime's
    /// own resends reuse it, for which answering a read again is harmless, so a command that
    /// writes no event records no reply under it.
    by_runtime: bool,
}

impl RequestId {
    /// A request issued now.
    pub fn new(key: impl Into<String>) -> Self {
        RequestId::issued_at(key, SystemTime::now())
    }

    /// A request issued at `at` (a key kept across a restart of its caller, with its time).
    pub fn issued_at(key: impl Into<String>, at: SystemTime) -> Self {
        RequestId { key: key.into(), issued_ms: unix_ms(at), by_runtime: false }
    }

    /// A request id of the runtime's own (see `by_runtime`).
    pub(crate) fn by_runtime(key: String) -> Self {
        RequestId { by_runtime: true, ..RequestId::new(key) }
    }

    /// Whether a reply without events is recorded under this id: only for callers' own ids.
    pub(crate) fn records_reads(&self) -> bool {
        !self.by_runtime
    }

    /// The id of a request made on behalf of this one, told apart by `part`: the same key
    /// suffixed, the same issue time (it expires with this one), made by the same party. A
    /// decision that asks another entity under `ctx.request_id()`'s derivation applies that ask
    /// once, however many times it is decided.
    ///
    /// ```
    /// use shardline::RequestId;
    ///
    /// let order = RequestId::new("order-7/place");
    /// let stock = order.derive("reserve");
    /// assert_eq!(stock.key(), "order-7/place/reserve");
    /// assert_eq!(stock.issued_ms(), order.issued_ms());
    /// assert_eq!(order.derive("reserve"), stock, "the same every time");
    /// ```
    pub fn derive(&self, part: &str) -> RequestId {
        RequestId { key: format!("{}/{part}", self.key), ..self.clone() }
    }

    /// The key the journal records the reply under.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// When it was issued, in milliseconds since the Unix epoch.
    pub fn issued_ms(&self) -> u64 {
        self.issued_ms
    }

    /// How long ago it was issued, by `now` (zero if the issuer's clock is ahead).
    pub fn age(&self, now: SystemTime) -> Duration {
        Duration::from_millis(unix_ms(now).saturating_sub(self.issued_ms))
    }

    /// How far after `now` it was issued (zero unless the issuer's clock is ahead).
    pub fn ahead(&self, now: SystemTime) -> Duration {
        Duration::from_millis(self.issued_ms.saturating_sub(unix_ms(now)))
    }
}

/// Milliseconds since the Unix epoch (0 before it).
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis().min(u128::from(u64::MAX)) as u64)
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (issued at {} ms)", self.key, self.issued_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn age_counts_from_the_issue_time() {
        let t = UNIX_EPOCH + Duration::from_secs(1_000);
        let id = RequestId::issued_at("k", t);
        assert_eq!(id.age(t + Duration::from_secs(5)), Duration::from_secs(5));
        assert_eq!(id.age(t - Duration::from_secs(5)), Duration::ZERO, "an issuer ahead of us");
        assert_eq!(id.ahead(t - Duration::from_secs(5)), Duration::from_secs(5));
        assert_eq!(id.ahead(t + Duration::from_secs(5)), Duration::ZERO);
        assert_eq!(id.issued_ms(), 1_000_000);
    }
}
