//! Mutual TLS between nodes: who may speak the protocol at all.
//!
//! Every node holds a certificate signed by the cluster's CA, for its node name (a DNS name in
//! the certificate's subject alternative names), with both the server and the client extended
//! key usage: each connection is TLS 1.3 and both ends show a certificate.
//!
//! The name is checked by the transport, not by TLS: a node dials seeds by address, before it
//! knows who answers, so the dialer's TLS checks only the chain, and both ends then compare the
//! node name their peer claims in the handshake (`Hello`, `HelloOk`) with the names its
//! certificate was issued for. A node whose certificate is for another name is refused even
//! when the CA signed it: a stolen certificate of one node cannot be used to pose as another.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

#[cfg(feature = "dev-certs")]
pub mod dev;

/// Why a TLS setting cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM item of the kind expected.
    #[error("{what}: {reason}")]
    Pem {
        /// Which file.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the certificates or key (a key that does not match the certificate, say).
    #[error("TLS configuration refused: {0}")]
    Refused(String),
    /// A certificate is not for the node name it is used for.
    #[error("the certificate is not for node name {name:?}: {reason}")]
    NotForName {
        /// The node name.
        name: String,
        /// Why (not a DNS name, or not among the certificate's names).
        reason: String,
    },
}

/// A node's TLS settings: its certificate chain and key, and the cluster's CA.
///
/// ```no_run
/// # fn main() -> Result<(), shardline::transport::TlsError> {
/// use shardline::transport::TlsConfig;
/// let tls = TlsConfig::from_files("certs/n1.pem", "certs/n1.key", "certs/ca.pem")?;
/// tls.certifies("n1")?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TlsConfig {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    own: CertificateDer<'static>,
}

impl std::fmt::Debug for TlsConfig {
    // Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig").finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Reads PEM files: the node's certificate (chain), its private key and the CA certificate(s).
    pub fn from_files(
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
        ca: impl AsRef<Path>,
    ) -> Result<TlsConfig, TlsError> {
        let read = |what, p: &Path| std::fs::read(p).map_err(|source| TlsError::Read { what, path: p.into(), source });
        TlsConfig::from_pem(
            &read("certificate", cert.as_ref())?,
            &read("key", key.as_ref())?,
            &read("CA", ca.as_ref())?,
        )
    }

    /// From PEM text: the node's certificate (chain, its own first), its private key and the CA
    /// certificate(s).
    pub fn from_pem(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<TlsConfig, TlsError> {
        let chain = certificates("certificate", cert)?;
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| TlsError::Pem { what: "key", reason: format!("no private key: {e}") })?;
        let mut roots = RootCertStore::empty();
        for c in certificates("CA", ca)? {
            roots.add(c).map_err(|e| TlsError::Pem { what: "CA", reason: e.to_string() })?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let refused = |e: rustls::Error| TlsError::Refused(e.to_string());
        let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| TlsError::Refused(e.to_string()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(refused)?
            .with_client_cert_verifier(clients)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(refused)?;
        let servers = Arc::new(ClusterCa { roots, algorithms: provider.signature_verification_algorithms });
        let client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(refused)?
            .dangerous()
            .with_custom_certificate_verifier(servers)
            .with_client_auth_cert(chain.clone(), key)
            .map_err(refused)?;
        Ok(TlsConfig { client: Arc::new(client), server: Arc::new(server), own: chain[0].clone() })
    }

    /// Checks that this node's own certificate is for `node_name`: a node refuses to start with
    /// a certificate its peers would refuse.
    pub fn certifies(&self, node_name: &str) -> Result<(), TlsError> {
        certified_for(&self.own, node_name).map_err(|reason| TlsError::NotForName { name: node_name.into(), reason })
    }

    pub(crate) fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.client.clone())
    }

    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server.clone())
    }
}

fn certificates(what: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { what, reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Pem { what, reason: "no certificate in it".into() });
    }
    Ok(certs)
}

/// Whether `cert` was issued for `node_name`; if not, why.
pub(crate) fn certified_for(cert: &CertificateDer<'_>, node_name: &str) -> Result<(), String> {
    let name = ServerName::try_from(node_name).map_err(|e| format!("not a DNS name: {e}"))?;
    let parsed = ParsedCertificate::try_from(cert).map_err(|e| e.to_string())?;
    rustls::client::verify_server_name(&parsed, &name).map_err(|e| e.to_string())
}

/// The dialer's check of the acceptor's certificate: signed by the cluster's CA, in its validity
/// period, for server use. Its name is checked after the handshake (see the module docs).
#[derive(Debug)]
struct ClusterCa {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ClusterCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Only TLS 1.3 is offered, so this is never asked.
        Err(rustls::Error::General("TLS 1.2 is not offered".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
