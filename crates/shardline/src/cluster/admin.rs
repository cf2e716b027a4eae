//! What an operator asks of the cluster through any node: who is in it and what each member
//! hosts, a type's shard map and rebalancing status, a rebalance now, a node drained.
//!
//! Any node answers, as Akka Management's and the Orleans dashboard's endpoints do: the shard map
//! and the rebalancing status live in the leader's coordinator, so a node that does not lead asks
//! the leader; what a member hosts is known only to that member, so `cluster_status` asks each
//! one. The questions travel on the nodes' own connections ([`PeerMessage::Admin`]), answered like
//! a remote ask, so the admin API needs no address book of its own. A member that does not answer
//! within [`ANSWER_LIMIT`] is reported as such, never as hosting nothing.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline_core::{MemberStatus, NodeId, RebalanceReason, RebalancingStatus, TypeKey};
use tokio::sync::oneshot;
use tracing::{info, warn};

use super::Cluster;
use crate::error::Error;
use crate::sharding::coordinator::Coordinator;
use crate::sharding::message::{send_reply, PeerMessage};
use crate::Hosting;

/// How long a node waits for another node's answer.
pub(crate) const ANSWER_LIMIT: Duration = Duration::from_secs(3);

/// How long a drained node may take to hand its shards off.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// Why an operator's question or request was not answered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum AdminError {
    /// No entity type of that name is registered on the node that answered.
    #[error("no entity type {0:?} is registered")]
    UnknownType(String),
    /// No member of that name is in the cluster (or it is down or removed already).
    #[error("no member named {0:?} is in the cluster")]
    UnknownNode(String),
    /// The node leaves already (a second drain).
    #[error("{0} is leaving already")]
    AlreadyLeaving(String),
    /// Nobody leads yet, or leadership is moving: ask again shortly.
    #[error("no leader: {0}")]
    NoLeader(String),
    /// The request itself is wrong (a shard out of range, a node that is not `Up`, a type that
    /// does not take assignments).
    #[error("{0}")]
    Invalid(String),
    /// The member did not answer (down, unreachable, too slow).
    #[error("{node} did not answer: {reason}")]
    NoAnswer {
        /// The member asked.
        node: String,
        /// What happened.
        reason: String,
    },
    /// A request that changes the cluster came from another node without proof that an
    /// operator sent it (see [`ClusterBuilder::admin_secret`](crate::ClusterBuilder::admin_secret)).
    /// Last, so that the variants before it keep their place on the wire.
    #[error("not authorized: {0}")]
    Unauthorized(String),
}

/// The cluster as one node sees it; see [`Cluster::cluster_status`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The node that answered.
    pub node: String,
    /// The member whose coordinators run, if any.
    pub leader: Option<String>,
    /// The leader's term (0 without a leader).
    pub term: u64,
    /// The entity types registered on the node that answered, sorted.
    pub types: Vec<String>,
    /// Every member this node's view holds, oldest first.
    pub members: Vec<MemberReport>,
}

/// One member of a [`ClusterStatus`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberReport {
    /// Its name.
    pub name: String,
    /// Its incarnation (changes at every start).
    pub incarnation: u64,
    /// Where it is in its lifecycle.
    pub status: MemberStatus,
    /// Whether this node reaches it.
    pub reachable: bool,
    /// The application version it runs.
    pub app_version: String,
    /// Its roles.
    pub roles: Vec<String>,
    /// Its cluster address, if known.
    pub address: Option<String>,
    /// Shards it hosts, all types together; `None` when it did not answer (see `error`).
    pub shards: Option<u64>,
    /// Entities it holds in memory, all types together; `None` when it did not answer.
    pub entities: Option<u64>,
    /// Why `shards` and `entities` are missing.
    pub error: Option<String>,
}

/// The shard map of one type, as its coordinator has it; see [`Cluster::shard_map`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMapReport {
    /// The entity type.
    #[serde(rename = "type")]
    pub type_key: String,
    /// The map's version (grows at every change).
    pub version: u64,
    /// The leader whose coordinator answered.
    pub leader: String,
    /// Every shard, in order.
    pub shards: Vec<ShardReport>,
}

/// One shard of a [`ShardMapReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardReport {
    /// The shard number.
    pub shard: u32,
    /// Its owner's name; `None` while it has none.
    pub node: Option<String>,
    /// The epoch of its allocation, `term.seq`.
    pub epoch: String,
}

