//! One running entity's task: it handles its mailbox in order, runs the entity's hooks, and
//! reports every marker to the engine, which says whether it stays, goes idle or stops.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use shardline_core::host::{AfterMarker, HostConfig, Marker, Unleased};
use shardline_core::EntityId;
use tokio::sync::mpsc;
use tracing::{debug, warn, Instrument};

use super::ShardHost;
use crate::sharding::entity::{Entity, EntityContext};
use crate::sharding::envelope::{Body, ReplySender};
use crate::sharding::message::{send_reply, ReplyAddr};
use crate::sharding::node::Node;
use crate::sharding::refusal::{refuse, Refusal};
use crate::trace::{tracing_on, Handled, SpanOf, TraceContext};

/// Where the reply to the message being handled goes. Held by the task's guard while the handler
/// runs, so that if it panics the asker hears so only after the entity is forgotten: a retry then
/// starts a fresh instance instead of landing in the dying one's mailbox.
enum InFlight<E: Entity> {
    Local(ReplySender<E>),
    Remote(ReplyAddr),
}

impl<E: Entity> InFlight<E> {
    fn refuse(self, node: &Node, why: Refusal<'_>) {
        match self {
            InFlight::Local(tx) => {
                let _ = tx.send(Err(why.error()));
            }
            InFlight::Remote(addr) => {
                send_reply(node.transport(), &addr.node, addr.req_id, Err(why.error()));
            }
        }
    }
}

/// Whether this node may process a message now, waiting while the engine says so
/// ([`HostConfig::unleased`]).
async fn may_host(node: &Node, config: &HostConfig) -> bool {
    let began = node.now_ms();
    while !node.may_host() {
        let held = node.now_ms().saturating_sub(began);
        match config.unleased(node.lease_granted(), held) {
            Unleased::Refuse => return false,
            Unleased::Wait { again_ms } => tokio::time::sleep(Duration::from_millis(again_ms)).await,
        }
    }
    true
}

async fn process<E: Entity>(
    node: &Node,
    config: &HostConfig,
    state: &mut E,
    ctx: &mut EntityContext,
    body: Body<E>,
    in_flight: &mut Option<InFlight<E>>,
) {
    // Held a moment while the lease is not granted yet (gossip's waits for a majority's answers
    // after joining); refused once it has waited, or at once when a lease ran out.
    if !may_host(node, config).await {
        // Not processed, so the sender may safely try again where the shard lives now.
        refuse(node.transport(), body, Refusal::Unleased(node.id()));
        return;
    }
    match body {
        Body::Typed { msg, reply, trace } => {
            *in_flight = reply.map(InFlight::Local);
            let r = match handling(node, ctx, trace.map(|t| *t), Handled::of(in_flight.is_some())) {
                Some((here, span)) => here.scope(state.handle(ctx, msg)).instrument(span).await,
                None => state.handle(ctx, msg).await,
            };
            if let Some(InFlight::Local(tx)) = in_flight.take() {
                let _ = tx.send(Ok(r));
            }
        }
        Body::Wire { payload, reply, owed, trace } => {
            // Owed until the reply is queued, at the end of this arm.
            let _owed = owed;
            *in_flight = reply.map(InFlight::Remote);
            let result = match postcard::from_bytes::<E::Message>(&payload) {
                Ok(msg) => {
                    let r = match handling(node, ctx, trace.map(|t| *t), Handled::of(in_flight.is_some())) {
                        Some((here, span)) => here.scope(state.handle(ctx, msg)).instrument(span).await,
                        None => state.handle(ctx, msg).await,
                    };
                    postcard::to_allocvec(&r).map_err(|e| Refusal::ReplyUnencodable(e.to_string()).error())
                }
                Err(e) => Err(Refusal::Undecodable(&ctx.id, e.to_string()).error()),
            };
            if let Some(InFlight::Remote(addr)) = in_flight.take() {
                send_reply(node.transport(), &addr.node, addr.req_id, result);
            }
        }
        // The entity has started (its hook ran before its first message): the place goes back.
        Body::Wake { woken } => drop(woken),
        Body::Reminder(delivery) => {
            let name = delivery.reminder.name().to_string();
            // A reminder starts a trace of its own: what the entity asks on is traced from it.
            let reminded = match handling(node, ctx, None, Handled::Delivery) {
                Some((here, span)) => here.scope(state.reminded(ctx, delivery.reminder)).instrument(span).await,
                None => state.reminded(ctx, delivery.reminder).await,
            };
            let handled = match reminded {
                Ok(()) => true,
                Err(e) => {
                    warn!(entity = %ctx.id, reminder = %name, error = %e, "the entity did not handle its reminder: it fires again");
                    false
                }
            };
            let _ = delivery.done.send(handled);
        }
        Body::Retire | Body::Nudge => {}
    }
}

/// The context the entity handles a message in (a child of its caller's; a new trace when the
/// message came without one: from a node of protocol 3 or 4, or one that does not trace), and
/// its span; None when this node does not trace.
fn handling(
    node: &Node,
    ctx: &EntityContext,
    caller: Option<TraceContext>,
    what: Handled,
) -> Option<(TraceContext, tracing::Span)> {
    if !tracing_on() {
        return None;
    }
    let here = caller.map_or_else(TraceContext::root, |c| c.child());
    let of =
        SpanOf { trace: &here, parent: caller.as_ref(), node: node.id(), entity_type: &ctx.type_key, entity: &ctx.id };
    Some((here, of.handle(what)))
}

