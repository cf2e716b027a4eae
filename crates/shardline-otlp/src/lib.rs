//! Exports Shardline's traces to an OpenTelemetry collector, over OTLP/HTTP with JSON bodies.
//!
//! Shardline carries a trace context with every ask and tell (see `shardline::trace`): the
//! caller's `ask` span, the entity's `handle` span on whatever node it lives, and the entity's
//! own asks, all of one trace. This crate is a [`tracing_subscriber::Layer`] that sends those
//! spans, with the application's own spans opened inside them, to a collector (the
//! OpenTelemetry Collector, Jaeger, Tempo, …) at its OTLP/HTTP port, so a trace shows caller,
//! hops and entity across nodes.
//!
//! Why not the OpenTelemetry SDK: the ids must be the ones that travel between nodes. The SDK's
//! tracer draws span ids of its own inside each process, so a `handle` span on another node
//! would name a parent that no exported span has. Here the ids are Shardline's, and the
//! exporter is a few hundred lines on the standard library (one thread, plain HTTP/1.1, JSON),
//! with no gRPC stack or protobuf compiler in the build.
//!
//! - **What is exported**: every span that carries `trace_id` and `span_id` fields (Shardline's,
//!   of the target `shardline::trace`), and every span opened inside one (a child with an id of
//!   its own). Other spans and all events stay with the application's other layers.
//! - **How**: closed spans go to a bounded queue; one thread posts them in batches to the
//!   collector. A full queue or a collector that does not answer loses spans, never blocks the
//!   application: each loss is logged and counted (`shardline_otlp_spans_lost_total`).
//! - **Shutdown**: [`OtlpGuard::flush`] (or dropping the guard) sends what is queued.
//!
//! # Example
//! ```no_run
//! use tracing_subscriber::prelude::*;
//!
//! let (otlp, guard) = shardline_otlp::layer(shardline_otlp::OtlpConfig::new("http://127.0.0.1:4318", "accounts")?)?;
//! let only_traces = tracing_subscriber::filter::Targets::new()
//!     .with_target("shardline::trace", tracing::Level::DEBUG)
//!     .with_target("accounts", tracing::Level::DEBUG);
//! tracing_subscriber::registry().with(otlp.with_filter(only_traces)).init();
//! // … run the node …
//! guard.flush(std::time::Duration::from_secs(5))?;
//! # Ok::<(), shardline_otlp::OtlpError>(())
//! ```

#![warn(missing_docs)]

mod exporter;
mod json;
mod layer;

use std::time::Duration;

pub use exporter::OtlpGuard;
pub use layer::OtlpLayer;

/// Why spans cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// The endpoint is not an `http://host:port[/path]` address.
    #[error("not an OTLP/HTTP endpoint ({0}): {1:?}")]
    Endpoint(&'static str, String),
    /// The exporter's thread could not be started.
    #[error("cannot start the exporter's thread: {0}")]
    Thread(std::io::Error),
    /// [`OtlpGuard::flush`] did not finish in time; the spans not sent yet stay queued.
    #[error("the exporter did not flush within {0:?}")]
    FlushTimeout(Duration),
}

/// Where and how spans are exported.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// `host:port` of the collector.
    pub(crate) authority: String,
    /// The path spans are posted to (`/v1/traces` unless the endpoint names one).
    pub(crate) path: String,
    /// The `service.name` of every span's resource.
    pub(crate) service: String,
    /// Spans per request, at most (default 512).
    pub batch: usize,
    /// How long a span may wait for a full batch (default 1 s).
    pub interval: Duration,
    /// Closed spans queued for the exporter before new ones are lost (default 65,536).
    pub queue: usize,
    /// Connect, write and read timeout of each request (default 5 s).
    pub timeout: Duration,
}

impl OtlpConfig {
    /// Spans of `service` to the collector at `endpoint`: `http://host:4318` (the OTLP/HTTP
    /// port), or with the path to post to. HTTPS is refused: put the collector (or an agent of
    /// it) beside the node.
    pub fn new(endpoint: &str, service: impl Into<String>) -> Result<OtlpConfig, OtlpError> {
        let bad = |why| OtlpError::Endpoint(why, endpoint.to_string());
        let rest = endpoint.strip_prefix("http://").ok_or_else(|| {
            bad(if endpoint.starts_with("https://") { "https is not supported" } else { "not http://" })
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let port = authority.rsplit_once(':').map(|(_, p)| p);
        if authority.is_empty() || port.is_none_or(|p| p.parse::<u16>().is_err()) {
            return Err(bad("no host:port"));
        }
        let path = if path.is_empty() || path == "/" { "/v1/traces" } else { path };
        Ok(OtlpConfig {
            authority: authority.to_string(),
            path: path.to_string(),
            service: service.into(),
            batch: 512,
            interval: Duration::from_secs(1),
            queue: 65_536,
            timeout: Duration::from_secs(5),
        })
    }
}

/// The layer that exports spans, and the guard that flushes them: keep the guard until the
/// application ends.
pub fn layer(config: OtlpConfig) -> Result<(OtlpLayer, OtlpGuard), OtlpError> {
    let (queue, guard) = exporter::start(config)?;
    Ok((OtlpLayer::new(queue), guard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_read_or_refused() {
        let c = OtlpConfig::new("http://127.0.0.1:4318", "s").unwrap();
        assert_eq!((c.authority.as_str(), c.path.as_str()), ("127.0.0.1:4318", "/v1/traces"));
        let c = OtlpConfig::new("http://collector:4318/otlp/v1/traces", "s").unwrap();
        assert_eq!((c.authority.as_str(), c.path.as_str()), ("collector:4318", "/otlp/v1/traces"));
        for bad in ["", "127.0.0.1:4318", "https://c:4318", "http://", "http://c", "http://c:x/", "http://c:99999"] {
            assert!(OtlpConfig::new(bad, "s").is_err(), "{bad:?}");
        }
    }
}
