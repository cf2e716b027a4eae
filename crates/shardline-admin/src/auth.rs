//! Who may act on the cluster: a bearer token for the actions (drain, rebalance, external
//! assignments) and the event stream.
//!
//! Reads (status, shard maps, health, metrics) stay open: probes and scrapers carry no secret,
//! and a node bound to loopback is reachable only from its own host. An admin API that listens on
//! any other address must have a token ([`check_exposure`]): a node refuses to start otherwise.
//!
//! Without a token, loopback is not enough for the actions: a web page in a browser on the same
//! host can send a cross-site `POST` to `127.0.0.1`, or reach it through a name of its own that
//! resolves there (DNS rebinding). Browsers say where such a request comes from (`Origin`), so an
//! action without a token is taken only when it carries no `Origin` (curl, `shardline drain`) or
//! comes from this API's own pages on a loopback name, and (as the event stream) only when it
//! asks for a loopback name in `Host`: a page of a name that resolves to 127.0.0.1 gives itself
//! away there.

use std::net::SocketAddr;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use tracing::warn;

use crate::error::{AdminError, ApiError};
use crate::AdminState;

/// Shortest token accepted: a guessable one protects nothing.
pub const MIN_TOKEN_LEN: usize = 16;

/// The admin API's bearer token. Its `Debug` never shows it, and nothing logs it.
#[derive(Clone)]
pub struct AdminToken(String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(…)")
    }
}

impl AdminToken {
    /// A token of at least [`MIN_TOKEN_LEN`] visible ASCII characters (what an HTTP header can
    /// carry unchanged).
    ///
    /// ```
    /// use shardline_admin::AdminToken;
    /// assert!(AdminToken::new("s3cret-s3cret-s3cret").is_ok());
    /// assert!(AdminToken::new("short").is_err());
    /// ```
    pub fn new(token: impl Into<String>) -> Result<AdminToken, AdminError> {
        let token = token.into();
        if token.len() < MIN_TOKEN_LEN {
            return Err(AdminError::BadToken(format!("shorter than {MIN_TOKEN_LEN} characters")));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(AdminError::BadToken("only visible ASCII characters, no spaces".into()));
        }
        Ok(AdminToken(token))
    }

    /// Whether `offered` is the token, in time that does not depend on where they differ.
    fn matches(&self, offered: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), offered)
    }
}

/// Compares without an early exit: the time taken tells an attacker the length at most.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Refuses an admin API on `addr` without a token unless `addr` is a loopback address.
pub fn check_exposure(addr: SocketAddr, token: Option<&AdminToken>) -> Result<(), AdminError> {
    if token.is_none() && !addr.ip().is_loopback() {
        return Err(AdminError::TokenRequired(addr));
    }
    Ok(())
}

/// A request allowed to act: it carries the token, or the API has none. Handlers that act take
/// one; its rejection is a 401 with `{"error": ...}`.
pub(crate) struct Authorized;

impl FromRequestParts<AdminState> for Authorized {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AdminState) -> Result<Self, Self::Rejection> {
        let Some(token) = &state.token else { return same_host(parts).map_err(IntoResponse::into_response) };
        let offered = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .unwrap_or_default();
        if token.matches(offered) {
            return Ok(Authorized);
        }
        let why = if offered.is_empty() { "missing" } else { "wrong" };
        warn!(method = %parts.method, path = %parts.uri.path(), "admin request refused: {why} bearer token");
        let mut answer = ApiError::new(
            StatusCode::UNAUTHORIZED,
            format!("{why} bearer token: this action needs `Authorization: Bearer <admin token>`"),
        )
        .into_response();
        answer.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        Err(answer)
    }
}

