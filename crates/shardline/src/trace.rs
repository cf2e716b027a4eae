//! Traces across nodes: the context an ask or a tell carries from its caller to the entity that
//! handles it, through every node that routes it on the way.
//!
//! A [`TraceContext`] is a W3C trace context (a 16-byte trace id, the 8-byte id of the span that
//! sent the message, a sampled flag). The caller's `ask` or `tell` opens a span of its own and
//! sends its context with the message: in the frame's trailer when the message leaves the node
//! (protocol 5; see [`transport::wire`](crate::transport::wire)), beside it when it stays. The
//! node that handles the message opens the entity's span as a child of the caller's, and the
//! entity's own asks and tells, made while it handles the message, are children of that span in
//! turn. So one trace id runs from the first caller through every entity its request reaches, on
//! whatever nodes they live.
//!
//! The spans are `tracing` spans of the target `shardline::trace`, at the debug level: off unless
//! a subscriber asks for them (`RUST_LOG=shardline::trace=debug`, or an exporter's filter). A
//! node whose subscribers do not want them sends no context and opens no spans, at the cost of
//! one cached check per message; a trace that reaches it goes on from there as a new one. Each
//! carries `trace_id` and `span_id` (and `parent_id` where there is one) as fields, so a log of
//! several nodes is read by its trace id. The ids are drawn here, not by an OpenTelemetry SDK:
//! an application that exports its spans keeps its own ids inside a node, and joins them across
//! nodes by these fields.
//!
//! # Example
//! ```
//! use shardline::TraceContext;
//!
//! let root = TraceContext::root();
//! let child = root.child();
//! assert_eq!(child.trace_id, root.trace_id);
//! assert_ne!(child.span_id, root.span_id);
//! let header = child.traceparent();
//! assert_eq!(TraceContext::from_traceparent(&header), Ok(child));
//! ```

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};

/// Where a message's trace stands: its trace, and the span that sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TraceContext {
    /// The trace: the same from the first caller to the last entity. Never all zeros.
    pub trace_id: [u8; 16],
    /// The span that sent the message (the caller's, or the entity's that asked on). Never all
    /// zeros.
    pub span_id: [u8; 8],
    /// W3C trace flags; bit 0 says the trace is sampled.
    pub flags: u8,
}

