//! `Leases`: membership, leader election and self-fencing on a coordination store.
//!
//! - **Membership**: each node holds an ephemeral key `{cluster}/members/{name}`, renewed every
//!   TTL/3. A member whose key vanished stays in the view for `unknown_grace` (not yet fenced),
//!   then is `Down`: its shards may move. A member that deleted its key after a graceful leave is
//!   gone at once.
//! - **Leader**: `{cluster}/leader` is created only if absent, renewed by revision
//!   compare-and-set. Every new leader first takes a strictly larger term from the durable
//!   counter `{cluster}/term` (compare-and-set), so terms never repeat.
//! - **Self-fencing**: a node that has not renewed its key for `ttl − safety_margin`, or failed
//!   `max_failures` renewals in a row, declares itself down: every shard stops before anyone may
//!   take it over. Losing the control plane always means downing yourself.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline_core::{Member, MemberStatus, MembershipView, NodeId};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::shard_maps::ShardMaps;
use super::store::{CoordinationStore, Revision};
use crate::error::ConfigError;
use crate::membership::{
    BoxFuture, ClusterView, Control, ControlHandle, HostingLease, MembershipHandle, MembershipProvider, ProviderContext,
};

/// Settings of lease-based membership.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Lease TTL (default 5 s); keys are renewed every TTL/3.
    pub ttl: Duration,
    /// A node stops its shards when it has not renewed for `ttl − safety_margin` (default 1 s).
    pub safety_margin: Duration,
    /// Failed renewals in a row after which a node downs itself (default 3).
    pub max_failures: u32,
    /// How long a member whose lease vanished stays "unknown" before it is down (default 0:
    /// its own self-fencing already guarantees it stopped).
    pub unknown_grace: Duration,
    /// Numbered membership slots (default off): each node holds the smallest free number under
    /// `{cluster}/slots/`, which orders members for the `Ranges` strategy. A freed number stays
    /// a hole until the next node takes it, so the others keep their places.
    pub numbered_slots: bool,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            ttl: Duration::from_secs(5),
            safety_margin: Duration::from_secs(1),
            max_failures: 3,
            unknown_grace: Duration::ZERO,
            numbered_slots: false,
        }
    }
}

/// Lease-based membership on a coordination store. See the module docs.
pub struct Leases {
    store: Arc<dyn CoordinationStore>,
    cluster: String,
    config: LeaseConfig,
}

