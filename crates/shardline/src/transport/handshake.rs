//! The handshake's rules, apart from the sockets: which `Hello` an acceptor takes, and which
//! answer a dialer takes. Pure functions of the frames (and of a certificate check), so that
//! they are tested and fuzzed without a connection.

use std::net::SocketAddr;

use shardline_core::NodeId;

use super::wire::{Wire, OLDEST_PROTOCOL, PROTOCOL_VERSION};
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
    /// The protocol version the connection speaks: the newest both ends do.
    pub protocol: u32,
}

/// The newest version both ranges hold, if they overlap.
fn common_version(theirs: (u32, u32)) -> Result<u32, TransportError> {
    let ours = (OLDEST_PROTOCOL, PROTOCOL_VERSION);
    let agreed = ours.1.min(theirs.1);
    if agreed < ours.0.max(theirs.0) {
        return Err(TransportError::ProtocolMismatch { ours, theirs });
    }
    Ok(agreed)
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
    let Wire::Hello { protocol: oldest, cluster: theirs, from, listen, to, newest } = first else {
        return Err((None, TransportError::Decode(format!("expected Hello, got {}", first.kind()))));
    };
    let protocol = match common_version((oldest, newest)) {
        Ok(p) => p,
        Err(e) => return Err((Some(from), e)),
    };
    let refusal = if theirs != cluster {
        Some(TransportError::ClusterMismatch { ours: cluster.to_string(), theirs })
    } else if let Some(t) = to.as_ref().filter(|t| *t != me) {
        Some(TransportError::WrongNode { expected: t.to_string(), found: me.to_string() })
    } else {
        certified(&from.name).err()
    };
    match refusal {
        Some(e) => Err((Some(from), e)),
        None => Ok(Greeting { from, listen, by_address: to.is_none(), protocol }),
    }
}

