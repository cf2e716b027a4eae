//! `shardline status | shards | drain | rebalance`: the admin API from the command line, as
//! aligned tables for people or the API's JSON for scripts (`--json`).
//!
//! The client is a few lines of HTTP/1.1 on a tokio socket (one request per connection), over
//! TLS for an `https://` API (trusting the CA given with `--admin-ca`): the API is plain JSON,
//! and a full HTTP client would double the binary's build.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one call may take, connection included.
const CALL_LIMIT: Duration = Duration::from_secs(15);

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The token cannot travel in a header (it has spaces or control characters).
    #[error("bad admin token: only visible ASCII characters, no spaces")]
    BadToken,
    /// The CA to trust for an `https://` API cannot be used, or is missing.
    #[error("admin API TLS: {0}")]
    Tls(String),
    /// The URL is not `http://HOST:PORT[/]` or `https://HOST:PORT[/]`.
    #[error("bad admin URL {url:?}: {reason}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No answer from the API.
    #[error("cannot reach the admin API at {url}: {reason}")]
    Unreachable {
        /// Where.
        url: String,
        /// What happened.
        reason: String,
    },
    /// An answer that is not HTTP with a JSON body.
    #[error("the admin API at {url} answered something unreadable: {reason}")]
    Unreadable {
        /// Where.
        url: String,
        /// What was wrong.
        reason: String,
    },
    /// The API refused: its status and its `error`.
    #[error("{status}: {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The API's `error`.
        message: String,
    },
}

/// Where the admin API of a node is.
#[derive(Clone)]
pub struct AdminUrl {
    url: String,
    authority: String,
    token: Option<String>,
    /// For `https://`: the host's name as its certificate must show it, and whom to trust
    /// (set by [`AdminUrl::with_ca`]; an `https://` URL without it is refused at the call).
    tls: Option<(ServerName<'static>, Option<tokio_rustls::TlsConnector>)>,
}

impl std::fmt::Debug for AdminUrl {
    // Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminUrl").field("url", &self.url).finish_non_exhaustive()
    }
}

