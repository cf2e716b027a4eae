//! A development CA and node certificates (`shardline certs`, the demo's `--tls`, tests).
//!
//! For trying TLS out, not for production: the CA's key is written beside the certificates.
//! Production clusters take their certificates from their own CA (cert-manager, Vault, …); all
//! a node needs is a certificate for its node name with the server and client key usages.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// `params.not_before = date(t)`, without naming the date type rcgen takes.
macro_rules! date {
    ($t:expr) => {
        rcgen::date_time_ymd(1970, 1, 1) + $t.duration_since(UNIX_EPOCH).unwrap_or_default()
    };
}

/// Why certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum DevCertError {
    /// Generating a key or signing a certificate failed.
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A node name is not a DNS name, so no certificate can name it.
    #[error("node name {0:?} is not a DNS name, which a certificate could name")]
    BadName(String),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A certificate and its key, in PEM.
#[derive(Clone)]
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
}

/// A development certificate authority.
pub struct DevCa {
    issuer: Issuer<'static, KeyPair>,
    pem: Pem,
}

impl DevCa {
    /// A new CA with a fresh key, valid for ten years.
    pub fn new(name: &str) -> Result<DevCa, DevCertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let now = SystemTime::now();
        params.not_before = date!(now - Duration::from_secs(86_400));
        params.not_after = date!(now + Duration::from_secs(10 * 365 * 86_400));
        let cert = params.self_signed(&key)?;
        let pem = Pem { cert: cert.pem(), key: key.serialize_pem() };
        Ok(DevCa { issuer: Issuer::new(params, key), pem })
    }

    /// The CA's certificate and key.
    pub fn pem(&self) -> &Pem {
        &self.pem
    }

    /// A certificate for node `name`, valid for `days` from a day ago.
    pub fn node(&self, name: &str, days: u32) -> Result<Pem, DevCertError> {
        let now = SystemTime::now();
        self.node_valid(name, now - Duration::from_secs(86_400), now + Duration::from_secs(u64::from(days) * 86_400))
    }

    /// A certificate for node `name` valid from `not_before` to `not_after` (tests make expired
    /// ones with it).
    pub fn node_valid(&self, name: &str, not_before: SystemTime, not_after: SystemTime) -> Result<Pem, DevCertError> {
        if rustls::pki_types::DnsName::try_from(name).is_err() {
            return Err(DevCertError::BadName(name.into()));
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![name.to_string()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = date!(not_before);
        params.not_after = date!(not_after);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Pem { cert: cert.pem(), key: key.serialize_pem() })
    }
}

/// Writes a new CA (`ca.pem`, `ca.key`) and a certificate per node (`NODE.pem`, `NODE.key`) to
/// `dir`, keys readable by their owner only. Returns the files written.
pub fn write_dev_certs(dir: &Path, nodes: &[String], days: u32) -> Result<Vec<PathBuf>, DevCertError> {
    for n in nodes {
        if rustls::pki_types::DnsName::try_from(n.as_str()).is_err() {
            return Err(DevCertError::BadName(n.clone()));
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| DevCertError::Write { path: dir.into(), source })?;
    let ca = DevCa::new("shardline development CA")?;
    let mut written = Vec::new();
    let mut put = |name: &str, pem: &Pem| -> Result<(), DevCertError> {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key"));
        write(&cert, &pem.cert, 0o644)?;
        write(&key, &pem.key, 0o600)?;
        written.extend([cert, key]);
        Ok(())
    };
    put("ca", ca.pem())?;
    for n in nodes {
        put(n, &ca.node(n, days)?)?;
    }
    Ok(written)
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), DevCertError> {
    use std::io::Write;
    let failed = |source| DevCertError::Write { path: path.into(), source };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut f = options.open(path).map_err(failed)?;
    // A file that was there already keeps its mode unless told.
    #[cfg(unix)]
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode)).map_err(failed)?;
    f.write_all(text.as_bytes()).map_err(failed)
}
