//! What applications hold: a registered entity type ([`EntityHandle`]), one entity of it
//! ([`EntityRef`]), and the types registered on a node ([`Entities`], which entities get to
//! message other entities).

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use shardline_core::{EntityId, Epoch, NodeId, ShardId};
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::entity::request::answer;
use crate::entity::{Entity, EventSourced, EventSourcedHandle, Persistent, Request};
use crate::error::Error;
use crate::sharding::ask::stats as ask_stats;
use crate::sharding::entity::Registry;
use crate::sharding::envelope::Body;
use crate::sharding::region::{Region, RegionDyn};
use crate::trace::{tracing_on, SpanOf, TraceContext};

/// The entity types registered on a node: how an entity reaches other entities (it gets this
/// from its [`EntityContext`](crate::EntityContext), not the whole node).
#[derive(Clone)]
pub struct Entities {
    pub(crate) registry: Arc<dyn Registry>,
}

impl Entities {
    /// The handle of a registered type (None: not registered on this node).
    pub fn handle<E: Entity>(&self) -> Option<EntityHandle<E>> {
        let any = self.registry.typed(std::any::TypeId::of::<E>())?;
        any.downcast::<Region<E>>().ok().map(|region| EntityHandle { region, _e: PhantomData })
    }

    /// The handle of a registered event-sourced type (None: not registered on this node): an
    /// entity asks another, event-sourced one with its `ask`, `ask_with_request_id` or
    /// `ask_retrying`, which answer the reply or one error, as they do for any caller.
    ///
    /// ```no_run
    /// # use shardline::{EntityContext, EventSourced, Error};
    /// # async fn f<Account: EventSourced<Command = u64>>(ctx: &EntityContext) -> Result<(), Error> {
    /// let accounts = ctx.entities().event_sourced::<Account>().ok_or(Error::Rejected("no accounts here".into()))?;
    /// let reply = accounts.ask("acct-7", 100).await?;
    /// # Ok(()) }
    /// ```
    pub fn event_sourced<T: EventSourced>(&self) -> Option<EventSourcedHandle<T>> {
        self.handle::<Persistent<T>>().map(|inner| EventSourcedHandle { inner, _t: PhantomData })
    }
}

impl crate::EntityContext {
    /// The entity types registered on this node, to message other entities:
    /// `ctx.entities().handle::<Other>()`.
    pub fn entities(&self) -> Entities {
        Entities { registry: self.registry.clone() }
    }
}

/// A registered entity type on this node.
pub struct EntityHandle<E: Entity> {
    pub(crate) region: Arc<Region<E>>,
    pub(crate) _e: PhantomData<fn() -> E>,
}

impl<E: Entity> Clone for EntityHandle<E> {
    fn clone(&self) -> Self {
        EntityHandle { region: self.region.clone(), _e: PhantomData }
    }
}

impl<E: Entity> EntityHandle<E> {
    /// A reference to entity `id` (no I/O: the entity starts on its first message).
    pub fn entity_ref(&self, id: impl AsRef<str>) -> EntityRef<E> {
        let id = EntityId::new(id);
        EntityRef { shard: self.region.shard_of(id.as_str()), region: self.region.clone(), id }
    }

    /// The type's default ask timeout.
    pub fn default_ask_timeout(&self) -> Duration {
        self.region.default_ask_timeout()
    }

    /// The shard entity `id` belongs to.
    pub fn shard_of(&self, id: impl AsRef<str>) -> ShardId {
        self.region.shard_of(id.as_ref())
    }

    /// The owner of every shard as this node's region knows it (None: unknown).
    pub fn shard_homes(&self) -> Vec<Option<NodeId>> {
        self.region.homes()
    }

    /// Shards hosted on this node, with the epoch each is hosted at (the fencing token its
    /// entities carry).
    pub fn hosted_epochs(&self) -> Vec<(ShardId, Epoch)> {
        self.region.hosted()
    }

    /// Shards hosted on this node.
    pub fn hosted_shards(&self) -> Vec<ShardId> {
        self.region.hosted().into_iter().map(|(s, _)| s).collect()
    }

