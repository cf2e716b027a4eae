//! `EventSourcedHandle`: how callers send commands to an event-sourced type, each under a
//! request id so that the runtime's own resends cannot apply it twice.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{EventSourced, Persist, Persistent};
use crate::entity::request::answer;
use crate::entity::{EntityHandle, Request, RequestId};
use crate::error::Error;

/// The handle of a registered event-sourced type.
pub struct EventSourcedHandle<T: EventSourced> {
    pub(crate) inner: EntityHandle<Persistent<T>>,
    pub(crate) _t: PhantomData<fn() -> T>,
}

impl<T: EventSourced> Clone for EventSourcedHandle<T> {
    fn clone(&self) -> Self {
        EventSourcedHandle { inner: self.inner.clone(), _t: PhantomData }
    }
}

/// A request id unique across the nodes of a cluster and their restarts.
pub(crate) fn fresh_request_id() -> RequestId {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let start = START.get_or_init(|| SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    RequestId::by_runtime(format!("{start:x}-{}-{:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)))
}

impl<T: EventSourced> EventSourcedHandle<T> {
    /// The type's entity handle underneath (shards, homes, counts of hosted entities).
    pub fn entity_handle(&self) -> &EntityHandle<Persistent<T>> {
        &self.inner
    }

    /// The type's entity handle underneath.
    #[deprecated(note = "renamed `entity_handle`: `Cluster::entities` is the registered types")]
    pub fn entities(&self) -> &EntityHandle<Persistent<T>> {
        &self.inner
    }

    /// Sends a command to entity `id` and waits until its events are durable. The ask gets a
    /// fresh request id: the runtime's own resends (a bounce, a move) cannot apply it twice.
    ///
    /// `command` is the type's command, answered with its reply, or a [`Request`] of it,
    /// answered with that request's reply (the types [`commands`](crate::commands) writes).
    pub async fn ask<Q: Request<T::Command, T::Reply>>(
        &self,
        id: impl AsRef<str>,
        command: Q,
    ) -> Result<Q::Reply, Error> {
        self.ask_with_request_id(id, command, fresh_request_id()).await
    }

    /// [`ask`](Self::ask) with a request id of the caller's: asking again with the same id
    /// (after a timeout, say) applies the command at most once and returns the first reply, for
    /// as long as [`EventSourcedSettings::reply_retention`](crate::EventSourcedSettings) after
    /// the id was made ([`Error::RequestExpired`] after that).
    pub async fn ask_with_request_id<Q: Request<T::Command, T::Reply>>(
        &self,
        id: impl AsRef<str>,
        command: Q,
        request_id: RequestId,
    ) -> Result<Q::Reply, Error> {
        let msg = Persist { request_id: Some(request_id), command: command.into_message() };
        self.answer::<Q>(self.ask_persist(id, msg, self.inner.default_ask_timeout()).await)
    }

    /// [`ask`](Self::ask), waiting up to `timeout` instead of the type's default.
    pub async fn ask_timeout<Q: Request<T::Command, T::Reply>>(
        &self,
        id: impl AsRef<str>,
        command: Q,
        timeout: Duration,
    ) -> Result<Q::Reply, Error> {
        let msg = Persist { request_id: Some(fresh_request_id()), command: command.into_message() };
        self.answer::<Q>(self.ask_persist(id, msg, timeout).await)
    }

    /// The answer to request `Q` out of a reply of the type.
    pub(crate) fn answer<Q: Request<T::Command, T::Reply>>(
        &self,
        reply: Result<T::Reply, Error>,
    ) -> Result<Q::Reply, Error> {
        answer::<Q, _, _>(&self.inner.region.type_key, reply?)
    }

    /// Sends the message itself, up to `timeout`: its request id is the caller's, or None for a
    /// command whose reply is not recorded (a retry of it may apply it again; for loads that
    /// measure the bare cost).
    pub async fn ask_persist(
        &self,
        id: impl AsRef<str>,
        msg: Persist<T::Command>,
        timeout: Duration,
    ) -> Result<T::Reply, Error> {
        Ok(self.inner.entity_ref(id).ask_timeout(msg, timeout).await??)
    }
}
