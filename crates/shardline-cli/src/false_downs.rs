//! Counts members the cluster lost that nobody killed: the price of fast failure detection.
//!
//! A failure detector tuned to repair crashes in seconds may also down a member that was only
//! slow. The failover benchmark kills members on purpose; every other member that shows up
//! down (gossip) or whose key vanishes (leases) in the driver's view is a false down.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardline::{Cluster, NodeId};

/// Watches a proxy's view for members that go away, and tells killed members from the others.
pub struct FalseDowns {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct State {
    /// Names killed on purpose, and the incarnations of them alive when they were killed.
    killed: BTreeSet<NodeId>,
    /// Members seen alive (not proxies, not fenced).
    alive: BTreeSet<NodeId>,
    /// Members that went away without being killed.
    false_downs: Vec<NodeId>,
}

impl FalseDowns {
    /// Starts watching `driver`'s view (polled every 50 ms: a member downed and back within
    /// that is missed, which a detector that downs members cannot do: a downed member comes
    /// back as a new incarnation).
    pub fn watch(driver: &Cluster) -> FalseDowns {
        let state = Arc::new(Mutex::new(State::default()));
        let (driver, s) = (driver.clone(), state.clone());
        let task = tokio::spawn(async move {
            loop {
                let view = driver.view();
                let now: BTreeSet<NodeId> = view
                    .view
                    .members()
                    .filter(|m| !m.is_proxy() && !view.is_fenced(&m.node))
                    .map(|m| m.node.clone())
                    .collect();
                {
                    let mut st = s.lock().unwrap_or_else(|e| e.into_inner());
                    let gone: Vec<NodeId> = st.alive.difference(&now).cloned().collect();
                    for node in gone {
                        if !st.killed.contains(&node) {
                            tracing::warn!(%node, "a member nobody killed went away (a false down)");
                            st.false_downs.push(node);
                        }
                    }
                    st.alive = now;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        FalseDowns { state, task }
    }

    /// The member named `name` is about to be killed: its going away is expected.
    pub fn killing(&self, name: &str) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let victims: Vec<NodeId> = st.alive.iter().filter(|n| &*n.name == name).cloned().collect();
        st.killed.extend(victims);
    }

    /// Stops watching; the members that went away without being killed.
    pub fn finish(self) -> Vec<NodeId> {
        self.task.abort();
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.false_downs.clone()
    }
}