/// A type's running (or last) rebalance round; see [`Cluster::rebalancing`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebalancingReport {
    /// The entity type.
    #[serde(rename = "type")]
    pub type_key: String,
    /// Whether a round is running.
    pub in_progress: bool,
    /// Why the round started (`membership`, `periodic`, `strategy`, `requested`); `None` before
    /// the first round of this leader.
    pub reason: Option<String>,
    /// Shards the round has moved so far.
    pub moved: usize,
    /// Hand-offs the round planned.
    pub total: usize,
    /// Shards moved by this leader's rounds, all together.
    pub moved_since_leading: u64,
    /// Rounds this leader completed.
    pub rounds: u64,
}

/// A question or request of the admin API to one node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum AdminQuery {
    /// What do you host? (any member)
    Hosting,
    /// A type's shard map (the leader).
    ShardMap { type_key: TypeKey },
    /// A type's rebalancing status (the leader).
    Rebalancing { type_key: TypeKey },
    /// Plan a rebalance of a type now (the leader).
    Rebalance { type_key: TypeKey },
    /// New external assignments of a type, (shard, node name) (the leader).
    Assign { type_key: TypeKey, assignments: Vec<(u32, String)> },
    /// Leave the cluster gracefully (the node to drain).
    Drain,
    /// A request that changes the cluster, encoded, with the tag of the cluster's admin secret
    /// (see [`admin_auth`](super::admin_auth)).
    Signed { at_ms: u64, query: Vec<u8>, tag: Vec<u8> },
}

impl AdminQuery {
    /// Whether answering it changes the cluster.
    pub(crate) fn changes(&self) -> bool {
        match self {
            AdminQuery::Hosting | AdminQuery::ShardMap { .. } | AdminQuery::Rebalancing { .. } => false,
            AdminQuery::Rebalance { .. }
            | AdminQuery::Assign { .. }
            | AdminQuery::Drain
            | AdminQuery::Signed { .. } => true,
        }
    }
}

/// The answer to an [`AdminQuery`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum AdminAnswer {
    Hosting(Vec<Hosting>),
    ShardMap(ShardMapReport),
    Rebalancing(RebalancingReport),
    Draining,
}

type Answered = Result<AdminAnswer, AdminError>;

impl Cluster {
    /// The members this node's view holds, with what each hosts, asked of each (concurrently, each
    /// within 3 s).
    pub async fn cluster_status(&self) -> ClusterStatus {
        let view = self.view();
        let mut members: Vec<_> = view.view.members().cloned().collect();
        members.sort_by_key(|m| m.up_number);
        let mut asks = tokio::task::JoinSet::new();
        for (i, m) in members.iter().enumerate() {
            let (cluster, node) = (self.clone(), m.node.clone());
            asks.spawn(async move { (i, cluster.ask_node(&node, AdminQuery::Hosting).await) });
        }
        let mut hosting = vec![None; members.len()];
        while let Some(done) = asks.join_next().await {
            if let Ok((i, answer)) = done {
                hosting[i] = Some(answer);
            }
        }
        let members = members
            .into_iter()
            .zip(hosting)
            .map(|(m, answer)| {
                let (shards, entities, error) = match answer {
                    Some(Ok(AdminAnswer::Hosting(h))) => (
                        Some(h.iter().map(|h| h.shards as u64).sum()),
                        Some(h.iter().map(|h| h.entities as u64).sum()),
                        None,
                    ),
                    Some(Ok(_)) => (None, None, Some("answered another question".to_string())),
                    Some(Err(e)) => (None, None, Some(e.to_string())),
                    None => (None, None, Some("the question was lost".to_string())),
                };
                MemberReport {
                    name: m.node.name.to_string(),
                    incarnation: m.node.incarnation,
                    status: m.status,
                    reachable: view.view.is_reachable(&m.node),
                    app_version: m.app_version.0.to_string(),
                    roles: m.roles.iter().cloned().collect(),
                    address: view.addresses.get(&m.node).map(|a| a.to_string()),
                    shards,
                    entities,
                    error,
                }
            })
            .collect();
        ClusterStatus {
            node: self.node_id().name.to_string(),
            leader: view.leader.as_ref().map(|(n, _)| n.name.to_string()),
            term: view.leader.as_ref().map_or(0, |(_, t)| *t),
            types: self.type_keys(),
            members,
        }
    }

    /// The shard map of `type_key`, from the leader's coordinator.
    pub async fn shard_map(&self, type_key: &str) -> Result<ShardMapReport, AdminError> {
        match self.ask_leader(AdminQuery::ShardMap { type_key: self.known_type(type_key)? }).await? {
            AdminAnswer::ShardMap(m) => Ok(m),
            other => Err(self.strange(other)),
        }
    }