impl AdminUrl {
    /// Reads `http://HOST:PORT` or `https://HOST:PORT` (a trailing `/` is fine).
    pub fn parse(url: &str) -> Result<AdminUrl, ClientError> {
        let bad = |reason| ClientError::BadUrl { url: url.to_string(), reason };
        let (scheme, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => ("http", rest),
            (_, Some(rest)) => ("https", rest),
            _ => return Err(bad("it must start with http:// or https://")),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains('/') {
            return Err(bad("it must be http(s)://HOST:PORT, without a path"));
        }
        let (host, port) = authority.rsplit_once(':').ok_or_else(|| bad("it must name a port"))?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad("it must be http(s)://HOST:PORT with a port number"));
        }
        let tls = match scheme {
            "https" => {
                let name = host.trim_start_matches('[').trim_end_matches(']').to_string();
                let name = ServerName::try_from(name).map_err(|_| bad("its host is neither a name nor an address"))?;
                Some((name, None))
            }
            _ => None,
        };
        Ok(AdminUrl { url: format!("{scheme}://{authority}"), authority: authority.to_string(), token: None, tls })
    }

    /// Trusts the CA certificate(s) in `pem` for an `https://` API (no effect on `http://`).
    pub fn with_ca(self, pem: &[u8]) -> Result<AdminUrl, ClientError> {
        let Some((name, _)) = self.tls.clone() else { return Ok(self) };
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(pem) {
            let c = c.map_err(|e| ClientError::Tls(format!("CA: {e}")))?;
            roots.add(c).map_err(|e| ClientError::Tls(format!("CA: {e}")))?;
        }
        if roots.is_empty() {
            return Err(ClientError::Tls("CA: no PEM certificate in it".into()));
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        Ok(AdminUrl { tls: Some((name, Some(connector))), ..self })
    }

    /// Sends `token` as `Authorization: Bearer` with every request.
    pub fn with_token(self, token: Option<String>) -> Result<AdminUrl, ClientError> {
        if token.as_ref().is_some_and(|t| !t.bytes().all(|b| b.is_ascii_graphic())) {
            return Err(ClientError::BadToken);
        }
        Ok(AdminUrl { token, ..self })
    }

    /// `method path` with an empty body: the answer's JSON for a 2xx, else [`ClientError::Refused`].
    pub async fn call(&self, method: &str, path: &str) -> Result<Value, ClientError> {
        let (status, body) = tokio::time::timeout(CALL_LIMIT, self.exchange(method, path))
            .await
            .map_err(|_| self.unreachable(format!("no answer within {CALL_LIMIT:?}")))??;
        let value: Value = serde_json::from_str(&body).map_err(|e| ClientError::Unreadable {
            url: self.url.clone(),
            reason: format!("{status}, not JSON: {e}"),
        })?;
        if (200..300).contains(&status) {
            return Ok(value);
        }
        let message = value["error"].as_str().map_or_else(|| value.to_string(), str::to_string);
        Err(ClientError::Refused { status, message })
    }

    async fn exchange(&self, method: &str, path: &str) -> Result<(u16, String), ClientError> {
        let tcp = TcpStream::connect(&self.authority).await.map_err(|e| self.unreachable(e.to_string()))?;
        let auth = self.token.as_ref().map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n",
            self.authority
        );
        let raw = match &self.tls {
            None => self.send(tcp, &req).await?,
            Some((_, None)) => {
                return Err(ClientError::Tls(format!("{} is https: give its CA with --admin-ca", self.url)));
            }
            Some((name, Some(connector))) => {
                let tls =
                    connector.connect(name.clone(), tcp).await.map_err(|e| self.unreachable(format!("TLS: {e}")))?;
                self.send(tls, &req).await?
            }
        };
        let unreadable = |reason: &str| ClientError::Unreadable { url: self.url.clone(), reason: reason.to_string() };
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| unreadable("no end of headers"))?;
        let head = String::from_utf8_lossy(&raw[..split]).to_string();
        let mut body = raw[split + 4..].to_vec();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| unreadable("no status line"))?;
        let chunked = head.lines().any(|l| {
            l.split_once(':').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("transfer-encoding") && v.trim().eq_ignore_ascii_case("chunked")
            })
        });
        if chunked {
            body = dechunk(&body).ok_or_else(|| unreadable("a broken chunked body"))?;
        }
        let body = String::from_utf8(body).map_err(|_| unreadable("a body that is not UTF-8"))?;
        Ok((status, body))
    }

    /// Writes the request and reads the answer to its end (the server closes the connection).
    async fn send(&self, mut s: impl AsyncRead + AsyncWrite + Unpin, req: &str) -> Result<Vec<u8>, ClientError> {
        s.write_all(req.as_bytes()).await.map_err(|e| self.unreachable(e.to_string()))?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.map_err(|e| self.unreachable(e.to_string()))?;
        Ok(raw)
    }

    fn unreachable(&self, reason: String) -> ClientError {
        ClientError::Unreachable { url: self.url.clone(), reason }
    }
}