    /// Entities in memory on this node (idle and active).
    pub fn local_entities(&self) -> usize {
        self.region.entity_count()
    }

    /// Entities on this node with a running task (the others are idle state in memory).
    pub fn active_entities(&self) -> usize {
        self.region.active_count()
    }
}

/// A reference to one entity, valid anywhere in the cluster.
pub struct EntityRef<E: Entity> {
    pub(crate) region: Arc<Region<E>>,
    pub(crate) id: EntityId,
    /// The entity's shard, hashed once: every node agrees on it, so it never changes.
    pub(crate) shard: ShardId,
}

impl<E: Entity> Clone for EntityRef<E> {
    fn clone(&self) -> Self {
        EntityRef { region: self.region.clone(), id: self.id.clone(), shard: self.shard }
    }
}

impl<E: Entity> EntityRef<E> {
    /// The entity's id.
    pub fn id(&self) -> &EntityId {
        &self.id
    }

    /// Sends `msg` and waits for the reply, up to the type's default timeout. `msg` is the
    /// entity's message, answered with its reply, or a [`Request`] of it, answered with that
    /// request's reply (the types [`messages`](crate::messages) writes).
    pub async fn ask<Q: Request<E::Message, E::Reply>>(&self, msg: Q) -> Result<Q::Reply, Error> {
        self.ask_timeout(msg, self.region.default_ask_timeout()).await
    }

    /// Sends `msg` and waits for the reply, up to `timeout`, kept to the millisecond and rounded
    /// up (never early); [`Error::Timeout`] names the timeout as given.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the reply; the message may still be processed.
    pub async fn ask_timeout<Q: Request<E::Message, E::Reply>>(
        &self,
        msg: Q,
        timeout: Duration,
    ) -> Result<Q::Reply, Error> {
        let msg = msg.into_message();
        let ask = async |trace| {
            let started = ask_stats::start();
            let r = self.ask_once(msg, timeout, trace).await;
            let r = r.and_then(|reply| answer::<Q, _, _>(&self.region.type_key, reply));
            ask_stats::finish(started, &r);
            r
        };
        match self.call_span(true) {
            Some((trace, span)) => ask(Some(Box::new(trace))).instrument(span).await,
            None => ask(None).await,
        }
    }

    /// The trace context a call sends (a child of the message being handled, or a new trace),
    /// and the caller's span ([`crate::trace`]); None when this node does not trace.
    fn call_span(&self, ask: bool) -> Option<(TraceContext, tracing::Span)> {
        if !tracing_on() {
            return None;
        }
        let parent = TraceContext::current();
        let trace = parent.map_or_else(TraceContext::root, |p| p.child());
        let of = SpanOf {
            trace: &trace,
            parent: parent.as_ref(),
            node: self.region.node_id(),
            entity_type: &self.region.type_key,
            entity: &self.id,
        };
        Some((trace, of.call(ask)))
    }

    async fn ask_once(
        &self,
        msg: E::Message,
        timeout: Duration,
        trace: Option<Box<TraceContext>>,
    ) -> Result<E::Reply, Error> {
        let (tx, rx) = oneshot::channel();
        self.region.send_in(self.shard, &self.id, Body::Typed { msg, reply: Some(tx), trace })?;
        match self.region.deadlines().within(timeout, rx).await {
            Ok(Ok(r)) => r,
            // Nobody will answer: the entity panicked or its task was torn down mid-message.
            Ok(Err(_)) => Err(Error::OutcomeUnknown("the ask ended without a reply".into())),
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }

    /// Sends `msg` without waiting. Fails at once when the local region refuses it; after that,
    /// delivery is at most once.
    pub fn tell<Q: Request<E::Message, E::Reply>>(&self, msg: Q) -> Result<(), Error> {
        let msg = msg.into_message();
        let Some((trace, span)) = self.call_span(false) else {
            return self.region.send_in(self.shard, &self.id, Body::Typed { msg, reply: None, trace: None });
        };
        let _in = span.enter();
        self.region.send_in(self.shard, &self.id, Body::Typed { msg, reply: None, trace: Some(Box::new(trace)) })
    }
}