/// Without a token: a request that no browser sent (no `Origin`), or one from this API's own
/// page, served under a loopback name. Anything else is a 403.
fn same_host(parts: &Parts) -> Result<Authorized, ApiError> {
    let host = parts.headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    // A page served from a name of its own that resolves to 127.0.0.1 (DNS rebinding) is of the
    // same origin as the API to the browser, which then sends no `Origin` on a GET (the event
    // stream): the name it asked for gives it away.
    if !is_loopback_name(host) {
        warn!(method = %parts.method, path = %parts.uri.path(), %host, "admin request refused: not for a loopback name");
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "a request for host {host:?}: without an admin token, actions and the event stream are served for \
                 127.0.0.1, [::1] or localhost only"
            ),
        ));
    }
    let Some(origin) = parts.headers.get(header::ORIGIN) else { return Ok(Authorized) };
    let origin = origin.to_str().unwrap_or_default();
    let authority = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
    if authority.is_some_and(|a| a.eq_ignore_ascii_case(host)) && is_loopback_name(host) {
        return Ok(Authorized);
    }
    warn!(method = %parts.method, path = %parts.uri.path(), %origin, "admin request refused: sent by a page of another site");
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        format!(
            "a request from a page of {origin:?}: without an admin token, actions are taken only from clients that \
             send no Origin (curl, shardline) or from this API's own pages on 127.0.0.1, [::1] or localhost"
        ),
    ))
}

/// Whether `host` (a `Host` header: name or address, and a port) names this host's loopback.
fn is_loopback_name(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_exactly() {
        let t = AdminToken::new("0123456789abcdef").unwrap();
        assert!(t.matches(b"0123456789abcdef"));
        assert!(!t.matches(b"0123456789abcdeF"));
        assert!(!t.matches(b"0123456789abcde"));
        assert!(!t.matches(b""));
        assert_eq!(format!("{t:?}"), "AdminToken(…)");
    }

    #[test]
    fn without_a_token_only_requests_no_browser_sent_or_from_its_own_page_act() {
        let parts = |origin: Option<&str>, host: &str| {
            let mut b = axum::http::Request::post("/api/rebalance").header(header::HOST, host);
            if let Some(o) = origin {
                b = b.header(header::ORIGIN, o);
            }
            b.body(()).unwrap().into_parts().0
        };
        assert!(same_host(&parts(None, "127.0.0.1:9090")).is_ok(), "curl");
        assert!(same_host(&parts(None, "localhost:9090")).is_ok(), "curl");
        // DNS rebinding without an Origin (a same-origin GET: the event stream).
        let rebound = same_host(&parts(None, "rebind.example:9090")).err().map(|e| e.status);
        assert_eq!(rebound, Some(StatusCode::FORBIDDEN));
        assert!(same_host(&parts(Some("http://127.0.0.1:9090"), "127.0.0.1:9090")).is_ok(), "its own page");
        assert!(same_host(&parts(Some("http://localhost:9090"), "localhost:9090")).is_ok());
        assert!(same_host(&parts(Some("http://[::1]:9090"), "[::1]:9090")).is_ok());
        for (origin, host) in [
            ("http://evil.example", "127.0.0.1:9090"),
            ("null", "127.0.0.1:9090"),
            ("http://127.0.0.1:8080", "127.0.0.1:9090"),
            // DNS rebinding: a name of the attacker's that resolves to 127.0.0.1.
            ("http://rebind.example:9090", "rebind.example:9090"),
        ] {
            let refused = same_host(&parts(Some(origin), host)).err().map(|e| e.status);
            assert_eq!(refused, Some(StatusCode::FORBIDDEN), "{origin} → {host}");
        }
    }

    #[test]
    fn a_token_is_needed_beyond_loopback() {
        let t = AdminToken::new("0123456789abcdef").unwrap();
        assert!(check_exposure("127.0.0.1:9090".parse().unwrap(), None).is_ok());
        assert!(check_exposure("[::1]:9090".parse().unwrap(), None).is_ok());
        assert!(check_exposure("0.0.0.0:9090".parse().unwrap(), None).is_err());
        assert!(check_exposure("10.1.2.3:9090".parse().unwrap(), None).is_err());
        assert!(check_exposure("0.0.0.0:9090".parse().unwrap(), Some(&t)).is_ok());
    }
}
