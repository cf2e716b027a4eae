//! The entity types a node runs: its region of each, and the coordinator of each while the node
//! leads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use shardline_core::TypeKey;

use super::coordinator::Coordinator;
use super::region::RegionDyn;

/// The node's regions and coordinators, by type.
#[derive(Default)]
pub(crate) struct Types {
    pub regions: RwLock<HashMap<TypeKey, Arc<dyn RegionDyn>>>,
    pub coordinators: Mutex<HashMap<TypeKey, Arc<Coordinator>>>,
}

impl Types {
    /// The region of `key`, when the type is registered here.
    pub fn region(&self, key: &TypeKey) -> Option<Arc<dyn RegionDyn>> {
        self.regions.read().unwrap_or_else(|e| e.into_inner()).get(key).cloned()
    }

    /// Every region.
    pub fn regions(&self) -> Vec<Arc<dyn RegionDyn>> {
        self.regions.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// The coordinator of `key`, while this node runs one.
    pub fn coordinator(&self, key: &TypeKey) -> Option<Arc<Coordinator>> {
        self.coordinators.lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned()
    }
}