/// A `traceparent` header that is not one (W3C Trace Context, version 00).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a traceparent header ({0}): {1:?}")]
pub struct TraceParentError(&'static str, String);

tokio::task_local! {
    /// The span an entity task is handling a message in: asks and tells made in it are its
    /// children.
    static CURRENT: TraceContext;
}

thread_local! {
    /// xorshift64* state, seeded per thread from the std hasher's random keys: ids need to be
    /// unique, not unpredictable, and drawing one must cost nothing next to a message.
    static RNG: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    h.finish() | 1
}

fn next_u64() -> u64 {
    RNG.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

/// A nonzero id (W3C: all zeros is invalid).
fn span_id() -> [u8; 8] {
    loop {
        let id = next_u64();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

/// One new trace in this many is sampled (see [`sample_one_in`]).
static ONE_IN: AtomicU32 = AtomicU32::new(1);

/// Samples one new trace in `one_in` on this process (every one until this is called): head
/// sampling, decided where a trace starts and carried in its flags, so every node a trace reaches
/// opens its spans or none of them. An unsampled trace still travels (the context costs its 25
/// bytes), which keeps the decision of the node that started it; only its spans are not opened,
/// and what the application opens inside them is not exported. A trace brought in by a
/// `traceparent` header keeps the flag it came with.
///
/// ```
/// use std::num::NonZeroU32;
///
/// // One request in a hundred is traced, with every hop and entity it reaches.
/// shardline::trace::sample_one_in(NonZeroU32::new(100).unwrap());
/// # shardline::trace::sample_one_in(NonZeroU32::MIN);
/// ```
pub fn sample_one_in(one_in: NonZeroU32) {
    ONE_IN.store(one_in.get(), Ordering::Relaxed);
}

/// Whether a new trace is sampled, at one in `one_in`.
fn draw_sampled(one_in: u32) -> bool {
    one_in <= 1 || next_u64() % u64::from(one_in) == 0
}

impl TraceContext {
    /// A new trace, sampled or not as [`sample_one_in`] says (sampled by default).
    pub fn root() -> TraceContext {
        let mut trace_id = [0; 16];
        trace_id[..8].copy_from_slice(&span_id());
        trace_id[8..].copy_from_slice(&next_u64().to_be_bytes());
        let flags = u8::from(draw_sampled(ONE_IN.load(Ordering::Relaxed)));
        TraceContext { trace_id, span_id: span_id(), flags }
    }

    /// A span of the same trace under this one: its id is new, the trace and flags are kept.
    pub fn child(&self) -> TraceContext {
        TraceContext { span_id: span_id(), ..*self }
    }

    /// The context of the message the current entity task is handling, if any.
    pub fn current() -> Option<TraceContext> {
        CURRENT.try_with(|c| *c).ok()
    }

    /// The context a new call takes: a child of the message being handled, or a new trace.
    pub fn for_call() -> TraceContext {
        TraceContext::current().map_or_else(TraceContext::root, |c| c.child())
    }

    /// Runs `f` with this context as [`current`](Self::current): what it asks and tells are
    /// children of this span.
    pub async fn scope<F: Future>(self, f: F) -> F::Output {
        CURRENT.scope(self, f).await
    }

    /// Whether the trace is sampled (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The trace id in lowercase hex (32 digits), as logs and exporters show it.
    pub fn trace_hex(&self) -> Hex<'_> {
        Hex(&self.trace_id)
    }

    /// The span id in lowercase hex (16 digits).
    pub fn span_hex(&self) -> Hex<'_> {
        Hex(&self.span_id)
    }

    /// The W3C `traceparent` header: `00-{trace id}-{span id}-{flags}`, to hand the trace to an
    /// HTTP or gRPC call, or to an OpenTelemetry SDK's propagator.
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", self.trace_hex(), self.span_hex(), self.flags)
    }

    /// Reads a W3C `traceparent` header of version 00: to continue a trace that an HTTP
    /// request brought in (run the handler in [`scope`](Self::scope)).
    pub fn from_traceparent(header: &str) -> Result<TraceContext, TraceParentError> {
        let bad = |why| TraceParentError(why, header.to_string());
        let parts: Vec<&str> = header.trim().split('-').collect();
        let [version, trace, span, flags] = parts[..] else { return Err(bad("not four fields")) };
        if version != "00" {
            return Err(bad("not version 00"));
        }
        let mut ctx = TraceContext { trace_id: [0; 16], span_id: [0; 8], flags: 0 };
        unhex(trace, &mut ctx.trace_id).ok_or_else(|| bad("trace id is not 32 hex digits"))?;
        unhex(span, &mut ctx.span_id).ok_or_else(|| bad("span id is not 16 hex digits"))?;
        let mut f = [0u8; 1];
        unhex(flags, &mut f).ok_or_else(|| bad("flags are not 2 hex digits"))?;
        ctx.flags = f[0];
        if ctx.trace_id == [0; 16] || ctx.span_id == [0; 8] {
            return Err(bad("an id of all zeros"));
        }
        Ok(ctx)
    }
}

/// Whether this node traces: some subscriber wants the spans of `shardline::trace`. When none
/// does, asks and tells carry no context and open no spans, so tracing off costs one cached
/// check per message (a trace that reaches a node that does not trace goes on from there as a
/// new one).
pub(crate) fn tracing_on() -> bool {
    tracing::enabled!(target: "shardline::trace", tracing::Level::DEBUG)
}

/// What an entity's `handle` span handles, which its OpenTelemetry kind says (`otel.kind`, the
/// field the OpenTelemetry bridges of `tracing` read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Handled {
    /// An ask, whose caller waits: a server span.
    Ask,
    /// A tell or a reminder's firing, which nobody waits on: a consumer span.
    Delivery,
}

impl Handled {
    /// An ask when a reply is owed, a delivery otherwise.
    pub fn of(replies: bool) -> Handled {
        if replies {
            Handled::Ask
        } else {
            Handled::Delivery
        }
    }
}

/// Where a span stands in its trace, and what it is about: its fields.
pub(crate) struct SpanOf<'a> {
    /// The span's own context.
    pub trace: &'a TraceContext,
    /// The span it is a child of, if any.
    pub parent: Option<&'a TraceContext>,
    /// The node the span is on.
    pub node: &'a dyn fmt::Display,
    /// The entity's type, and the entity, that the message is for.
    pub entity_type: &'a dyn fmt::Display,
    pub entity: &'a dyn fmt::Display,
}