/// The dialer's verdict on the acceptor's answer: the node that answered, if it is the one
/// `expect`ed (any, dialing an address) and its certificate is for its name, and the protocol
/// version the connection speaks.
pub(crate) fn accept_answer<M>(
    answer: Wire<M>,
    expect: Option<&NodeId>,
    certified: impl FnOnce(&str) -> Result<(), TransportError>,
) -> Result<(NodeId, u32), TransportError> {
    match answer {
        Wire::HelloOk { node, protocol } => {
            if let Some(e) = expect.filter(|e| **e != node) {
                return Err(TransportError::WrongNode { expected: e.to_string(), found: node.to_string() });
            }
            // A node of version 3 answers without a version: it took our oldest, its own.
            let answered = protocol.unwrap_or(OLDEST_PROTOCOL);
            let protocol = common_version((answered, answered))?;
            certified(&node.name)?;
            Ok((node, protocol))
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
            protocol: OLDEST_PROTOCOL,
            cluster: cluster.into(),
            from: NodeId::new("dialer", 1),
            listen: "127.0.0.1:1".parse().unwrap(),
            to,
            newest: protocol,
        }
    }

    /// Through the bytes, as the peer would send it.
    fn sent(w: Wire<()>) -> Wire<()> {
        let mut buf = Vec::new();
        w.encode_into(&mut buf).unwrap();
        Wire::decode(&buf[4..]).unwrap()
    }

    /// A `Hello` as a node of version 3 wrote it: its fields, no extension.
    fn hello_of_version_3() -> Wire<()> {
        #[derive(serde::Serialize)]
        enum V3 {
            Hello { protocol: u32, cluster: String, from: NodeId, listen: std::net::SocketAddr, to: Option<NodeId> },
        }
        let listen = "127.0.0.1:1".parse().unwrap();
        let v3 = V3::Hello { protocol: 3, cluster: "c".into(), from: NodeId::new("dialer", 1), listen, to: None };
        Wire::decode(&postcard::to_allocvec(&v3).unwrap()).unwrap()
    }

    /// Two nodes speak the newest version both do; a node of version 3 is spoken to in 3, and
    /// one whose versions do not meet ours is refused.
    #[test]
    fn the_handshake_agrees_on_the_newest_version_both_speak() {
        let ok = |_: &str| Ok(());
        let g = accept_hello(sent(hello(PROTOCOL_VERSION, "c", None)), &me(), "c", ok).unwrap();
        assert_eq!(g.protocol, PROTOCOL_VERSION);
        let g = accept_hello(hello_of_version_3(), &me(), "c", ok).unwrap();
        assert_eq!(g.protocol, 3);
        let g = accept_hello(sent(hello(PROTOCOL_VERSION + 5, "c", None)), &me(), "c", ok).unwrap();
        assert_eq!(g.protocol, PROTOCOL_VERSION);
        let too_new = Wire::<()>::Hello {
            protocol: PROTOCOL_VERSION + 1,
            cluster: "c".into(),
            from: NodeId::new("dialer", 1),
            listen: "127.0.0.1:1".parse().unwrap(),
            to: None,
            newest: PROTOCOL_VERSION + 2,
        };
        let (_, e) = accept_hello(sent(too_new), &me(), "c", ok).unwrap_err();
        let theirs = (PROTOCOL_VERSION + 1, PROTOCOL_VERSION + 2);
        assert!(matches!(e, TransportError::ProtocolMismatch { theirs: t, .. } if t == theirs), "{e}");
        // The dialer's side: a version 3 acceptor's answer has no version; one out of range is refused.
        let answer = |protocol| sent(Wire::HelloOk { node: me(), protocol });
        assert_eq!(accept_answer(answer(None), None, ok).unwrap().1, OLDEST_PROTOCOL);
        assert_eq!(accept_answer(answer(Some(4)), None, ok).unwrap().1, 4);
        assert_eq!(accept_answer(answer(Some(5)), None, ok).unwrap().1, 5);
        assert!(matches!(accept_answer(answer(Some(9)), None, ok), Err(TransportError::ProtocolMismatch { .. })));
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
            refused(hello(OLDEST_PROTOCOL - 1, "c", None), Ok(())),
            TransportError::ProtocolMismatch { .. }
        ));
        assert!(matches!(refused(hello(PROTOCOL_VERSION, "d", None), Ok(())), TransportError::ClusterMismatch { .. }));
        let other = Some(NodeId::new("me", 4));
        assert!(matches!(refused(hello(PROTOCOL_VERSION, "c", other), Ok(())), TransportError::WrongNode { .. }));
        let not = TransportError::NotCertified { node: "dialer".into(), reason: "no".into() };
        assert!(matches!(refused(hello(PROTOCOL_VERSION, "c", None), Err(not)), TransportError::NotCertified { .. }));
        let (who, e) = accept_hello(Wire::<()>::HelloOk { node: me(), protocol: None }, &me(), "c", ok).unwrap_err();
        assert!(who.is_none() && matches!(e, TransportError::Decode(_)));
    }

    #[test]
    fn an_answer_is_taken_from_the_expected_certified_node_only() {
        let ok = |_: &str| Ok(());
        assert_eq!(accept_answer(Wire::<()>::HelloOk { node: me(), protocol: None }, Some(&me()), ok).unwrap().0, me());
        let other = Wire::<()>::HelloOk { node: NodeId::new("me", 6), protocol: None };
        assert!(matches!(accept_answer(other, Some(&me()), ok), Err(TransportError::WrongNode { .. })));
        let refuse = Wire::<()>::Refuse { reason: "no".into() };
        assert!(matches!(accept_answer(refuse, None, ok), Err(TransportError::Refused(_))));
        let uncertified = accept_answer(Wire::<()>::HelloOk { node: me(), protocol: None }, None, |n: &str| {
            Err(TransportError::NotCertified { node: n.into(), reason: "other name".into() })
        });
        assert!(matches!(uncertified, Err(TransportError::NotCertified { .. })));
    }
}
