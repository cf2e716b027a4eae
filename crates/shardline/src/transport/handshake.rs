//! The handshake's rules, apart from the sockets: which `Hello` an acceptor takes, and which
//! answer a dialer takes. Pure functions of the frames (and of a certificate check), so that
//! they are tested and fuzzed without a connection.

use std::net::SocketAddr;

use shardline_core::NodeId;

use super::wire::{Wire, PROTOCOL_VERSION};
use crate::error::TransportError;

/// A `Hello` the acceptor took.
#[derive(Debug)]
pub(crate) struct Greeting {
    /// The dialer.
    pub from: NodeId,
    /// Where the dialer listens.
    pub listen: SocketAddr,
    /// Dialed by address (a seed, a probe): not the peer's own connection.
    pub by_address: bool,
}

/// The acceptor's verdict on the dialer's first frame. `certified` checks that the connection's
/// certificate is for the name the dialer claims (always true without TLS). A refusal carries the
/// node the dialer claimed to be, when it got that far, for the log.
pub(crate) fn accept_hello<M>(
    first: Wire<M>,
    me: &NodeId,
    cluster: &str,
    certified: impl FnOnce(&str) -> Result<(), TransportError>,
) -> Result<Greeting, (Option<NodeId>, TransportError)> {
    let Wire::Hello { protocol, cluster: theirs, from, listen, to } = first else {
        return Err((None, TransportError::Decode(format!("expected Hello, got {}", first.kind()))));
    };
    let refusal = if protocol != PROTOCOL_VERSION {
        Some(TransportError::ProtocolMismatch { ours: PROTOCOL_VERSION, theirs: protocol })
    } else if theirs != cluster {
        Some(TransportError::ClusterMismatch { ours: cluster.to_string(), theirs })
    } else if let Some(t) = to.as_ref().filter(|t| *t != me) {
        Some(TransportError::WrongNode { expected: t.to_string(), found: me.to_string() })
    } else {
        certified(&from.name).err()
    };
    match refusal {
        Some(e) => Err((Some(from), e)),
        None => Ok(Greeting { from, listen, by_address: to.is_none() }),
    }
}

/// The dialer's verdict on the acceptor's answer: the node that answered, if it is the one
/// `expect`ed (any, dialing an address) and its certificate is for its name.
pub(crate) fn accept_answer<M>(
    answer: Wire<M>,
    expect: Option<&NodeId>,
    certified: impl FnOnce(&str) -> Result<(), TransportError>,
) -> Result<NodeId, TransportError> {
    match answer {
        Wire::HelloOk { node } => {
            if let Some(e) = expect.filter(|e| **e != node) {
                return Err(TransportError::WrongNode { expected: e.to_string(), found: node.to_string() });
            }
            certified(&node.name)?;
            Ok(node)
        }
        Wire::Refuse { reason } => Err(TransportError::Refused(reason)),
        other => Err(TransportError::Decode(format!("expected HelloOk, got {}", other.kind()))),
    }
}

/// Why the first frame could not be read, named for the log: a TLS record read as a frame's
/// length (22, the handshake record type, then version 3.x) means the peer speaks TLS and this
/// node does not.
pub(crate) fn unreadable_hello(e: TransportError) -> TransportError {
    match e {
        TransportError::FrameTooLarge { len, .. } if len >> 16 == 0x1603 => {
            TransportError::Tls("the peer speaks TLS and this node runs without it".into())
        }
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(protocol: u32, cluster: &str, to: Option<NodeId>) -> Wire<()> {
        Wire::Hello {
            protocol,
            cluster: cluster.into(),
            from: NodeId::new("dialer", 1),
            listen: "127.0.0.1:1".parse().unwrap(),
            to,
        }
    }

    fn me() -> NodeId {
        NodeId::new("me", 5)
    }

    #[test]
    fn a_hello_is_taken_only_when_everything_matches() {
        let ok = |_: &str| Ok(());
        let g = accept_hello(hello(PROTOCOL_VERSION, "c", Some(me())), &me(), "c", ok).unwrap();
        assert_eq!((g.from.name.as_ref(), g.by_address), ("dialer", false));
        assert!(accept_hello(hello(PROTOCOL_VERSION, "c", None), &me(), "c", ok).unwrap().by_address);
        let refused = |w, cert: Result<(), TransportError>| accept_hello(w, &me(), "c", |_| cert).unwrap_err().1;
        assert!(matches!(
            refused(hello(PROTOCOL_VERSION + 1, "c", None), Ok(())),
            TransportError::ProtocolMismatch { .. }
        ));
        assert!(matches!(refused(hello(PROTOCOL_VERSION, "d", None), Ok(())), TransportError::ClusterMismatch { .. }));
        let other = Some(NodeId::new("me", 4));
        assert!(matches!(refused(hello(PROTOCOL_VERSION, "c", other), Ok(())), TransportError::WrongNode { .. }));
        let not = TransportError::NotCertified { node: "dialer".into(), reason: "no".into() };
        assert!(matches!(refused(hello(PROTOCOL_VERSION, "c", None), Err(not)), TransportError::NotCertified { .. }));
        let (who, e) = accept_hello(Wire::<()>::HelloOk { node: me() }, &me(), "c", ok).unwrap_err();
        assert!(who.is_none() && matches!(e, TransportError::Decode(_)));
    }

    #[test]
    fn an_answer_is_taken_from_the_expected_certified_node_only() {
        let ok = |_: &str| Ok(());
        assert_eq!(accept_answer(Wire::<()>::HelloOk { node: me() }, Some(&me()), ok).unwrap(), me());
        let other = Wire::<()>::HelloOk { node: NodeId::new("me", 6) };
        assert!(matches!(accept_answer(other, Some(&me()), ok), Err(TransportError::WrongNode { .. })));
        let refuse = Wire::<()>::Refuse { reason: "no".into() };
        assert!(matches!(accept_answer(refuse, None, ok), Err(TransportError::Refused(_))));
        let uncertified = accept_answer(Wire::<()>::HelloOk { node: me() }, None, |n: &str| {
            Err(TransportError::NotCertified { node: n.into(), reason: "other name".into() })
        });
        assert!(matches!(uncertified, Err(TransportError::NotCertified { .. })));
    }
}
