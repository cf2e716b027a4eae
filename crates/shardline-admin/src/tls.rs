//! HTTPS for the admin API: its certificate and key, and a listener whose connections are TLS.
//!
//! The handshakes run in tasks of their own, each within [`HANDSHAKE_LIMIT`]: a client that
//! connects and says nothing holds one task, never the accept loop.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use crate::error::AdminError;

/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// The admin API's certificate chain and key, for HTTPS.
///
/// ```no_run
/// # fn main() -> Result<(), shardline_admin::AdminError> {
/// let tls = shardline_admin::AdminTls::from_files("admin.pem", "admin.key")?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AdminTls {
    config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for AdminTls {
    // Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminTls").finish_non_exhaustive()
    }
}

impl AdminTls {
    /// Reads PEM files: the certificate chain (its own first) and its private key.
    pub fn from_files(cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Result<AdminTls, AdminError> {
        let read = |what: &str, p: &Path| {
            std::fs::read(p).map_err(|e| AdminError::Tls(format!("cannot read the {what} {}: {e}", p.display())))
        };
        AdminTls::from_pem(&read("certificate", cert.as_ref())?, &read("key", key.as_ref())?)
    }

    /// From PEM text: the certificate chain (its own first) and its private key.
    pub fn from_pem(cert: &[u8], key: &[u8]) -> Result<AdminTls, AdminError> {
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| AdminError::Tls(format!("certificate: {e}")))?;
        if chain.is_empty() {
            return Err(AdminError::Tls("certificate: no PEM certificate in it".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| AdminError::Tls(format!("no private key: {e}")))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| AdminError::Tls(e.to_string()))?;
        Ok(AdminTls { config: Arc::new(config) })
    }
}

/// A listener whose connections completed a TLS handshake.
pub(crate) struct TlsListener {
    local: SocketAddr,
    done: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    pub(crate) fn new(tcp: TcpListener, tls: &AdminTls) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let acceptor = TlsAcceptor::from(tls.config.clone());
        let (tx, done) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, remote) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors, say: wait rather than spin.
                        warn!(error = %e, "admin API: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, done) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = done.send((tls, remote)).await;
                        }
                        Ok(Err(e)) => debug!(%remote, error = %e, "admin API: TLS handshake failed"),
                        Err(_) => debug!(%remote, "admin API: TLS handshake timed out"),
                    }
                });
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(TlsListener { local, done })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.done.recv().await {
            Some(c) => c,
            // The accept loop ends only once this listener is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}