    /// The running (or last) rebalance round of `type_key`, from the leader's coordinator.
    pub async fn rebalancing(&self, type_key: &str) -> Result<RebalancingReport, AdminError> {
        match self.ask_leader(AdminQuery::Rebalancing { type_key: self.known_type(type_key)? }).await? {
            AdminAnswer::Rebalancing(r) => Ok(r),
            other => Err(self.strange(other)),
        }
    }

    /// Asks the leader's coordinator of `type_key` to plan a rebalance now rather than at its next
    /// periodic check; returns the status right after planning.
    pub async fn rebalance(&self, type_key: &str) -> Result<RebalancingReport, AdminError> {
        match self.ask_leader(AdminQuery::Rebalance { type_key: self.known_type(type_key)? }).await? {
            AdminAnswer::Rebalancing(r) => Ok(r),
            other => Err(self.strange(other)),
        }
    }

    /// Gives shards of `type_key`, a type with the `External` strategy, to the named members:
    /// (shard number, node name) pairs, on top of those given before. The leader checks them
    /// (every shard in range, every node a member that may host now: otherwise nothing is taken,
    /// [`AdminError::Invalid`]) and moves the shards by the usual hand-off.
    ///
    /// The assignments live in the leader's coordinator: a new leader keeps the map as it finds
    /// it and places only shards left without a home, until it is given assignments again.
    pub async fn assign_shards(
        &self,
        type_key: &str,
        assignments: Vec<(u32, String)>,
    ) -> Result<RebalancingReport, AdminError> {
        if assignments.is_empty() {
            return Err(AdminError::Invalid("no assignments".into()));
        }
        match self.ask_leader(AdminQuery::Assign { type_key: self.known_type(type_key)?, assignments }).await? {
            AdminAnswer::Rebalancing(r) => Ok(r),
            other => Err(self.strange(other)),
        }
    }

    /// Starts the graceful leave of the member named `name` (this node or another), as if it had
    /// been sent SIGTERM: it hands its shards off and leaves. Returns once the leave has started;
    /// [`Cluster::left`] on that node resolves when it is over.
    pub async fn drain(&self, name: &str) -> Result<(), AdminError> {
        let view = self.view();
        let node = view
            .view
            .members()
            .find(|m| &*m.node.name == name && !m.status.is_fenced())
            .map(|m| m.node.clone())
            .ok_or_else(|| AdminError::UnknownNode(name.to_string()))?;
        match self.ask_node(&node, AdminQuery::Drain).await? {
            AdminAnswer::Draining => Ok(()),
            other => Err(self.strange(other)),
        }
    }

