//! The coordinator and the store that keeps its shard map (membership providers with a store):
//! reading the map before anything is decided, and what a write's outcome means.
//!
//! The driver reads and writes; every decision is here. An unreadable map is started over (it
//! holds no owner that could still be serving without also being asked to report in recovery);
//! a store that does not answer is asked again; a write refused because a newer term wrote the
//! map deposes this coordinator; any other conflict is overwritten, since this coordinator's
//! map is newer than anything an older term or a broken write left.

use super::command::CoordinatorCommand;
use super::engine::CoordinatorEngine;
use crate::events::DomainEvent;
use crate::membership::MembershipView;
use crate::shard_map::{ShardMap, Term};

/// How long after a failed read or write of the store it is tried again.
pub const STORE_RETRY_MS: u64 = 500;

/// A coordinator waiting for its stored map.
#[derive(Debug)]
pub(super) struct Loading {
    /// The newest membership view, used once the map is read.
    pub view: MembershipView,
    /// When the map is asked for again, after a failed read.
    pub retry_at: Option<u64>,
}

/// Why the stored map could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapLoadError {
    /// The stored value is not a map this version reads.
    #[error("the stored shard map is unreadable: {reason}")]
    Unreadable {
        /// What the decoder said.
        reason: String,
    },
    /// The store did not answer, or failed.
    #[error("the store did not give the shard map: {reason}")]
    Unavailable {
        /// What the store said.
        reason: String,
    },
}

/// Why a [`CoordinatorCommand::PersistShardMap`] was not stored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapWriteError {
    /// The stored map changed since this coordinator last wrote it: it holds a map of `term`
    /// (None: no map, or one that cannot be read).
    #[error("the stored shard map changed meanwhile (term {term:?})")]
    Conflict {
        /// The term of the coordinator that wrote the stored map.
        term: Option<Term>,
    },
    /// The store did not answer, or failed.
    #[error("the store did not take the shard map: {reason}")]
    Unavailable {
        /// What the store said.
        reason: String,
    },
}

impl CoordinatorEngine {
    /// The stored map was read (None: never written). An unreadable one is started over; a
    /// failed read is asked again after [`STORE_RETRY_MS`]. Once read, the coordinator starts
    /// recovering from it, as [`new`](Self::new) does.
    pub fn handle_map_loaded(&mut self, now: u64, loaded: Result<Option<ShardMap>, MapLoadError>) {
        let Some(loading) = self.loading.as_mut() else { return };
        if self.stopped {
            return;
        }
        let stored = match loaded {
            Ok(stored) => stored,
            Err(MapLoadError::Unreadable { .. }) => None,
            Err(MapLoadError::Unavailable { .. }) => {
                loading.retry_at = Some(now + STORE_RETRY_MS);
                return;
            }
        };
        let Some(Loading { view, .. }) = self.loading.take() else { return };
        // A stored map whose entries this map cannot take (an epoch or an owner it refuses) is
        // started over, as an unreadable one is: recovery asks every member what it hosts.
        if let Ok(map) = ShardMap::resume(self.config.num_shards, stored.as_ref()) {
            self.map = map;
        }
        self.begin(now, &view);
    }

    pub(super) fn load_again_if_due(&mut self, now: u64) {
        let Some(loading) = self.loading.as_mut() else { return };
        if loading.retry_at.is_some_and(|at| at <= now) {
            loading.retry_at = None;
            self.commands.push_back(CoordinatorCommand::LoadShardMap);
        }
    }

    /// The outcome of writing the map of `version`. A conflict with a newer term deposes this
    /// coordinator ([`handle_map_write_refused`](Self::handle_map_write_refused)); any other
    /// conflict is overwritten with the current map at once; a store that failed is written
    /// again after [`STORE_RETRY_MS`].
    pub fn handle_map_stored(&mut self, now: u64, version: u64, stored: Result<(), MapWriteError>) {
        if self.is_idle() {
            return;
        }
        match stored {
            Ok(()) => {}
            Err(MapWriteError::Conflict { term: Some(by) }) if by > self.term => self.handle_map_write_refused(now, by),
            Err(MapWriteError::Conflict { .. }) => self.persist_map(),
            Err(MapWriteError::Unavailable { .. }) => {
                // A newer write already asked for supersedes this one, and is retried by its own
                // outcome.
                if version == self.map.version() {
                    self.persist_retry_at = Some(now + STORE_RETRY_MS);
                }
            }
        }
    }

    pub(super) fn persist_again_if_due(&mut self, now: u64) {
        if self.persist_retry_at.is_some_and(|at| at <= now) {
            self.persist_retry_at = None;
            self.persist_map();
        }
    }

    /// Asks for the whole current map to be written (after a refused or failed write).
    fn persist_map(&mut self) {
        self.commands.push_back(CoordinatorCommand::PersistShardMap {
            version: self.map.version(),
            changes: Vec::new(),
            map: self.map.clone(),
        });
    }

    /// A newer term wrote the shard map: this coordinator steps down (also what
    /// [`handle_map_stored`](Self::handle_map_stored) decides on such a conflict).
    pub(super) fn deposed_by(&mut self, by: Term) {
        self.emit(DomainEvent::Deposed { node: self.node.clone(), term: self.term, by });
    }
}
