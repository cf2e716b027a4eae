//! Errors: those of setting the API up, and the JSON body of every 4xx and 5xx answer.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// Setting up the admin API failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The Prometheus recorder could not be installed (the process has a recorder already).
    #[error("cannot install the Prometheus recorder: {0}")]
    Metrics(String),
    /// The token cannot be used.
    #[error("admin token: {0}")]
    BadToken(String),
    /// The API would listen beyond loopback with no token: anyone who reaches it could drain the
    /// cluster.
    #[error("the admin API on {0} is reachable from other hosts: it needs a token (--admin-token or SHARDLINE_ADMIN_TOKEN), or a loopback address")]
    TokenRequired(std::net::SocketAddr),
    /// The HTTPS certificate or key cannot be used.
    #[error("admin API TLS: {0}")]
    Tls(String),
}

/// An answer that is an error: its status and `{"error": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for people.
    pub message: String,
}

impl ApiError {
    /// An error answer.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(serde_json::json!({ "error": self.message }))).into_response()
    }
}
