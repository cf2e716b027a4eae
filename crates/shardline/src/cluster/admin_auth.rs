//! Who may change the cluster through another node: drain, rebalance and shard assignments that
//! travel as cluster messages.
//!
//! Any node answers an operator for the whole cluster (see [`admin`](super::admin)), so a request
//! that changes something reaches the node that acts on it as a cluster message. Without TLS,
//! anyone who knows the cluster's name can connect as a peer; answered for any peer, such messages
//! would bypass the admin API's token. A node takes one only when
//! - it carries a tag (HMAC-SHA256) made with the cluster's admin secret, which every node is
//!   given ([`ClusterBuilder::admin_secret`](crate::ClusterBuilder::admin_secret); `shardline
//!   node` gives its admin token), over the cluster's name, both nodes' names, the time it was
//!   made and the request, made within [`SIGNED_FOR`] of the receiver's clock; or
//! - peers are authenticated by mutual TLS, which admits only nodes the cluster's CA certified
//!   (then no tag is made or checked).
//!
//! This closes the admin messages only. Without TLS, a peer that joins by the cluster's name
//! takes part in the sharding protocol like any member (it is given shards, and it can send
//! regions coordinator messages); what authenticates members is TLS.
//!
//! Questions that change nothing (what a member hosts, shard maps, rebalancing status) stay open
//! to peers. A tag is taken once: the node remembers the tags it admitted while they are within
//! [`SIGNED_FOR`], so a request recorded off the network and sent again is refused. (Recording it
//! still shows what was asked: against that, use TLS.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;
use shardline_core::NodeId;

use super::admin::{AdminError, AdminQuery};

/// How far a tag's time may be from the receiver's clock.
pub(crate) const SIGNED_FOR: Duration = Duration::from_secs(60);

/// A node's rules for admin requests between nodes.
pub(crate) struct AdminAuth {
    cluster: String,
    secret: Option<hmac::Key>,
    peers_certified: bool,
    /// Tags admitted, with their time, while a replay of them would pass the clock check.
    admitted: Mutex<HashMap<Vec<u8>, u64>>,
    /// The time of the last tag made: each is later than the one before, so two requests made
    /// within a millisecond (a drain repeated) have two tags, not one the receiver takes as a
    /// replay.
    last_sealed: AtomicU64,
}

impl AdminAuth {
    pub(crate) fn new(cluster: &str, secret: Option<&[u8]>, peers_certified: bool) -> Self {
        AdminAuth {
            cluster: cluster.to_string(),
            secret: secret.map(|s| hmac::Key::new(hmac::HMAC_SHA256, s)),
            peers_certified,
            admitted: Mutex::new(HashMap::new()),
            last_sealed: AtomicU64::new(0),
        }
    }