impl SpanOf<'_> {
    /// The caller's span of an ask (`ask`) or a tell (`tell`); none for an unsampled trace.
    pub fn call(&self, ask: bool) -> tracing::Span {
        if !self.trace.sampled() {
            return tracing::Span::none();
        }
        let span = if ask {
            tracing::debug_span!(target: "shardline::trace", "ask", trace_id = %self.trace.trace_hex(), span_id = %self.trace.span_hex(), parent_id = tracing::field::Empty, node = %self.node, entity_type = %self.entity_type, entity = %self.entity, otel.kind = "client")
        } else {
            tracing::debug_span!(target: "shardline::trace", "tell", trace_id = %self.trace.trace_hex(), span_id = %self.trace.span_hex(), parent_id = tracing::field::Empty, node = %self.node, entity_type = %self.entity_type, entity = %self.entity, otel.kind = "producer")
        };
        self.parented(span)
    }

    /// The span of the entity handling a message (`handle`); none for an unsampled trace.
    pub fn handle(&self, what: Handled) -> tracing::Span {
        if !self.trace.sampled() {
            return tracing::Span::none();
        }
        let kind = if what == Handled::Ask { "server" } else { "consumer" };
        let span = tracing::debug_span!(target: "shardline::trace", "handle", trace_id = %self.trace.trace_hex(), span_id = %self.trace.span_hex(), parent_id = tracing::field::Empty, node = %self.node, entity_type = %self.entity_type, entity = %self.entity, otel.kind = kind);
        self.parented(span)
    }

    fn parented(&self, span: tracing::Span) -> tracing::Span {
        if let Some(p) = self.parent {
            span.record("parent_id", tracing::field::display(p.span_hex()));
        }
        span
    }
}

/// Decodes lowercase hex of exactly `out.len()` bytes (W3C's `traceparent` is lowercase: an
/// uppercase one is not a valid header, and a receiver must not take it).
fn unhex(s: &str, out: &mut [u8]) -> Option<()> {
    let b = s.as_bytes();
    if b.len() != out.len() * 2 || b.iter().any(u8::is_ascii_uppercase) {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        *o = (digit(b[2 * i])? * 16 + digit(b[2 * i + 1])?) as u8;
    }
    Some(())
}

/// Bytes shown as lowercase hex.
pub struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.trace_hex(), self.span_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_zero_and_differ() {
        let a = TraceContext::root();
        let b = TraceContext::root();
        assert_ne!(a.trace_id, b.trace_id);
        assert_ne!(a.trace_id, [0; 16]);
        assert_ne!(a.span_id, [0; 8]);
    }

    #[test]
    fn one_trace_in_n_is_sampled_and_its_children_follow() {
        assert!((0..1_000).all(|_| draw_sampled(1)), "all, by default");
        let sampled = (0..40_000).filter(|_| draw_sampled(4)).count();
        assert!((9_000..11_000).contains(&sampled), "about one in four: {sampled} of 40,000");
        assert!((0..10_000).filter(|_| draw_sampled(u32::MAX)).count() <= 1, "one in four billion");
        let off = TraceContext { flags: 0, ..TraceContext::root() };
        assert!(!off.child().sampled(), "a child keeps its trace's decision");
        let on = TraceContext { flags: 1, ..off };
        assert!(on.child().sampled());
    }

    #[test]
    fn an_unsampled_trace_opens_no_span() {
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = tracing_subscriber::registry().with(tracing_subscriber::filter::LevelFilter::DEBUG);
        tracing::subscriber::with_default(subscriber, || {
            let on = TraceContext { flags: 1, ..TraceContext::root() };
            let off = TraceContext { flags: 0, ..on };
            let of = |trace| SpanOf { trace, parent: None, node: &"n1", entity_type: &"t", entity: &"e" }.call(true);
            assert!(!of(&on).is_none(), "a sampled trace's ask has its span");
            assert!(of(&off).is_none(), "an unsampled one's has none");
            let handled = |trace| {
                SpanOf { trace, parent: None, node: &"n1", entity_type: &"t", entity: &"e" }.handle(Handled::Ask)
            };
            assert!(!handled(&on).is_none());
            assert!(handled(&off).is_none());
        });
    }

    #[test]
    fn traceparent_round_trips_and_refuses_what_is_not_one() {
        let c = TraceContext::root().child();
        let h = c.traceparent();
        assert_eq!(h.len(), 55, "{h}");
        assert_eq!(TraceContext::from_traceparent(&h), Ok(c));
        assert!(TraceContext::from_traceparent(&h.to_uppercase()).is_err(), "W3C ids are lowercase");
        let w3c = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = TraceContext::from_traceparent(w3c).unwrap();
        assert_eq!(parsed.traceparent(), w3c);
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bg-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert!(TraceContext::from_traceparent(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_call_in_a_scope_is_its_child() {
        assert_eq!(TraceContext::current(), None);
        let outer = TraceContext::root();
        let inner = outer
            .scope(async {
                assert_eq!(TraceContext::current(), Some(outer));
                TraceContext::for_call()
            })
            .await;
        assert_eq!(inner.trace_id, outer.trace_id);
        assert_ne!(inner.span_id, outer.span_id);
        assert_ne!(TraceContext::for_call().trace_id, outer.trace_id);
    }
}
