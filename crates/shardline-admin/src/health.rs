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
    let mut body = json!({
        "status": r.status.map(|st| format!("{st:?}")),
        "shards_given": r.given,
        "shards_started": r.started,
    });
    let Some(why) = r.reason() else { return (StatusCode::OK, Json(body)) };
    body["error"] = json!(format!("not ready: {why}"));
    (StatusCode::SERVICE_UNAVAILABLE, Json(body))
}
