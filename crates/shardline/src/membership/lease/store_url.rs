//! The address of a coordination store as one URL: `SCHEME://[USER[:PASSWORD]@]HOSTS[?K=V&…]`,
//! where the stores' crates find their credentials and TLS options. Each store says which
//! schemes and options it takes; an option it does not know is an error, never ignored.

use super::store::StoreError;

/// A store's URL, taken apart.
///
/// ```
/// use shardline::membership::lease::StoreUrl;
/// let u = StoreUrl::parse("etcd://root:p%40ss@h1:2379,h2:2379?ca=/etc/ca.pem").unwrap();
/// assert_eq!((u.scheme.as_str(), u.hosts.as_str()), ("etcd", "h1:2379,h2:2379"));
/// assert_eq!((u.user.as_deref(), u.password.as_deref()), (Some("root"), Some("p@ss")));
/// assert_eq!(u.options, vec![("ca".to_string(), "/etc/ca.pem".to_string())]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl {
    /// Before `://`.
    pub scheme: String,
    /// Before `:` in the credentials (all of them without a `:`: a token), decoded.
    pub user: Option<String>,
    /// After `:` in the credentials, decoded.
    pub password: Option<String>,
    /// Between the credentials and the options, as written.
    pub hosts: String,
    /// The `?k=v&…` options, decoded, in order.
    pub options: Vec<(String, String)>,
}

impl StoreUrl {
    /// Takes `url` apart; `%XX` escapes in the credentials and options are decoded (a password
    /// may hold `@`, `:` or `/` that way).
    pub fn parse(url: &str) -> Result<StoreUrl, StoreError> {
        let bad = |reason: String| StoreError::Failed(format!("store url: {reason}"));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("expected SCHEME://HOST:PORT".into()))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (credentials, hosts) = match rest.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, rest),
        };
        if hosts.is_empty() {
            return Err(bad("no host".into()));
        }
        let (user, password) = match credentials.map(|c| c.split_once(':').map_or((c, None), |(u, p)| (u, Some(p)))) {
            None => (None, None),
            Some((u, p)) => (Some(decoded(u).map_err(bad)?), p.map(decoded).transpose().map_err(bad)?),
        };
        let mut options = Vec::new();
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| bad(format!("option {kv:?} has no value")))?;
            options.push((decoded(k).map_err(bad)?, decoded(v).map_err(bad)?));
        }
        Ok(StoreUrl { scheme: scheme.to_string(), user, password, hosts: hosts.to_string(), options })
    }
}

/// `%XX` escapes decoded.
fn decoded(part: &str) -> Result<String, String> {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = part.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            out.push(hex.ok_or_else(|| format!("a broken %-escape in {part:?}"))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{part:?} is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_come_apart_and_broken_ones_are_errors() {
        let u = StoreUrl::parse("nats://tok@h:1").unwrap();
        assert_eq!((u.user.as_deref(), u.password), (Some("tok"), None));
        let u = StoreUrl::parse("nats://h:1").unwrap();
        assert_eq!((u.user, u.hosts.as_str(), u.options.len()), (None, "h:1", 0));
        for bad in ["h:1", "nats://", "nats://u:%4@h:1", "nats://h:1?ca", "nats://u@"] {
            assert!(StoreUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
