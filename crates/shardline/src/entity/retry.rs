//! Asking an event-sourced entity until it answers, with one request id for every attempt: a
//! retry after a timeout then applies the command at most once. A plain
//! [`ask`](EventSourcedHandle::ask) draws a fresh id per call, so a caller that retried it on
//! [`Error::Timeout`] could apply the command twice; every user ended up writing this loop.

use std::time::Duration;

use super::event_sourced::fresh_request_id;
use super::{EventSourced, EventSourcedHandle, Persist, Request};
use crate::error::{Error, Processed};

/// How [`EventSourcedHandle::ask_retrying`] retries.
///
/// ```
/// use std::time::Duration;
/// use shardline::RetryPolicy;
///
/// let patient = RetryPolicy { attempts: 10, ..RetryPolicy::default() };
/// assert_eq!(patient.backoff(0), Duration::from_millis(50));
/// assert_eq!(patient.backoff(1), Duration::from_millis(100));
/// assert_eq!(patient.backoff(9), Duration::from_secs(2), "capped");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least one).
    pub attempts: u32,
    /// How long each attempt waits for its answer.
    pub timeout: Duration,
    /// The wait before the first retry; it doubles at each retry, up to `max_backoff`.
    pub first_backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// Five attempts of 5 s each, waiting 50 ms, then 100 ms, … at most 2 s between them.
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            timeout: Duration::from_secs(5),
            first_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// The wait after the failed attempt number `retry` (from 0).
    pub fn backoff(&self, retry: u32) -> Duration {
        self.first_backoff.saturating_mul(1u32 << retry.min(20)).min(self.max_backoff)
    }

    /// Whether an attempt that failed with `e` is tried again. With the same request id, an
    /// attempt that may have been applied (a timeout, an unknown outcome) is safe to repeat: the
    /// entity answers a repeat with the first reply. Not retried: a refusal that would come
    /// again (`Rejected`), a reply that cannot be read (`ReplyLost`), and a request too old to
    /// be recognised (`RequestExpired`).
    pub fn retries(e: &Error) -> bool {
        matches!(e, Error::Timeout(_) | Error::OutcomeUnknown(_) | Error::Unavailable(_) | Error::Overloaded(_))
    }
}

/// What a caller that resends one request may conclude when it gives up.
///
/// Each attempt's error says whether that attempt was processed. A request resent with its
/// request id after an attempt of unknown outcome (a timeout, a node killed under it) may be
/// applied already, whatever a later attempt says: "this node cannot route the message" on the
/// last try says nothing about the first. A caller that reported the last error counted such a
/// request as not applied, and the journal then held a write its history said was refused.
/// [`EventSourcedHandle::ask_retrying`] keeps one; a caller with a retry loop of its own keeps
/// another.
///
/// ```
/// use shardline::{Attempts, Error, Processed};
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

impl<T: EventSourced> EventSourcedHandle<T> {
    /// Sends a command to entity `id` until it answers, as `policy` says, with one request id
    /// for every attempt: the command is applied at most once, however many attempts it takes.
    /// The error is the last attempt's, except that a last attempt that was not processed after
    /// one that may have been is [`Error::OutcomeUnknown`]: the command may have been applied.
    ///
    /// ```no_run
    /// # use shardline::{EventSourcedHandle, RetryPolicy};
    /// # async fn pay<T: shardline::EventSourced<Command = u64>>(h: EventSourcedHandle<T>) -> Result<(), shardline::Error> {
    /// h.ask_retrying("account-7", 100, RetryPolicy::default()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn ask_retrying<Q: Request<T::Command, T::Reply>>(
        &self,
        id: impl AsRef<str>,
        command: Q,
        policy: RetryPolicy,
    ) -> Result<Q::Reply, Error>
    where
        T::Command: Clone,
    {
        let command = command.into_message();
        let request_id = fresh_request_id();
        let mut retry = 0;
        let mut attempts = Attempts::default();
        loop {
            let msg = Persist { request_id: Some(request_id.clone()), command: command.clone() };
            let attempt = self.ask_persist(id.as_ref(), msg, policy.timeout).await;
            match attempt {
                Err(e) if RetryPolicy::retries(&e) && retry + 1 < policy.attempts.max(1) => {
                    tracing::debug!(entity = id.as_ref(), error = %e, retry, "ask failed: retried with the same request id");
                    attempts.failed(&e);
                    tokio::time::sleep(policy.backoff(retry)).await;
                    retry += 1;
                }
                other => return self.answer::<Q>(other.map_err(|last| attempts.verdict(last))),
            }
        }
    }
}
