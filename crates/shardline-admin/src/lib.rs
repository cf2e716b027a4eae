//! The admin HTTP API of a Shardline node, for orchestrators and operators
//! (`shardline node --admin HOST:PORT`).
//!
//! - `GET /`: a dashboard: the nodes, a grid of the shards coloured by owner, the live event feed
//!   and the rebalancing status, kept up to date from the event stream.
//! - `GET /health/live`: 200 while the node's process serves at all: liveness, the probe whose
//!   failure makes an orchestrator restart the process.
//! - `GET /health/ready`: 200 once the node is `Up` and has started every shard it was given;
//!   503 otherwise (joining, leaving, down), with the reason. It asks no other node, so a slow
//!   member never holds up a rolling update ([`shardline::Readiness`]).
//! - `GET /api/cluster`: the leader and its term, and every member with its status, version,
//!   roles and what it hosts (each member is asked; one that does not answer says why).
//! - `GET /api/shards?type=T`: the type's shard map from the leader: version, and per shard its
//!   node and epoch. `GET /api/rebalancing[?type=T]`: the running or last round: in progress,
//!   reason, moved and total.
//! - `PUT /api/shards?type=T` with `{"assignments": [{"shard": 3, "node": "b"}]}`: external
//!   allocation, for a type with the `External` strategy (202; refused assignments 422).
//! - `GET /api/events`: the cluster's domain events as server-sent events.
//! - `POST /api/nodes/{name}/drain`: that member leaves gracefully (202; a second drain is a 409).
//!   `POST /api/rebalance?type=T`: the leader plans a rebalance now (202).
//! - `GET /api/openapi.json`: this API, in OpenAPI 3.
//! - `GET /metrics`: the runtime's counters in Prometheus' text format, from the process's
//!   `metrics` recorder ([`install_prometheus`]), and per entity type the shards and entities
//!   this node hosts and the messages it buffers, read at each scrape.
//!
//! Every answer is JSON but the metrics; every 4xx and 5xx is `{"error": "..."}`: an unknown
//! path is a 404, a wrong method a 405.
//!
//! With an [`AdminTls`] ([`serve_tls`]), the API is served over HTTPS only.
//!
//! With an [`AdminToken`], the actions (drain, rebalance, `PUT /api/shards`) and the event
//! stream need `Authorization: Bearer <token>` (401 without it); reads stay open for probes and
//! scrapers. An API on an address other than loopback must have one ([`check_exposure`]).
//!
//! ```no_run
//! # async fn run(cluster: shardline::Cluster) -> Result<(), Box<dyn std::error::Error>> {
//! let metrics = shardline_admin::install_prometheus().ok();
//! let token = shardline_admin::AdminToken::new(std::env::var("SHARDLINE_ADMIN_TOKEN")?)?;
//! let addr: std::net::SocketAddr = "0.0.0.0:9090".parse()?;
//! shardline_admin::check_exposure(addr, Some(&token))?;
//! let listener = tokio::net::TcpListener::bind(addr).await?;
//! shardline_admin::serve(listener, shardline_admin::router(cluster, metrics, Some(token))).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod api;
mod auth;
mod error;
mod health;
mod tls;

use axum::extract::DefaultBodyLimit;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusBuilder;
pub use metrics_exporter_prometheus::PrometheusHandle;
use shardline::Cluster;

pub use auth::{check_exposure, AdminToken, MIN_TOKEN_LEN};
pub use error::{AdminError, ApiError};
pub use tls::{AdminTls, HANDSHAKE_LIMIT};

/// The largest request body read (a bigger one is a 413).
pub const MAX_BODY: usize = 64 * 1024;

/// What the handlers share.
#[derive(Clone)]
struct AdminState {
    cluster: Cluster,
    metrics: Option<PrometheusHandle>,
    token: Option<AdminToken>,
}

