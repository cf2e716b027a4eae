//! Errors callers see.

use std::time::Duration;

/// Why an `ask` or `tell` failed. A failed ask may or may not have been processed, except for
/// `Overloaded` and `Rejected`, which were not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum Error {
    /// No reply within the timeout.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// The cluster cannot route the message now (no home, node fenced or shutting down).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A buffer or mailbox on the way is full.
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// The message was refused (it cannot be decoded, or the entity type is unknown).
    #[error("rejected: {0}")]
    Rejected(String),
}

/// Problems with a connection between nodes. The connection is closed; the node keeps running.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Reading or writing the socket failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A frame announced a length over the maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    FrameTooLarge {
        /// Announced length.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// A frame could not be decoded (garbage or a message kind this version does not know).
    #[error("undecodable frame: {0}")]
    Decode(String),
    /// The peer speaks another protocol version.
    #[error("protocol version mismatch: ours {ours}, theirs {theirs}")]
    ProtocolMismatch {
        /// Ours.
        ours: u32,
        /// Theirs.
        theirs: u32,
    },
    /// The peer belongs to another cluster.
    #[error("cluster name mismatch: ours {ours:?}, theirs {theirs:?}")]
    ClusterMismatch {
        /// Ours.
        ours: String,
        /// Theirs.
        theirs: String,
    },
    /// The peer is not the node we meant to reach (e.g. it restarted as a new incarnation).
    #[error("expected node {expected}, found {found}")]
    WrongNode {
        /// Who we dialed.
        expected: String,
        /// Who answered.
        found: String,
    },
    /// The peer refused the handshake.
    #[error("refused by peer: {0}")]
    Refused(String),
    /// The handshake did not complete in time.
    #[error("handshake timed out")]
    HandshakeTimeout,
}

/// A configuration the cluster cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A setting is missing or out of range.
    #[error("invalid setting {name}: {reason}")]
    Invalid {
        /// The setting.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The listen address could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// An entity type was registered twice.
    #[error("entity type {0} is already registered")]
    DuplicateType(String),
    /// The membership provider failed to start.
    #[error("membership: {0}")]
    Membership(String),
}
