//! `/health/live` and `/health/ready`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use crate::AdminState;

/// Serving HTTP at all is being alive.
pub(crate) async fn live() -> Json<Value> {
    Json(json!({ "status": "live" }))
}

/// 200 when [`shardline::Cluster::readiness`] says ready, 503 with the reason otherwise.
pub(crate) async fn ready(State(s): State<AdminState>) -> (StatusCode, Json<Value>) {
    let r = s.cluster.readiness();
    let status = r.status.map(|st| format!("{st:?}"));
    match r.reason() {
        None => {
            (StatusCode::OK, Json(json!({ "status": status, "shards_given": r.given, "shards_started": r.started })))
        }
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "error": format!("not ready: {why}"),
                "status": status,
                "shards_given": r.given,
                "shards_started": r.started,
            })),
        ),
    }
}