/// `s` for a path segment or a query value: unreserved characters as they are, others as `%XX`.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The body of a chunked answer; `None` when it is cut or malformed.
fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&raw[..end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// Rows as columns padded to their widest cell, the first row a header.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r.iter().enumerate().map(|(i, s)| format!("{s:<w$}", w = widths[i])).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `shardline status`, for people.
pub fn render_status(v: &Value) -> String {
    let mut rows = vec![["NAME", "STATUS", "REACHABLE", "VERSION", "ROLES", "SHARDS", "ENTITIES", "ADDRESS"]
        .map(String::from)
        .to_vec()];
    for m in v["members"].as_array().into_iter().flatten() {
        let roles = m["roles"].as_array().map(|r| r.iter().map(text).collect::<Vec<_>>().join(",")).unwrap_or_default();
        rows.push(vec![
            text(&m["name"]),
            text(&m["status"]),
            if m["reachable"] == Value::Bool(true) { "yes".into() } else { "no".into() },
            text(&m["app_version"]),
            if roles.is_empty() { "-".into() } else { roles },
            text(&m["shards"]),
            text(&m["entities"]),
            text(&m["address"]),
        ]);
    }
    let types = v["types"].as_array().map(|t| t.iter().map(text).collect::<Vec<_>>().join(", ")).unwrap_or_default();
    let mut out = format!("leader {} (term {}) · types {types}\n", text(&v["leader"]), text(&v["term"]));
    out.push_str(&table(&rows));
    for m in v["members"].as_array().into_iter().flatten().filter(|m| !m["error"].is_null()) {
        out.push_str(&format!("{} did not answer: {}\n", text(&m["name"]), text(&m["error"])));
    }
    out
}

/// `shardline shards`, for people: shards per node, then every shard.
pub fn render_shards(v: &Value) -> String {
    let shards: Vec<&Value> = v["shards"].as_array().into_iter().flatten().collect();
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for s in &shards {
        *per_node.entry(text(&s["node"])).or_default() += 1;
    }
    let mut out =
        format!("type {} · map version {} · leader {}\n", text(&v["type"]), text(&v["version"]), text(&v["leader"]));
    let mut rows = vec![vec!["NODE".to_string(), "SHARDS".to_string()]];
    rows.extend(per_node.iter().map(|(n, c)| vec![n.clone(), c.to_string()]));
    out.push_str(&table(&rows));
    out.push('\n');
    let mut rows = vec![vec!["SHARD".to_string(), "NODE".to_string(), "EPOCH".to_string()]];
    rows.extend(shards.iter().map(|s| vec![text(&s["shard"]), text(&s["node"]), text(&s["epoch"])]));
    out.push_str(&table(&rows));
    out
}

/// `shardline rebalance`, for people.
pub fn render_rebalancing(v: &Value) -> String {
    format!(
        "type {}: {} · reason {} · moved {} of {}\n",
        text(&v["type"]),
        if v["in_progress"] == Value::Bool(true) { "rebalancing" } else { "settled" },
        text(&v["reason"]),
        text(&v["moved"]),
        text(&v["total"]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_http_or_https_host_port() {
        assert!(AdminUrl::parse("http://127.0.0.1:9090").is_ok());
        assert!(AdminUrl::parse("http://node-1:9090/").is_ok());
        assert!(AdminUrl::parse("https://node-1:9090").is_ok_and(|u| u.tls.is_some()));
        assert!(AdminUrl::parse("https://[::1]:9090").is_ok());
        for bad in
            ["127.0.0.1:9090", "ftp://a:1", "http://a", "http://a:x", "http://a:1/api", "http://:1", "https://:1"]
        {
            assert!(matches!(AdminUrl::parse(bad), Err(ClientError::BadUrl { .. })), "{bad}");
        }
    }

    #[test]
    fn chunked_bodies_are_joined_and_cut_ones_refused() {
        assert_eq!(dechunk(b"3\r\n{\"a\r\n3;x=1\r\n\":1\r\n1\r\n}\r\n0\r\n\r\n").as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(dechunk(b"5\r\nab"), None);
        assert_eq!(dechunk(b"zz\r\n"), None);
    }

    #[test]
    fn names_are_percent_encoded() {
        assert_eq!(encode("node-1"), "node-1");
        assert_eq!(encode("a b/c?d"), "a%20b%2Fc%3Fd");
    }

    #[test]
    fn tables_align_their_columns() {
        let t = table(&[vec!["A".into(), "BB".into()], vec!["ccc".into(), "d".into()]]);
        assert_eq!(t, "A    BB\nccc  d\n");
    }
}