/// The admin API of `cluster`'s node. `metrics` renders `/metrics`; without it that path answers
/// 503 (this process records no metrics). With `token`, acting and following the events need it.
pub fn router(cluster: Cluster, metrics: Option<PrometheusHandle>, token: Option<AdminToken>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/health/live", get(health::live))
        .route("/health/ready", get(health::ready))
        .route("/metrics", get(prometheus))
        .route("/api/cluster", get(api::cluster))
        .route("/api/shards", get(api::shards).put(api::assign))
        .route("/api/rebalancing", get(api::rebalancing))
        .route("/api/rebalance", post(api::rebalance))
        .route("/api/events", get(api::events))
        .route("/api/openapi.json", get(openapi))
        .route("/api/nodes/{name}/drain", post(api::drain))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such path") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this path")
        })
        .with_state(AdminState { cluster, metrics, token })
}

/// The dashboard: one page, no build step, that reads the API and follows `/api/events`.
async fn dashboard() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("dashboard.html"))
}

/// The API described in OpenAPI 3.
async fn openapi() -> ([(header::HeaderName, &'static str); 1], &'static str) {
    ([(header::CONTENT_TYPE, "application/json")], include_str!("openapi.json"))
}

/// Serves `router` on `listener` until the process ends or the listener fails.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(listener, router).await
}

/// Serves `router` over HTTPS on `listener` until the process ends. A client whose TLS handshake
/// fails or takes longer than [`HANDSHAKE_LIMIT`] is dropped (logged at debug level), and the
/// others are served on.
pub async fn serve_tls(listener: tokio::net::TcpListener, router: Router, tls: AdminTls) -> std::io::Result<()> {
    axum::serve(tls::TlsListener::new(listener, &tls)?, router).await
}

/// Installs a Prometheus recorder as the process's `metrics` recorder and returns the handle that
/// renders it. Fails when the process has a recorder already.
pub fn install_prometheus() -> Result<PrometheusHandle, AdminError> {
    PrometheusBuilder::new().install_recorder().map_err(|e| AdminError::Metrics(e.to_string()))
}

async fn prometheus(axum::extract::State(s): axum::extract::State<AdminState>) -> Response {
    match &s.metrics {
        Some(h) => {
            hosting_gauges(&s.cluster);
            let mut text = h.render();
            ask_metrics(&s.cluster.ask_stats(), &mut text);
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
        }
        None => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "this process records no metrics").into_response(),
    }
}

/// Asks by outcome and the sampled ask latency, written as Prometheus text from the runtime's
/// per-thread counts (which no shared counter could keep without costing every ask).
fn ask_metrics(stats: &shardline::AskStats, out: &mut String) {
    use std::fmt::Write;
    let _ = writeln!(out, "# HELP shardline_asks_total Asks by outcome.\n# TYPE shardline_asks_total counter");
    for (outcome, n) in shardline::AskStats::OUTCOMES.iter().zip(stats.outcomes) {
        let _ = writeln!(out, "shardline_asks_total{{outcome=\"{outcome}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP shardline_ask_seconds Latency of asks from send to reply, one in {} timed.\n# TYPE shardline_ask_seconds histogram",
        shardline::AskStats::SAMPLE_EVERY
    );
    let mut cumulative = 0;
    for (bound, n) in shardline::AskStats::BUCKETS_US.iter().zip(stats.buckets) {
        cumulative += n;
        let _ = writeln!(out, "shardline_ask_seconds_bucket{{le=\"{}\"}} {cumulative}", *bound as f64 / 1e6);
    }
    let _ = writeln!(out, "shardline_ask_seconds_bucket{{le=\"+Inf\"}} {}", stats.timed());
    let _ = writeln!(out, "shardline_ask_seconds_sum {}", stats.sum_us as f64 / 1e6);
    let _ = writeln!(out, "shardline_ask_seconds_count {}", stats.timed());
}

/// What the node hosts, read at each scrape rather than kept up to date on every message: the
/// counts live in the regions already, and a gauge touched per message would cost every ask.
fn hosting_gauges(cluster: &Cluster) {
    for h in cluster.hosting() {
        let t = h.type_key;
        metrics::gauge!("shardline_shards_hosted", "type" => t.clone()).set(h.shards as f64);
        metrics::gauge!("shardline_entities_in_memory", "type" => t.clone()).set(h.entities as f64);
        metrics::gauge!("shardline_entities_active", "type" => t.clone()).set(h.active_entities as f64);
        metrics::gauge!("shardline_messages_buffered", "type" => t).set(h.buffered as f64);
    }
}
