//! Whether a node is ready to take traffic: what an orchestrator's readiness probe asks.
//!
//! A node is ready when it is `Up` in the membership view it applied and has started every shard
//! the coordinators gave it. Readiness depends on this node alone, never on another node's health:
//! a probe that waited on the rest of the cluster would stall a rolling update whenever some
//! other member was slow (Akka users hit exactly that).

use shardline_core::MemberStatus;

use super::Cluster;

/// A node's readiness; see [`Cluster::readiness`].
///
/// ```
/// use shardline::Readiness;
/// use shardline_core::MemberStatus;
/// let r = Readiness { status: Some(MemberStatus::Up), given: 3, started: 2 };
/// assert!(!r.is_ready(), "a shard it was given has not started yet");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// This node's status in the view it applied last; `None` before it appears in one.
    pub status: Option<MemberStatus>,
    /// Shards the coordinators gave this node, over every registered entity type.
    pub given: usize,
    /// How many of those this node has started.
    pub started: usize,
}

impl Readiness {
    /// `Up` (not joining, leaving or down) and serving every shard it was given.
    pub fn is_ready(&self) -> bool {
        self.status == Some(MemberStatus::Up) && self.started >= self.given
    }

    /// Why the node is not ready, for people; `None` when it is.
    pub fn reason(&self) -> Option<String> {
        match self.status {
            None => Some("not a member yet".into()),
            Some(MemberStatus::Up) if self.started < self.given => {
                Some(format!("{} of the {} shards given to it have started", self.started, self.given))
            }
            Some(MemberStatus::Up) => None,
            Some(s) => Some(format!("its status is {s:?}")),
        }
    }
}

impl Cluster {
    /// Whether this node is ready to take traffic (see [`Readiness`]); it asks no other node.
    pub fn readiness(&self) -> Readiness {
        let me = self.node_id();
        let status = self.view().view.get(me).map(|m| m.status);
        let (mut given, mut started) = (0, 0);
        for region in self.regions() {
            let homes = region.homes();
            // One pass each: a probe on a node of many shards must not cost shards × hosted.
            let mut here = vec![false; homes.len()];
            for (s, _) in region.hosted() {
                if let Some(h) = here.get_mut(s.index()) {
                    *h = true;
                }
            }
            for (home, here) in homes.iter().zip(here) {
                if home.as_ref() == Some(me) {
                    given += 1;
                    started += usize::from(here);
                }
            }
        }
        Readiness { status, given, started }
    }
}