    /// What `from` sends `to` for `query`: a request that changes something goes with a tag
    /// when this node has the secret.
    pub(crate) fn seal(&self, from: &NodeId, to: &NodeId, query: AdminQuery) -> Result<AdminQuery, AdminError> {
        // Certified peers need no tag (and a tag of another secret must not refuse them).
        let Some(key) = self.secret.as_ref().filter(|_| query.changes() && !self.peers_certified) else {
            return Ok(query);
        };
        let body = postcard::to_allocvec(&query).map_err(|e| AdminError::Invalid(format!("cannot encode: {e}")))?;
        let now = now_ms();
        let later = |prev: u64| now.max(prev + 1);
        let at_ms = match self.last_sealed.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| Some(later(p))) {
            Ok(prev) | Err(prev) => later(prev),
        };
        let tag = hmac::sign(key, &self.signed_bytes(from, to, at_ms, &body)).as_ref().to_vec();
        Ok(AdminQuery::Signed { at_ms, query: body, tag })
    }

    /// The request `from` sent to `me`, if it may be answered.
    pub(crate) fn admit(&self, from: &NodeId, me: &NodeId, query: AdminQuery) -> Result<AdminQuery, AdminError> {
        let AdminQuery::Signed { at_ms, query: body, tag } = query else {
            if !query.changes() || self.peers_certified {
                return Ok(query);
            }
            return Err(AdminError::Unauthorized(format!(
                "{from} sent a request that changes the cluster without the admin secret's tag, and peers are not \
                 certified (no TLS): give every node the same admin token, or TLS"
            )));
        };
        if !self.peers_certified {
            let Some(key) = &self.secret else {
                return Err(AdminError::Unauthorized(format!(
                    "{me} has no admin secret to check {from}'s request with: give every node the same admin token"
                )));
            };
            if hmac::verify(key, &self.signed_bytes(from, me, at_ms, &body), &tag).is_err() {
                return Err(AdminError::Unauthorized(format!(
                    "{from}'s request carries a tag this node's admin secret did not make"
                )));
            }
            let now = now_ms();
            let skew = Duration::from_millis(now.abs_diff(at_ms));
            if skew > SIGNED_FOR {
                return Err(AdminError::Unauthorized(format!(
                    "{from}'s request was signed {skew:?} away from this node's clock (at most {SIGNED_FOR:?} either way)"
                )));
            }
            // Only tags this node's secret made get here, so the set grows with real requests only.
            let mut admitted = self.admitted.lock().unwrap_or_else(|p| p.into_inner());
            let window = SIGNED_FOR.as_millis() as u64;
            admitted.retain(|_, at| at.saturating_add(window) >= now);
            if admitted.insert(tag, at_ms).is_some() {
                return Err(AdminError::Unauthorized(format!(
                    "{from}'s request was admitted once already: a replay is refused"
                )));
            }
        }
        match postcard::from_bytes::<AdminQuery>(&body) {
            Ok(AdminQuery::Signed { .. }) => Err(AdminError::Invalid("a signed request inside another".into())),
            Ok(inner) => Ok(inner),
            Err(e) => Err(AdminError::Invalid(format!("unreadable signed request: {e}"))),
        }
    }

    fn signed_bytes(&self, from: &NodeId, to: &NodeId, at_ms: u64, body: &[u8]) -> Vec<u8> {
        let mut m = b"shardline-admin/1\0".to_vec();
        for part in [self.cluster.as_bytes(), from.name.as_bytes(), to.name.as_bytes()] {
            m.extend_from_slice(&(part.len() as u64).to_le_bytes());
            m.extend_from_slice(part);
        }
        m.extend_from_slice(&from.incarnation.to_le_bytes());
        m.extend_from_slice(&to.incarnation.to_le_bytes());
        m.extend_from_slice(&at_ms.to_le_bytes());
        m.extend_from_slice(body);
        m
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> NodeId {
        NodeId::new(name, 7)
    }

    #[test]
    fn only_requests_tagged_with_the_same_secret_change_the_cluster() {
        let (a, b) = (node("a"), node("b"));
        let keyed = AdminAuth::new("c", Some(b"0123456789abcdef"), false);
        let sealed = keyed.seal(&a, &b, AdminQuery::Drain).unwrap();
        assert!(matches!(sealed, AdminQuery::Signed { .. }));
        assert!(matches!(keyed.admit(&a, &b, sealed.clone()), Ok(AdminQuery::Drain)));
        // The same request again (recorded off the network): refused. The same request made again
        // at once has a tag of its own.
        let replay = keyed.admit(&a, &b, sealed.clone());
        assert!(matches!(&replay, Err(AdminError::Unauthorized(why)) if why.contains("replay")), "{replay:?}");
        for _ in 0..3 {
            let again = keyed.seal(&a, &b, AdminQuery::Drain).unwrap();
            assert!(matches!(keyed.admit(&a, &b, again), Ok(AdminQuery::Drain)));
        }
        // Unsigned, another secret, another receiver, another cluster: refused.
        assert!(matches!(keyed.admit(&a, &b, AdminQuery::Drain), Err(AdminError::Unauthorized(_))));
        let other = AdminAuth::new("c", Some(b"fedcba9876543210"), false);
        assert!(matches!(other.admit(&a, &b, sealed.clone()), Err(AdminError::Unauthorized(_))));
        assert!(matches!(keyed.admit(&a, &node("x"), sealed.clone()), Err(AdminError::Unauthorized(_))));
        let elsewhere = AdminAuth::new("d", Some(b"0123456789abcdef"), false);
        assert!(matches!(elsewhere.admit(&a, &b, sealed.clone()), Err(AdminError::Unauthorized(_))));
        // A changed request under the old tag: refused.
        let AdminQuery::Signed { at_ms, tag, .. } = sealed else { unreachable!() };
        let rebalance =
            postcard::to_allocvec(&AdminQuery::Rebalance { type_key: shardline_core::TypeKey::new("t") }).unwrap();
        let forged = AdminQuery::Signed { at_ms, query: rebalance, tag: tag.clone() };
        assert!(matches!(keyed.admit(&a, &b, forged), Err(AdminError::Unauthorized(_))));
        // An old one: refused.
        let old = at_ms - SIGNED_FOR.as_millis() as u64 - 1_000;
        let body = postcard::to_allocvec(&AdminQuery::Drain).unwrap();
        let tag = hmac::sign(keyed.secret.as_ref().unwrap(), &keyed.signed_bytes(&a, &b, old, &body)).as_ref().to_vec();
        let stale = AdminQuery::Signed { at_ms: old, query: body, tag };
        assert!(matches!(keyed.admit(&a, &b, stale), Err(AdminError::Unauthorized(_))));
        // Questions that change nothing stay open; without a secret or TLS, changes are refused.
        let open = AdminAuth::new("c", None, false);
        assert!(open.admit(&a, &b, AdminQuery::Hosting).is_ok());
        assert!(matches!(open.admit(&a, &b, AdminQuery::Drain), Err(AdminError::Unauthorized(_))));
        // With mutual TLS, peers are the cluster's nodes: no tag is made, and one made with
        // another secret (a node given another token) does not refuse them.
        assert!(AdminAuth::new("c", None, true).admit(&a, &b, AdminQuery::Drain).is_ok());
        let certified = AdminAuth::new("c", Some(b"0123456789abcdef"), true);
        assert!(matches!(certified.seal(&a, &b, AdminQuery::Drain), Ok(AdminQuery::Drain)));
        let tagged = other.seal(&a, &b, AdminQuery::Drain).unwrap();
        assert!(matches!(certified.admit(&a, &b, tagged), Ok(AdminQuery::Drain)));
    }
}
