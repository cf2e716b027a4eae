//! `/api/...`: the cluster, a type's shard map and rebalancing, the event stream, drain and
//! rebalance. Each answer comes from [`shardline::Cluster`]'s admin queries, which ask the leader
//! or every member as needed, so any node answers for the whole cluster.

use std::convert::Infallible;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream;
use serde::Deserialize;
use serde_json::{json, Value};
use shardline::{AdminError as Refused, TypeKey};
use tokio::sync::broadcast::error::RecvError;
use tracing::warn;

use crate::auth::Authorized;
use crate::error::ApiError;
use crate::AdminState;

/// `?type=T`.
#[derive(Deserialize)]
pub(crate) struct TypeParam {
    #[serde(rename = "type")]
    type_key: Option<String>,
}

/// A refusal of the cluster, as the HTTP status that says who should act: the caller (4xx) or
/// the cluster, which may answer later (5xx).
fn refused(e: Refused) -> ApiError {
    let status = match &e {
        Refused::UnknownType(_) | Refused::UnknownNode(_) => StatusCode::NOT_FOUND,
        Refused::AlreadyLeaving(_) => StatusCode::CONFLICT,
        Refused::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
        Refused::NoLeader(_) => StatusCode::SERVICE_UNAVAILABLE,
        Refused::NoAnswer { .. } => StatusCode::BAD_GATEWAY,
        // This API took the request; the node that must act did not (no shared admin secret).
        Refused::Unauthorized(_) => StatusCode::FORBIDDEN,
    };
    if status.is_server_error() {
        warn!(error = %e, "admin request not answered");
    }
    ApiError::new(status, e.to_string())
}

fn bad_query(e: QueryRejection) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, format!("bad query: {}", e.body_text()))
}

/// The type a request names; without one, the only type registered (or a 400 listing them).
fn type_of(s: &AdminState, q: Result<Query<TypeParam>, QueryRejection>) -> Result<String, ApiError> {
    let Query(q) = q.map_err(bad_query)?;
    if let Some(t) = q.type_key {
        return Ok(t);
    }
    let types = s.cluster.type_keys();
    match types.as_slice() {
        [only] => Ok(only.clone()),
        _ => Err(ApiError::new(StatusCode::BAD_REQUEST, format!("say which type: ?type=T, one of {types:?}"))),
    }
}

pub(crate) async fn cluster(State(s): State<AdminState>) -> Json<shardline::ClusterStatus> {
    Json(s.cluster.cluster_status().await)
}

pub(crate) async fn shards(
    State(s): State<AdminState>,
    q: Result<Query<TypeParam>, QueryRejection>,
) -> Result<Json<shardline::ShardMapReport>, ApiError> {
    let t = type_of(&s, q)?;
    s.cluster.shard_map(&t).await.map(Json).map_err(refused)
}

/// One type's round with `?type=T`; every type's without.
pub(crate) async fn rebalancing(
    State(s): State<AdminState>,
    q: Result<Query<TypeParam>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(bad_query)?;
    if let Some(t) = q.type_key {
        let r = s.cluster.rebalancing(&t).await.map_err(refused)?;
        return Ok(Json(json!(r)));
    }
    let mut types = Vec::new();
    for t in s.cluster.type_keys() {
        types.push(s.cluster.rebalancing(&t).await.map_err(refused)?);
    }
    let in_progress = types.iter().any(|r| r.in_progress);
    Ok(Json(json!({ "in_progress": in_progress, "types": types })))
}

pub(crate) async fn rebalance(
    State(s): State<AdminState>,
    _: Authorized,
    q: Result<Query<TypeParam>, QueryRejection>,
) -> Result<(StatusCode, Json<shardline::RebalancingReport>), ApiError> {
    let t = type_of(&s, q)?;
    let r = s.cluster.rebalance(&t).await.map_err(refused)?;
    Ok((StatusCode::ACCEPTED, Json(r)))
}

/// The body of `PUT /api/shards`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Assignments {
    assignments: Vec<Assignment>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Assignment {
    shard: u32,
    node: String,
}

/// External allocation: `{"assignments": [{"shard": 3, "node": "b"}, ...]}` for a type with the
/// `External` strategy. A body that cannot be read is a 4xx (400 not JSON, 415 without a JSON
/// content type, 422 not the right shape, 413 past [`crate::MAX_BODY`]), and so is one the
/// leader refuses (422); nothing of a refused body is taken.
pub(crate) async fn assign(
    State(s): State<AdminState>,
    _: Authorized,
    q: Result<Query<TypeParam>, QueryRejection>,
    body: Result<Json<Assignments>, JsonRejection>,
) -> Result<(StatusCode, Json<shardline::RebalancingReport>), ApiError> {
    let t = type_of(&s, q)?;
    let Json(body) = body.map_err(|e| ApiError::new(e.status(), format!("bad body: {}", e.body_text())))?;
    let pairs = body.assignments.into_iter().map(|a| (a.shard, a.node)).collect();
    let r = s.cluster.assign_shards(&t, pairs).await.map_err(refused)?;
    Ok((StatusCode::ACCEPTED, Json(r)))
}

pub(crate) async fn drain(
    State(s): State<AdminState>,
    _: Authorized,
    name: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Path(name) = name.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    s.cluster.drain(&name).await.map_err(refused)?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "node": name, "draining": true }))))
}

/// Server-sent events: one per domain event, named by its kind, its data the event as JSON with
/// `type` (the entity type) and `kind`. A client that falls behind gets a `lagged` event saying
/// how many it missed, and should read the state again.
pub(crate) async fn events(State(s): State<AdminState>, _: Authorized) -> Response {
    let rx = s.cluster.events();
    let stream = stream::unfold(rx, |mut rx| async move {
        let event = match rx.recv().await {
            Ok((type_key, e)) => domain_event(&type_key, &e),
            Err(RecvError::Lagged(n)) => Event::default().event("lagged").data(json!({ "missed": n }).to_string()),
            Err(RecvError::Closed) => return None,
        };
        Some((Ok::<_, Infallible>(event), rx))
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// `{"type": T, "kind": "ShardMigrated", ...the event's fields}`, node ids as their names.
pub(crate) fn event_json(type_key: &TypeKey, e: &shardline::DomainEvent) -> Value {
    let mut out = json!({ "type": type_key.to_string() });
    if let Ok(Value::Object(tagged)) = serde_json::to_value(e) {
        for (kind, fields) in tagged {
            out["kind"] = json!(kind);
            if let Value::Object(fields) = fields {
                for (k, v) in fields {
                    out[k.as_str()] = names(v);
                }
            }
        }
    }
    out
}

fn domain_event(type_key: &TypeKey, e: &shardline::DomainEvent) -> Event {
    let v = event_json(type_key, e);
    let kind = v["kind"].as_str().unwrap_or("event").to_string();
    Event::default().event(kind).data(v.to_string())
}

/// Node ids (`{"name", "incarnation"}`) as their names, homes as `{"node", "epoch"}`.
fn names(v: Value) -> Value {
    match v {
        Value::Object(mut o) => {
            if o.len() == 2 && o.contains_key("name") && o.contains_key("incarnation") {
                return o.remove("name").unwrap_or(Value::Null);
            }
            if let (Some(owner), Some(epoch)) = (o.get("owner"), o.get("epoch")) {
                let epoch = format!("{}.{}", epoch["term"], epoch["seq"]);
                return json!({ "node": names(owner.clone()), "epoch": epoch });
            }
            Value::Object(o.into_iter().map(|(k, v)| (k, names(v))).collect())
        }
        other => other,
    }
}