/// Cleans up after an entity task that ended abnormally: its handler panicked, or the task was
/// aborted because the node was fenced. The entity is forgotten (the next message starts a fresh
/// instance) and the messages still in the mailbox fail as not processed; without this, a
/// panicking entity would refuse every later message and hold up its shard's hand-off forever.
struct TaskGuard<E: Entity> {
    host: Arc<ShardHost<E>>,
    id: EntityId,
    rx: mpsc::Receiver<Body<E>>,
    in_flight: Option<InFlight<E>>,
    done: bool,
}

impl<E: Entity> Drop for TaskGuard<E> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let panicked = std::thread::panicking();
        if panicked {
            tracing::error!(entity = %self.id, shard = %self.host.shard, "entity panicked: its state is dropped, the next message starts it afresh");
        }
        self.host.lock().task_failed(&self.id);
        self.host.forget_counted(&self.id);
        self.rx.close();
        while let Ok(body) = self.rx.try_recv() {
            refuse(self.host.env.node.transport(), body, Refusal::StoppedBefore(&self.id));
        }
        if let Some(reply) = self.in_flight.take() {
            reply.refuse(&self.host.env.node, Refusal::StoppedDuring(&self.id, panicked));
        }
        self.host.finish();
    }
}

impl<E: Entity> TaskGuard<E> {
    /// The task ends as its engine decided.
    fn done(mut self) {
        self.done = true;
        self.host.finish();
    }
}

/// One running entity: handles its mailbox, and reports every marker to the engine, which says
/// whether it stays, goes idle or stops.
pub(super) async fn run<E: Entity>(
    host: Arc<ShardHost<E>>,
    id: EntityId,
    mut state: E,
    fresh: bool,
    rx: mpsc::Receiver<Body<E>>,
    first: Body<E>,
) {
    let mut guard = TaskGuard { host: host.clone(), id: id.clone(), rx, in_flight: None, done: false };
    let node = host.env.node.clone();
    // Read before the context takes the epoch, so that no raise in between goes unseen.
    let mut raises = host.raises.load(Ordering::Acquire);
    let mut ctx = host.context(id.clone());
    if fresh {
        state.started(&mut ctx).await;
    }
    // Whether a message came since the last nudge.
    let mut busy = false;
    let mut next = Some(first);
    loop {
        let body = match next.take() {
            Some(b) => b,
            // The senders live in the engine (its resident), which outlives this task.
            None => guard.rx.recv().await.unwrap_or(Body::Retire),
        };
        if matches!(body, Body::Retire | Body::Nudge) {
            let marker = if matches!(body, Body::Nudge) { Marker::Nudge { busy } } else { Marker::Retire };
            // Decided under the lock, where nothing new can arrive.
            let after = {
                let mut engine = host.lock();
                let waiting = guard.rx.try_recv().ok();
                let after = engine.marker(&id, marker, waiting.is_some(), state, node.now_ms());
                (after, waiting)
            };
            match after {
                (AfterMarker::Stay(s), waiting) => {
                    state = s;
                    if matches!(marker, Marker::Nudge { .. }) {
                        busy = false;
                    }
                    next = waiting;
                    continue;
                }
                (AfterMarker::Idle, _) => return guard.done(),
                (AfterMarker::Evicted(mut s), _) => {
                    s.stopped(&mut ctx).await;
                    return guard.done();
                }
                (AfterMarker::Retire(mut s), _) => {
                    s.stopped(&mut ctx).await;
                    host.lock().handed(&id, s.hand_over());
                    return guard.done();
                }
            }
        }
        busy = true;
        // The epoch as of now: it may have been raised since the task started.
        let now = host.raises.load(Ordering::Acquire);
        if now != raises {
            raises = now;
            ctx.epoch = host.epoch();
        }
        process(&node, &host.config, &mut state, &mut ctx, body, &mut guard.in_flight).await;
        if !host.config.lingers(host.tasks.load(Ordering::Relaxed)) && guard.rx.is_empty() && !ctx.passivate {
            // Too many tasks linger in this shard: back to the map now if nothing waits.
            next = Some(Body::Retire);
        }
        if ctx.passivate {
            ctx.passivate = false;
            // The entity stays active while the stop hook runs, so new messages wait in the
            // mailbox instead of starting a second instance.
            state.stopped(&mut ctx).await;
            let (restart, waiting) = {
                let mut engine = host.lock();
                let waiting = loop {
                    match guard.rx.try_recv() {
                        Ok(Body::Nudge) => engine.nudge_taken(&id),
                        // The shard's stop marker comes after every message its shard let in:
                        // this instance has stopped, and the stop waits for nothing else.
                        Ok(Body::Retire) | Err(_) => break None,
                        Ok(e) => break Some(e),
                    }
                };
                (engine.passivated(&id, waiting.is_some()), waiting)
            };
            if !restart {
                host.forget_counted(&id);
                debug!(entity = %id, "passivated");
                return guard.done();
            }
            // Messages arrived meanwhile: start again with a fresh instance.
            state = E::new(&id);
            state.started(&mut ctx).await;
            next = waiting;
        }
    }
}
