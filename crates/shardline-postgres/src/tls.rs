//! TLS to the database, with libpq's `sslmode` and `sslrootcert` in the connection string:
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default, as libpq's) | when the server offers it | not checked |
//! | `require` | always | not checked |
//! | `verify-ca` | always | signed by `sslrootcert` |
//! | `verify-full` | always | signed by `sslrootcert`, for the host connected to |
//!
//! `prefer` and `require` encrypt without proving who answers, as libpq's do: beyond a trusted
//! network, use `verify-full`. The verifying modes need `sslrootcert` (a PEM file of the CA);
//! libpq's default file in the home directory is not read. Credentials go in the string as usual
//! (`postgres://user:password@host/db`).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode;

use shardline::journal::JournalError;

/// How the connection string asks for TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The connection string for tokio-postgres (without what it does not know), and the TLS that
/// goes with it (`None`: plain TCP).
pub(crate) fn settings(url: &str) -> Result<(tokio_postgres::Config, Option<ClientConfig>), JournalError> {
    let bad = |reason: String| JournalError::Failed(format!("database url: {reason}"));
    let (rest, options) = split_options(url);
    let mut mode = Mode::Prefer;
    let mut root = None;
    let mut kept = Vec::new();
    for (key, value) in options {
        match key.as_str() {
            "sslmode" => {
                mode = match value.as_str() {
                    "disable" => Mode::Disable,
                    "prefer" => Mode::Prefer,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    other => {
                        return Err(bad(format!(
                            "sslmode {other:?}: disable, prefer, require, verify-ca or verify-full"
                        )))
                    }
                }
            }
            "sslrootcert" => root = Some(value),
            _ => kept.push((key, value)),
        }
    }
    let url = join_options(&rest, url, &kept);
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| bad(format!("{e}")))?;
    config.ssl_mode(match mode {
        Mode::Disable => SslMode::Disable,
        Mode::Prefer => SslMode::Prefer,
        _ => SslMode::Require,
    });
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e}")))?;
    let tls = match (mode, root) {
        (Mode::Disable, _) => None,
        (Mode::Prefer | Mode::Require, _) => Some(
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly { roots: None, provider }))
                .with_no_client_auth(),
        ),
        (Mode::VerifyCa | Mode::VerifyFull, None) => {
            return Err(bad("sslmode verify-ca and verify-full need sslrootcert=PATH, the server's CA (PEM)".into()))
        }
        (Mode::VerifyCa | Mode::VerifyFull, Some(path)) => {
            let pem = std::fs::read(&path).map_err(|e| bad(format!("sslrootcert {path}: {e}")))?;
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(&pem) {
                let c = c.map_err(|e| bad(format!("sslrootcert {path}: {e}")))?;
                roots.add(c).map_err(|e| bad(format!("sslrootcert {path}: {e}")))?;
            }
            if roots.is_empty() {
                return Err(bad(format!("sslrootcert {path}: no PEM certificate in it")));
            }
            let roots = Arc::new(roots);
            let verifier: Arc<dyn ServerCertVerifier> = match mode {
                Mode::VerifyCa => Arc::new(ChainOnly { roots: Some(roots), provider }),
                _ => WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| bad(format!("sslrootcert {path}: {e}")))?,
            };
            Some(builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth())
        }
    };
    Ok((config, tls))
}

/// The string without its options, and its options: `?k=v&…` of a URL, or the `k=v` words of a
/// key=value string.
fn split_options(url: &str) -> (String, Vec<(String, String)>) {
    let pair = |kv: &str| kv.split_once('=').map(|(k, v)| (k.trim().to_string(), v.trim().to_string()));
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            Some((base, query)) => (base.to_string(), query.split('&').filter_map(pair).collect()),
            None => (url.to_string(), Vec::new()),
        }
    } else {
        (String::new(), url.split_whitespace().filter_map(pair).collect())
    }
}

fn join_options(base: &str, url: &str, options: &[(String, String)]) -> String {
    let kv: Vec<String> = options.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        if kv.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kv.join("&"))
        }
    } else {
        kv.join(" ")
    }
}

/// `prefer` and `require` (no roots): any certificate, as libpq takes it. `verify-ca` (roots):
/// a chain to them, whatever name the certificate is for, as the transport checks a peer's
/// (`transport::tls`). Either way the handshake's signatures are checked: the server holds the
/// key of the certificate it showed.
#[derive(Debug)]
struct ChainOnly {
    roots: Option<Arc<RootCertStore>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            let algorithms = self.provider.signature_verification_algorithms.all;
            rustls::client::verify_server_cert_signed_by_trust_anchor(&cert, roots, intermediates, now, algorithms)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_options_are_read_and_the_rest_is_kept() {
        let (c, tls) = settings("postgres://u@h:5432/db?application_name=x&sslmode=disable").unwrap();
        assert!(tls.is_none());
        assert_eq!(c.get_ssl_mode(), SslMode::Disable);
        assert_eq!(c.get_application_name(), Some("x"));
        let (c, tls) = settings("postgres://u@h/db").unwrap();
        assert!(tls.is_some(), "prefer, as libpq");
        assert_eq!(c.get_ssl_mode(), SslMode::Prefer);
        let (c, _) = settings("host=h user=u sslmode=require").unwrap();
        assert_eq!(c.get_ssl_mode(), SslMode::Require);
        for refused in [
            "postgres://u@h/db?sslmode=sometimes",
            "postgres://u@h/db?sslmode=verify-full",
            "postgres://u@h/db?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem",
        ] {
            assert!(settings(refused).is_err(), "{refused}");
        }
    }
}
