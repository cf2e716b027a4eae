//! The layer: which spans belong to a trace, their ids and attributes, and their times.

use std::cell::Cell;
use std::fmt;
use std::time::SystemTime;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::exporter::Queue;

/// One span as it is exported.
#[derive(Clone, Debug)]
pub(crate) struct Exported {
    pub trace_id: String,
    pub span_id: String,
    pub parent_id: Option<String>,
    pub name: &'static str,
    /// Its OTLP kind, from its `otel.kind` field (internal without one).
    pub kind: u8,
    pub start: SystemTime,
    pub end: SystemTime,
    /// The span's other fields, as text.
    pub attributes: Vec<(&'static str, String)>,
}

/// Exports the spans of Shardline's traces and the spans opened inside them; see the crate's
/// docs. Made by [`layer`](crate::layer).
pub struct OtlpLayer {
    queue: Queue,
}

impl OtlpLayer {
    pub(crate) fn new(queue: Queue) -> OtlpLayer {
        OtlpLayer { queue }
    }
}

/// The fields of a span, with the trace's ids taken apart.
#[derive(Default)]
struct Fields {
    trace_id: Option<String>,
    span_id: Option<String>,
    parent_id: Option<String>,
    kind: Option<u8>,
    rest: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let hex = |len: usize| value.len() == len && value.bytes().all(|b| b.is_ascii_hexdigit());
        match field.name() {
            "trace_id" if hex(32) => self.trace_id = Some(value.to_string()),
            "span_id" if hex(16) => self.span_id = Some(value.to_string()),
            "parent_id" if hex(16) => self.parent_id = Some(value.to_string()),
            "otel.kind" => self.kind = Some(crate::json::kind(value)),
            name => match self.rest.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => *v = value.to_string(),
                None => self.rest.push((name, value.to_string())),
            },
        }
    }
}

thread_local! {
    /// xorshift64* state for the ids of spans opened inside a trace: unique, not secret.
    static RNG: Cell<u64> = Cell::new({
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x07e1);
        h.finish() | 1
    });
}

/// A new span id: 16 hex digits, never all zeros.
fn new_span_id() -> String {
    RNG.with(|s| loop {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        let id = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        if id != 0 {
            return format!("{id:016x}");
        }
    })
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for OtlpLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let (trace_id, span_id, parent_id) = match (fields.trace_id, fields.span_id) {
            // A span of Shardline's: its ids are the ones that travel.
            (Some(t), Some(s)) => (t, s, fields.parent_id),
            // A span opened inside an exported one: its child.
            _ => {
                let Some(parent) = span.parent() else { return };
                let ext = parent.extensions();
                let Some(p) = ext.get::<Exported>() else { return };
                (p.trace_id.clone(), new_span_id(), Some(p.span_id.clone()))
            }
        };
        let now = SystemTime::now();
        span.extensions_mut().insert(Exported {
            trace_id,
            span_id,
            parent_id,
            name: attrs.metadata().name(),
            kind: fields.kind.unwrap_or(1),
            start: now,
            end: now,
            attributes: fields.rest,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        let Some(e) = ext.get_mut::<Exported>() else { return };
        let mut fields = Fields::default();
        values.record(&mut fields);
        // A parent named after the span was made (Shardline records it so).
        if let Some(p) = fields.parent_id {
            e.parent_id = Some(p);
        }
        if let Some(k) = fields.kind {
            e.kind = k;
        }
        for (name, value) in fields.rest {
            match e.attributes.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => *v = value,
                None => e.attributes.push((name, value)),
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(mut e) = span.extensions_mut().remove::<Exported>() else { return };
        e.end = SystemTime::now();
        self.queue.push(e);
    }
}