    /// The names of the entity types registered on this node, sorted.
    pub fn type_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.regions().iter().map(|r| r.settings().type_key.clone()).collect();
        keys.sort();
        keys
    }

    /// Answers a question another node asked of this one. One that cannot be read is refused as
    /// not processed, never dropped.
    pub(super) fn answer_admin(&self, from: &NodeId, req_id: u64, query: &[u8]) {
        let body = match postcard::from_bytes::<AdminQuery>(query) {
            Ok(q) => {
                let answered = self.inner.admin_auth.admit(from, self.node_id(), q).and_then(|q| self.answer(q));
                if let Err(AdminError::Unauthorized(why)) = &answered {
                    warn!(peer = %from, %why, "admin request refused");
                }
                postcard::to_allocvec(&answered).map_err(|e| Error::Rejected(format!("cannot encode the answer: {e}")))
            }
            Err(e) => {
                warn!(peer = %from, error = %e, "unreadable admin question: refused");
                Err(Error::Rejected(format!("unreadable admin question: {e}")))
            }
        };
        send_reply(self.transport(), from, req_id, body);
    }

    fn answer(&self, query: AdminQuery) -> Answered {
        match query {
            AdminQuery::Hosting => Ok(AdminAnswer::Hosting(self.hosting())),
            AdminQuery::ShardMap { type_key } => {
                let c = self.local_coordinator(&type_key)?;
                let map = c.map().ok_or_else(|| AdminError::NoLeader("the coordinator is still starting".into()))?;
                Ok(AdminAnswer::ShardMap(ShardMapReport {
                    type_key: type_key.to_string(),
                    version: map.version(),
                    leader: self.node_id().name.to_string(),
                    shards: map
                        .iter()
                        .map(|(shard, slot)| ShardReport {
                            shard: shard.0,
                            node: slot.owner.as_ref().map(|o| o.name.to_string()),
                            epoch: slot.epoch.to_string(),
                        })
                        .collect(),
                }))
            }
            AdminQuery::Rebalancing { type_key } => {
                let c = self.local_coordinator(&type_key)?;
                Ok(AdminAnswer::Rebalancing(report(&type_key, &c.rebalancing())))
            }
            AdminQuery::Rebalance { type_key } => {
                let c = self.local_coordinator(&type_key)?;
                info!(%type_key, "rebalance requested by an operator");
                c.request_rebalance();
                Ok(AdminAnswer::Rebalancing(report(&type_key, &c.rebalancing())))
            }
            AdminQuery::Assign { type_key, assignments } => {
                let c = self.local_coordinator(&type_key)?;
                c.assign(&assignments).map_err(AdminError::Invalid)?;
                Ok(AdminAnswer::Rebalancing(report(&type_key, &c.rebalancing())))
            }
            AdminQuery::Signed { .. } => Err(AdminError::Invalid("a signed request is answered once admitted".into())),
            AdminQuery::Drain => {
                if !self.begin_leave() {
                    return Err(AdminError::AlreadyLeaving(self.node_id().name.to_string()));
                }
                info!(node = %self.node_id(), "drain requested by an operator: leaving");
                let me = self.clone();
                tokio::spawn(async move { me.run_leave(DRAIN_LIMIT).await });
                Ok(AdminAnswer::Draining)
            }
        }
    }

    fn known_type(&self, type_key: &str) -> Result<TypeKey, AdminError> {
        let key = TypeKey::new(type_key);
        match self.inner.types.region(&key) {
            Some(_) => Ok(key),
            None => Err(AdminError::UnknownType(type_key.to_string())),
        }
    }

    fn local_coordinator(&self, type_key: &TypeKey) -> Result<std::sync::Arc<Coordinator>, AdminError> {
        if self.inner.types.region(type_key).is_none() {
            return Err(AdminError::UnknownType(type_key.to_string()));
        }
        let c = self.inner.types.coordinator(type_key);
        c.ok_or_else(|| AdminError::NoLeader(format!("{} does not lead (any more)", self.node_id().name)))
    }

    async fn ask_leader(&self, query: AdminQuery) -> Answered {
        let leader =
            self.view().leader.map(|(n, _)| n).ok_or_else(|| AdminError::NoLeader("nobody leads yet".into()))?;
        self.ask_node(&leader, query).await
    }

    /// Asks `node` (this one included), within [`ANSWER_LIMIT`].
    async fn ask_node(&self, node: &NodeId, query: AdminQuery) -> Answered {
        if node == self.node_id() {
            return self.answer(query);
        }
        let no_answer = |reason: String| AdminError::NoAnswer { node: node.name.to_string(), reason };
        let query = self.inner.admin_auth.seal(self.node_id(), node, query)?;
        let query = postcard::to_allocvec(&query).map_err(|e| no_answer(format!("cannot encode the question: {e}")))?;
        let (tx, rx) = oneshot::channel::<Result<Answered, Error>>();
        let req_id = self.inner.node.pending().register(tx);
        if let Err(e) = self.transport().send(node, PeerMessage::Admin { req_id, query }) {
            self.inner.node.pending().complete(req_id, Err(Error::Unavailable(String::new())));
            return Err(no_answer(format!("cannot send: {}", e.reason())));
        }
        match tokio::time::timeout(ANSWER_LIMIT, rx).await {
            Ok(Ok(Ok(answered))) => answered,
            Ok(Ok(Err(e))) => Err(no_answer(e.to_string())),
            Ok(Err(_)) => Err(no_answer("the answer was lost".into())),
            Err(_) => Err(no_answer(format!("nothing within {ANSWER_LIMIT:?}"))),
        }
    }

    fn strange(&self, answer: AdminAnswer) -> AdminError {
        warn!(?answer, "an admin question got the answer to another");
        AdminError::NoAnswer { node: "?".into(), reason: "answered another question".into() }
    }
}

fn report(type_key: &TypeKey, s: &RebalancingStatus) -> RebalancingReport {
    RebalancingReport {
        type_key: type_key.to_string(),
        in_progress: s.in_progress,
        reason: s.reason.map(|r| {
            match r {
                RebalanceReason::Membership => "membership",
                RebalanceReason::Periodic => "periodic",
                RebalanceReason::Strategy => "strategy",
                RebalanceReason::Requested => "requested",
            }
            .to_string()
        }),
        moved: s.moved,
        total: s.planned,
        moved_since_leading: s.total_moved,
        rounds: s.rounds,
    }
}
