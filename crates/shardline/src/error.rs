//! Errors callers see.

use std::time::Duration;

/// Why an `ask` or `tell` failed, and whether the message was processed.
///
/// What a caller may do next depends on [`Error::processed`]:
///
/// | variant | processed? | resend? |
/// |---|---|---|
/// | [`Unavailable`](Error::Unavailable), [`Overloaded`](Error::Overloaded), [`Rejected`](Error::Rejected) | no | yes, it cannot run twice |
/// | [`ReplyLost`](Error::ReplyLost) | yes | no: it ran, only the answer is gone |
/// | [`Timeout`](Error::Timeout), [`OutcomeUnknown`](Error::OutcomeUnknown) | maybe | only if the message is idempotent |
/// | [`RequestExpired`](Error::RequestExpired) | maybe, and not this time | no: too late to tell |
///
/// ```
/// use shardline::{Error, Processed};
///
/// let e = Error::Overloaded("mailbox full".into());
/// assert_eq!(e.processed(), Processed::No);
/// assert!(e.is_safe_to_retry());
/// assert!(!Error::ReplyLost("cannot decode reply".into()).is_safe_to_retry());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum Error {
    /// No reply within the timeout. The message may or may not have been processed.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// Not processed: the cluster cannot route the message now (no home, node fenced, leaving
    /// or shut down).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Not processed: a buffer, queue or mailbox on the way is full.
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// Not processed: the message was refused before its entity saw it (it cannot be encoded or
    /// decoded, the entity type is unknown there, or the node's lease ran out).
    #[error("rejected: {0}")]
    Rejected(String),
    /// Processed, but its reply was lost: it could not be encoded or decoded. Resending would
    /// process the message a second time.
    #[error("processed, but the reply was lost: {0}")]
    ReplyLost(String),
    /// The ask ended without an answer, for example because the entity panicked while handling
    /// it. The message may or may not have been processed.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// Not processed this time: a retry of a request issued longer ago than its entity keeps
    /// replies for ([`EventSourcedSettings::reply_retention`](crate::EventSourcedSettings)).
    /// An earlier attempt may have been processed, and the entity can no longer tell, so it
    /// refuses rather than risk applying it twice. A request issued further ahead of the
    /// entity's clock than [`CLOCK_SKEW_MARGIN`](crate::entity::CLOCK_SKEW_MARGIN) is refused
    /// the same way: its age cannot be trusted.
    #[error("request expired: {0}")]
    RequestExpired(String),
}

/// Whether a failed message was processed by its entity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Processed {
    /// It was not: resending is safe.
    No,
    /// It was; only the reply is missing.
    Yes,
    /// It may have been.
    Maybe,
}

impl Error {
    /// Whether the message was processed; see the [table](Error).
    pub fn processed(&self) -> Processed {
        match self {
            Error::Unavailable(_) | Error::Overloaded(_) | Error::Rejected(_) => Processed::No,
            Error::ReplyLost(_) => Processed::Yes,
            Error::Timeout(_) | Error::OutcomeUnknown(_) | Error::RequestExpired(_) => Processed::Maybe,
        }
    }

    /// True when the message was certainly not processed, so sending it again cannot process it
    /// twice.
    pub fn is_safe_to_retry(&self) -> bool {
        self.processed() == Processed::No
    }
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
    /// A frame could not be encoded; it was not sent.
    #[error("unencodable frame: {0}")]
    Encode(String),
    /// The peer speaks no protocol version this node speaks.
    #[error("no protocol version in common: ours {}..={}, theirs {}..={}", ours.0, ours.1, theirs.0, theirs.1)]
    ProtocolMismatch {
        /// The oldest and newest versions this node speaks.
        ours: (u32, u32),
        /// The oldest and newest the peer speaks.
        theirs: (u32, u32),
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
    /// TLS failed: the peer's certificate is not of the cluster's CA, has expired, is missing,
    /// or one side does not speak TLS.
    #[error("TLS: {0}")]
    Tls(String),
    /// The peer's certificate is of the cluster's CA but not for the node it claims to be.
    #[error("the peer's certificate is not for node {node:?}: {reason}")]
    NotCertified {
        /// The node name the peer claims.
        node: String,
        /// Why.
        reason: String,
    },
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