impl Leases {
    /// Membership of `cluster` on `store`.
    pub fn new(store: Arc<dyn CoordinationStore>, cluster: impl Into<String>, config: LeaseConfig) -> Self {
        Leases { store, cluster: cluster.into(), config }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct MemberRecord {
    node: NodeId,
    addr: String,
    status: MemberStatus,
    app_version: String,
    roles: Vec<String>,
    weight: u32,
    slot: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct LeaderRecord {
    node: NodeId,
    term: u64,
}

/// A value of the coordination store that cannot be written or read. Never replaced by a
/// default: an empty member record or a term read as 0 (terms would repeat) is worse than
/// skipping the step, which fails safe (a lease not renewed fences this node; a term not taken
/// means no leadership).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseValueError {
    /// Encoding failed; nothing was written.
    #[error("cannot encode the {what}: {reason}")]
    Encode {
        /// What the value is.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A stored value cannot be read.
    #[error("cannot read the {what} at {key}: {reason}")]
    Decode {
        /// What the value is.
        what: &'static str,
        /// Where it is stored.
        key: String,
        /// Why.
        reason: String,
    },
}

/// Encodes a value to write; a failure is logged and counted, and nothing is written.
fn encode<T: Serialize>(what: &'static str, v: &T) -> Result<Vec<u8>, LeaseValueError> {
    postcard::to_allocvec(v).map_err(|e| refused(LeaseValueError::Encode { what, reason: e.to_string() }))
}

fn refused(e: LeaseValueError) -> LeaseValueError {
    warn!(error = %e, "coordination store value refused");
    metrics::counter!("shardline_lease_bad_values_total").increment(1);
    e
}

/// The next leadership term from the stored counter (absent: 1), and the revision to
/// compare-and-set it at (0: create). An unreadable counter is an error, never 0.
pub(crate) fn next_term(key: &str, current: Option<&super::store::Entry>) -> Result<(u64, Revision), LeaseValueError> {
    let Some(e) = current else { return Ok((1, 0)) };
    let last = postcard::from_bytes::<u64>(&e.value).map_err(|err| {
        refused(LeaseValueError::Decode { what: "term counter", key: key.to_string(), reason: err.to_string() })
    })?;
    let next = last.checked_add(1).ok_or_else(|| {
        refused(LeaseValueError::Decode { what: "term counter", key: key.to_string(), reason: "at its maximum".into() })
    })?;
    Ok((next, e.revision))
}

struct Known {
    record: MemberRecord,
    /// When its key was last seen missing (None: present).
    missing_since: Option<Instant>,
}

struct State {
    store: Arc<dyn CoordinationStore>,
    config: LeaseConfig,
    me: MemberRecord,
    member_key: String,
    leader_key: String,
    term_key: String,
    members_prefix: String,
    my_rev: Option<Revision>,
    last_renewed: Instant,
    failures: u32,
    leader: Option<(LeaderRecord, Revision)>,
    leader_renewed: Instant,
    known: BTreeMap<String, Known>,
    fenced: bool,
    lease: HostingLease,
    slots_prefix: String,
    /// This node's slot key's revision (numbered slots).
    slot_rev: Option<Revision>,
}

impl State {
    /// Takes the smallest free slot number, or keeps the one this node holds.
    async fn claim_slot(&mut self) {
        if let (Some(n), Some(rev)) = (self.me.slot, self.slot_rev) {
            let key = format!("{}{n}", self.slots_prefix);
            let Ok(value) = encode("slot holder", &self.me.node) else { return };
            match self.store.refresh(&key, value, rev, self.config.ttl).await {
                Ok(Some(rev)) => {
                    self.slot_rev = Some(rev);
                    return;
                }
                Ok(None) => {
                    warn!(slot = n, "membership slot lost; taking a new one");
                    self.me.slot = None;
                    self.slot_rev = None;
                }
                Err(_) => return,
            }
        }
        let Ok(taken) = self.store.list(&self.slots_prefix).await else { return };
        let taken: std::collections::BTreeSet<u32> =
            taken.iter().filter_map(|e| e.key[self.slots_prefix.len()..].parse().ok()).collect();
        let Ok(holder) = encode("slot holder", &self.me.node) else { return };
        for n in (0..).filter(|n| !taken.contains(n)).take(8) {
            let key = format!("{}{n}", self.slots_prefix);
            if let Ok(Some(rev)) = self.store.create_ephemeral(&key, holder.clone(), self.config.ttl).await {
                info!(slot = n, "membership slot taken");
                self.me.slot = Some(n);
                self.slot_rev = Some(rev);
                return;
            }
        }
    }

    /// Creates or renews this node's member key.
    async fn renew(&mut self) {
        if self.config.numbered_slots && !self.fenced {
            self.claim_slot().await;
        }
        // Not renewed when the record cannot be encoded: the lease lapses and the node fences
        // itself, instead of publishing an empty record.
        let Ok(value) = encode("member record", &self.me) else { return };
        // The store may extend the lease any time during the call: count from its start.
        let sent = Instant::now();
        let r = match self.my_rev {
            None => self.store.create_ephemeral(&self.member_key, value, self.config.ttl).await,
            Some(rev) => self.store.refresh(&self.member_key, value, rev, self.config.ttl).await,
        };
        match r {
            Ok(Some(rev)) => {
                self.my_rev = Some(rev);
                self.last_renewed = sent;
                self.failures = 0;
                if !self.fenced {
                    let until = sent + self.config.ttl.saturating_sub(self.config.safety_margin);
                    self.lease.extend_to(until.into_std());
                }
            }
            Ok(None) if self.my_rev.is_none() => {
                // A previous incarnation's key has not expired yet: wait for it (it fences itself).
                info!(key = %self.member_key, "waiting for the previous incarnation's lease to expire");
            }
            Ok(None) => {
                warn!("this node's membership lease was lost");
                self.fence();
            }
            Err(e) => {
                self.failures += 1;
                warn!(error = %e, failures = self.failures, "cannot renew the membership lease");
            }
        }
        let silent = self.my_rev.is_some()
            && self.last_renewed.elapsed() >= self.config.ttl.saturating_sub(self.config.safety_margin);
        if silent || self.failures >= self.config.max_failures {
            self.fence();
        }
    }

    /// When this node must have stopped its shards unless it renews first.
    fn fence_deadline(&self) -> Instant {
        match self.my_rev {
            Some(_) if !self.fenced => self.last_renewed + self.config.ttl.saturating_sub(self.config.safety_margin),
            _ => Instant::now() + self.config.ttl,
        }
    }

    fn fence(&mut self) {
        self.lease.revoke();
        if !self.fenced {
            warn!("fencing this node: its lease cannot be kept");
            self.fenced = true;
            self.me.status = MemberStatus::Down;
            self.leader = None;
        }
    }

    /// While this node leads: when it must have stopped coordinating unless it renews the
    /// leader key first (the key may expire at `renewed + ttl`, and a successor may take it).
    fn leader_deadline(&self) -> Option<Instant> {
        let leads = self.leader.as_ref().is_some_and(|(l, _)| l.node == self.me.node);
        leads.then(|| self.leader_renewed + self.config.ttl.saturating_sub(self.config.safety_margin))
    }

    /// Gives up leadership whose key was not renewed in time, whatever the member key does: a
    /// store can answer one renewal and not the other.
    fn drop_lapsed_leadership(&mut self) -> bool {
        if self.leader_deadline().is_some_and(|d| Instant::now() >= d) {
            warn!("leadership given up: not renewed in time");
            self.leader = None;
            return true;
        }
        false
    }

    /// Renews leadership, or tries to take it when nobody holds it (members that may lead);
    /// everyone else only reads who leads.
    async fn elect(&mut self) {
        let eligible = !self.fenced
            && self.my_rev.is_some()
            && self.me.status == MemberStatus::Up
            && !self.me.roles.iter().any(|r| r == shardline_core::PROXY_ROLE);
        if let Some((l, rev)) = self.leader.clone() {
            if l.node == self.me.node && !eligible {
                self.leader = None;
                let _ = self.store.delete(&self.leader_key, Some(rev)).await;
                return;
            }
        }
        if let Some((l, rev)) = self.leader.clone() {
            if l.node == self.me.node {
                let sent = Instant::now();
                let Ok(value) = encode("leader record", &l) else { return };
                let refresh = self.store.refresh(&self.leader_key, value, rev, self.config.ttl);
                match tokio::time::timeout_at(self.leader_deadline().unwrap_or(sent), refresh).await {
                    Ok(Ok(Some(rev))) => {
                        self.leader = Some((l, rev));
                        self.leader_renewed = sent;
                    }
                    Ok(Ok(None)) => {
                        warn!("leadership lost");
                        self.leader = None;
                    }
                    Ok(Err(e)) => warn!(error = %e, "cannot renew leadership"),
                    Err(_) => warn!("leadership renewal timed out"),
                }
                self.drop_lapsed_leadership();
                return;
            }
        }
        match self.store.get(&self.leader_key).await {
            Ok(Some(e)) => {
                self.leader = match postcard::from_bytes::<LeaderRecord>(&e.value) {
                    Ok(l) => Some((l, e.revision)),
                    Err(err) => {
                        let what = "leader record";
                        refused(LeaseValueError::Decode { what, key: e.key, reason: err.to_string() });
                        None
                    }
                };
            }
            Ok(None) if !eligible => self.leader = None,
            Ok(None) => {
                // Take a new term, then claim the key.
                let Ok(current) = self.store.get(&self.term_key).await else { return };
                // An unreadable counter: no term, so no leadership, until an operator repairs it.
                let Ok((term, rev)) = next_term(&self.term_key, current.as_ref()) else { return };
                let Ok(counter) = encode("term counter", &term) else { return };
                if !matches!(self.store.compare_and_put(&self.term_key, counter, rev).await, Ok(Some(_))) {
                    return;
                }
                let record = LeaderRecord { node: self.me.node.clone(), term };
                let Ok(value) = encode("leader record", &record) else { return };
                let sent = Instant::now();
                if let Ok(Some(rev)) = self.store.create_ephemeral(&self.leader_key, value, self.config.ttl).await {
                    info!(term, "this node leads the cluster");
                    self.leader = Some((record, rev));
                    self.leader_renewed = sent;
                }
            }
            Err(_) => self.leader = None,
        }
    }

    /// Reads the member list.
    async fn observe(&mut self) {
        let Ok(entries) = self.store.list(&self.members_prefix).await else { return };
        let now = Instant::now();
        let mut present = std::collections::BTreeSet::new();
        for e in entries {
            let record = match postcard::from_bytes::<MemberRecord>(&e.value) {
                Ok(r) => r,
                Err(err) => {
                    refused(LeaseValueError::Decode { what: "member record", key: e.key, reason: err.to_string() });
                    continue;
                }
            };
            present.insert(e.key.clone());
            self.known.insert(e.key, Known { record, missing_since: None });
        }
        // A listing can miss a key that is rewritten while it runs (NATS lists through a
        // consumer, and a refresh replaces the key's only message). Missing means down, at once
        // by default, so confirm every newly missing key with a direct read.
        let newly_missing: Vec<String> = self
            .known
            .iter()
            .filter(|(key, k)| !present.contains(*key) && k.missing_since.is_none())
            .map(|(key, _)| key.clone())
            .collect();
        for key in newly_missing {
            match self.store.get(&key).await {
                Ok(None) => {
                    if let Some(k) = self.known.get_mut(&key) {
                        info!(node = %k.record.node, "member lease gone");
                        k.missing_since = Some(now);
                    }
                }
                Ok(Some(_)) => debug!(%key, "member key missing from a listing but present"),
                // Unknown: decide on the next listing.
                Err(_) => {}
            }
        }
        // Forget members gone for a long time.
        let forget = self.config.ttl * 12;
        self.known.retain(|_, k| k.missing_since.is_none_or(|t| now.duration_since(t) < forget));
    }

    fn view(&self) -> ClusterView {
        let mut view = MembershipView::new();
        let mut addresses = BTreeMap::new();
        let grace = self.config.unknown_grace;
        let mut add = |r: &MemberRecord, status: MemberStatus| {
            let mut m = Member::new(r.node.clone(), r.node.incarnation)
                .with_status(status)
                .with_version(&r.app_version)
                .with_weight(r.weight);
            if let Some(slot) = r.slot {
                m = m.with_slot(slot);
            }
            for role in &r.roles {
                m = m.with_role(role.clone());
            }
            let _ = view.add(m);
            if let Ok(a) = r.addr.parse() {
                addresses.insert(r.node.clone(), a);
            }
        };
        for k in self.known.values() {
            if k.record.node == self.me.node {
                continue;
            }
            let status = match k.missing_since {
                None => k.record.status,
                // Left gracefully: gone at once. Otherwise unknown for the grace period, then down.
                Some(_)
                    if matches!(
                        k.record.status,
                        MemberStatus::Leaving | MemberStatus::Exiting | MemberStatus::Removed
                    ) =>
                {
                    MemberStatus::Down
                }
                Some(t) if t.elapsed() < grace => k.record.status,
                Some(_) => MemberStatus::Down,
            };
            add(&k.record, status);
        }
        add(&self.me, self.me.status);
        let leader = self.leader.as_ref().map(|(l, _)| (l.node.clone(), l.term)).filter(|(n, _)| !view.is_fenced(n));
        let _ = view.set_leader(leader.as_ref().map(|(n, _)| n.clone()));
        ClusterView { view, leader, addresses }
    }
}

impl MembershipProvider for Leases {
    fn start(self: Box<Self>, ctx: ProviderContext) -> BoxFuture<'static, Result<MembershipHandle, ConfigError>> {
        Box::pin(async move {
            if self.config.ttl < Duration::from_millis(300) || self.config.safety_margin >= self.config.ttl {
                return Err(ConfigError::Invalid {
                    name: "ttl",
                    reason: "ttl must be ≥ 300 ms and larger than the safety margin".into(),
                });
            }
            let name = ctx.me.name.to_string();
            let me = MemberRecord {
                node: ctx.me.clone(),
                addr: ctx.addr.to_string(),
                status: MemberStatus::Up,
                app_version: ctx.app_version.clone(),
                roles: ctx.roles.clone(),
                weight: ctx.weight,
                slot: None,
            };
            let c = &self.cluster;
            let maps = ShardMaps::new(self.store.clone(), c);
            let mut state = State {
                store: self.store.clone(),
                config: self.config.clone(),
                me,
                member_key: format!("{c}/members/{name}"),
                leader_key: format!("{c}/leader"),
                term_key: format!("{c}/term"),
                members_prefix: format!("{c}/members/"),
                my_rev: None,
                last_renewed: Instant::now(),
                failures: 0,
                leader: None,
                leader_renewed: Instant::now(),
                known: BTreeMap::new(),
                fenced: false,
                lease: HostingLease::new(),
                slots_prefix: format!("{c}/slots/"),
                slot_rev: None,
            };
            // The store must answer at start: a backend that is down is a clear error.
            state.store.list(&state.members_prefix).await.map_err(|e| ConfigError::Membership(e.to_string()))?;
            state.renew().await;
            state.elect().await;
            state.observe().await;
            let (view_tx, views) = watch::channel(state.view());
            let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
            let transport = ctx.transport.clone();
            let lease = state.lease.clone();
            drop(ctx);
            tokio::spawn(run(state, view_tx, ctl_rx, transport));
            Ok(MembershipHandle {
                views,
                control: Arc::new(ControlHandle(ctl_tx)),
                lease: Some(lease),
                maps: Some(maps),
            })
        })
    }
}

async fn run(
    mut state: State,
    view_tx: watch::Sender<ClusterView>,
    mut ctl: mpsc::UnboundedReceiver<Control>,
    transport: crate::transport::Transport,
) {
    let period = state.config.ttl / 3;
    let observe_every = (state.config.ttl / 25).max(Duration::from_millis(50));
    let mut renew_at = Instant::now() + period;
    loop {
        // No store call may outlive the fencing deadline: a store that hangs must not keep this
        // node hosting past the point where its lease could be taken over.
        let mut wake = renew_at.min(Instant::now() + observe_every).min(state.fence_deadline());
        if let Some(d) = state.leader_deadline() {
            wake = wake.min(d);
        }
        tokio::select! {
            c = ctl.recv() => match c {
                Some(Control::Leave) => {
                    state.me.status = MemberStatus::Leaving;
                    renew_at = Instant::now();
                }
                Some(Control::Exit) => {
                    state.me.status = MemberStatus::Removed;
                    if let Some(rev) = state.my_rev.take() {
                        let _ = tokio::time::timeout(state.config.ttl, state.store.delete(&state.member_key, Some(rev))).await;
                    }
                    if let Some((l, rev)) = state.leader.take() {
                        if l.node == state.me.node {
                            let _ = tokio::time::timeout(state.config.ttl, state.store.delete(&state.leader_key, Some(rev))).await;
                        }
                    }
                    if let (Some(n), Some(rev)) = (state.me.slot, state.slot_rev.take()) {
                        let key = format!("{}{n}", state.slots_prefix);
                        let _ = tokio::time::timeout(state.config.ttl, state.store.delete(&key, Some(rev))).await;
                    }
                    state.fenced = true;
                }
                Some(Control::Halt) | None => return,
            },
            _ = tokio::time::sleep_until(wake) => {}
        }
        if Instant::now() >= state.fence_deadline() {
            state.fence();
            publish(&state, &view_tx, &transport);
        }
        if state.drop_lapsed_leadership() {
            publish(&state, &view_tx, &transport);
        }
        if !state.fenced && Instant::now() >= renew_at {
            let d = state.fence_deadline();
            if tokio::time::timeout_at(d, state.renew()).await.is_err() {
                state.fence();
            }
            if state.fenced {
                publish(&state, &view_tx, &transport);
            }
            let d = state.fence_deadline();
            if tokio::time::timeout_at(d, state.elect()).await.is_err() {
                state.fence();
            }
            renew_at = Instant::now() + period;
        }
        if state.fenced {
            // Stop the shards now, not after the next (possibly slow) read of the store.
            publish(&state, &view_tx, &transport);
        }
        // A slow listing must not hold up the next renewal: it only delays what this node sees.
        // The fencing deadline is checked at the top of the loop.
        let reads_until = state.fence_deadline().min(renew_at);
        let _ = tokio::time::timeout_at(reads_until, state.observe()).await;
        // Followers watch the leader key closely, so a dead leader is replaced soon after its
        // lease lapses; the leader renews on its own schedule above.
        // (Not cut off at the next renewal: an election cut off between creating the leader key
        // and reading the answer would leave a key naming this node that it does not know of.)
        if !state.fenced && state.leader.as_ref().is_none_or(|(l, _)| l.node != state.me.node) {
            let d = state.fence_deadline();
            if tokio::time::timeout_at(d, state.elect()).await.is_err() {
                state.fence();
            }
        }
        publish(&state, &view_tx, &transport);
    }
}

/// Sends the current view to the node (when it changed).
fn publish(state: &State, view_tx: &watch::Sender<ClusterView>, transport: &crate::transport::Transport) {
    let v = state.view();
    for (n, a) in &v.addresses {
        if !v.is_fenced(n) {
            transport.set_address(n, *a);
        }
    }
    view_tx.send_if_modified(|old| {
        if *old != v {
            *old = v;
            true
        } else {
            false
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::lease::Entry;

    fn entry(value: Vec<u8>) -> Entry {
        Entry { key: "c/term".into(), value, revision: 7 }
    }

    #[test]
    fn the_next_term_comes_from_a_readable_counter_only() {
        assert_eq!(next_term("c/term", None), Ok((1, 0)));
        let four = postcard::to_allocvec(&4u64).unwrap();
        assert_eq!(next_term("c/term", Some(&entry(four))), Ok((5, 7)));
        // Garbage, or nothing, is an error naming the key: never term 1 again.
        for bad in [vec![], vec![0xff; 11]] {
            let err = next_term("c/term", Some(&entry(bad))).unwrap_err();
            assert!(matches!(&err, LeaseValueError::Decode { key, .. } if key == "c/term"), "{err:?}");
        }
        let max = postcard::to_allocvec(&u64::MAX).unwrap();
        assert!(next_term("c/term", Some(&entry(max))).is_err());
    }
}
