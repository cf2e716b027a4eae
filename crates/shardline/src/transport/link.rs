//! One connection between two nodes: plain TCP or TLS over it, read and written alike.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;

use super::network::{Accepted, Connection};
use super::tls::{certified_for, TlsConfig};
use crate::error::TransportError;

/// A connection, as the handshake and the frames see it.
pub(crate) enum Link {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// A connection of a [`Network`](super::Network) of the caller's (no TLS: the builder
    /// refuses the two together).
    Other(Box<dyn Connection>),
}

impl Link {
    /// Starts TLS as the dialer when `tls` is set. The name given to TLS is only what the
    /// dialer sends as SNI: the acceptor's name is checked after the handshake (see `tls`).
    pub async fn dial(tcp: TcpStream, tls: Option<&TlsConfig>) -> Result<Link, TransportError> {
        let Some(tls) = tls else { return Ok(Link::Plain(tcp)) };
        let sni =
            rustls::pki_types::ServerName::try_from("shardline").map_err(|e| TransportError::Tls(e.to_string()))?;
        let stream = tls.connector().connect(sni, tcp).await.map_err(tls_failed)?;
        Ok(Link::Tls(Box::new(TlsStream::Client(stream))))
    }

    /// Starts TLS as the acceptor when `tls` is set: the peer must show a certificate of the
    /// cluster's CA.
    pub async fn accept(accepted: Accepted, tls: Option<&TlsConfig>) -> Result<Link, TransportError> {
        let tcp = match accepted {
            Accepted::Tcp(tcp) => tcp,
            Accepted::Other(c) => return Ok(Link::Other(c)),
        };
        tcp.set_nodelay(true)?;
        let Some(tls) = tls else { return Ok(Link::Plain(tcp)) };
        let stream = tls.acceptor().accept(tcp).await.map_err(tls_failed)?;
        Ok(Link::Tls(Box::new(TlsStream::Server(stream))))
    }

    /// Checks, on a TLS link, that the peer's certificate is for node `name` (the name it
    /// claims in the handshake). A plain link has nothing to check.
    pub fn check_peer(&self, name: &str) -> Result<(), TransportError> {
        let Link::Tls(stream) = self else { return Ok(()) };
        let certs = match &**stream {
            TlsStream::Client(s) => s.get_ref().1.peer_certificates(),
            TlsStream::Server(s) => s.get_ref().1.peer_certificates(),
        };
        let Some(cert) = certs.and_then(|c| c.first()) else {
            return Err(TransportError::NotCertified { node: name.into(), reason: "no certificate".into() });
        };
        certified_for(cert, name).map_err(|reason| TransportError::NotCertified { node: name.into(), reason })
    }
}

/// A failed TLS handshake, named for the log of the node that refuses.
fn tls_failed(e: io::Error) -> TransportError {
    // Closed before a word of TLS (a port probe): no peer to name.
    if e.kind() == io::ErrorKind::UnexpectedEof {
        return TransportError::Io(e);
    }
    let reason = e.to_string();
    // rustls reports bytes that are no TLS record as a corrupt message: a peer without TLS.
    if reason.contains("InvalidContentType") || reason.contains("corrupt message") {
        return TransportError::Tls(format!("the peer does not speak TLS (a node without a certificate?): {reason}"));
    }
    TransportError::Tls(reason)
}

impl AsyncRead for Link {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Link::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
            Link::Other(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Link {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Link::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
            Link::Other(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_flush(cx),
            Link::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
            Link::Other(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Link::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
            Link::Other(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}
