//! A node's settings from the environment or a file, under the names `shardline node` reads (and
//! two of the library's own): a deployment configures a library node and a CLI node alike (a
//! Kubernetes manifest's `env`, a systemd `EnvironmentFile`). A value that is set and cannot be
//! read, or honoured, is an error naming its variable, never a default.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::ConfigError;
use crate::membership::Gossip;
use crate::transport::TlsConfig;

use super::{Cluster, ClusterBuilder};

/// The variables read (see [`ClusterBuilder::from_env`] for what each sets).
const KNOWN: [&str; 11] = [
    "SHARDLINE_CLUSTER",
    "SHARDLINE_NAME",
    "SHARDLINE_BIND",
    "SHARDLINE_SEEDS",
    "SHARDLINE_ROLES",
    "SHARDLINE_WEIGHT",
    "SHARDLINE_APP_VERSION",
    "SHARDLINE_OWNERSHIP_LOG",
    "SHARDLINE_TLS_CERT",
    "SHARDLINE_TLS_KEY",
    "SHARDLINE_TLS_CA",
];

/// `shardline node`'s membership settings, which a builder takes in code
/// ([`ClusterBuilder::membership`]): set, they would be ignored, and the node would join some
/// other way than its deployment says. `SHARDLINE_MEMBERSHIP=seeds` is what the settings give.
const MEMBERSHIP_IN_CODE: [&str; 3] = ["SHARDLINE_MEMBERSHIP", "SHARDLINE_SPLIT_BRAIN", "SHARDLINE_STABLE_AFTER_MS"];

impl ClusterBuilder {
    /// A builder with the settings of the `SHARDLINE_*` environment variables that are set:
    /// those `shardline node` reads, `SHARDLINE_CLUSTER`, `SHARDLINE_NAME`, `SHARDLINE_BIND`,
    /// `SHARDLINE_SEEDS` (gossip through these seeds), `SHARDLINE_APP_VERSION`,
    /// `SHARDLINE_OWNERSHIP_LOG`, and `SHARDLINE_TLS_CERT`, `SHARDLINE_TLS_KEY`,
    /// `SHARDLINE_TLS_CA` (all three or none); and the library's `SHARDLINE_ROLES` (comma
    /// separated) and `SHARDLINE_WEIGHT`. What is not set keeps the builder's default; the
    /// builder's methods still apply after it. Other `SHARDLINE_*` variables of the CLI (its
    /// journal, its admin API, an entity type's shards) are not a node's settings and are left
    /// to the application.
    ///
    /// A variable that is set and cannot be read (not UTF-8, empty, a port that is no port, one
    /// TLS file without the others, a file that cannot be read) is a
    /// [`ConfigError::Invalid`] naming it; so is one of the CLI's membership settings
    /// (`SHARDLINE_MEMBERSHIP` other than `seeds`, `SHARDLINE_SPLIT_BRAIN`,
    /// `SHARDLINE_STABLE_AFTER_MS`), which a library node takes in code: ignored, the node
    /// would join another way than its deployment says.
    pub fn from_env() -> Result<ClusterBuilder, ConfigError> {
        let mut vars = BTreeMap::new();
        for name in KNOWN.into_iter().chain(MEMBERSHIP_IN_CODE) {
            match std::env::var(name) {
                Ok(v) => {
                    vars.insert(name, v);
                }
                Err(std::env::VarError::NotPresent) => {}
                Err(std::env::VarError::NotUnicode(_)) => return Err(invalid(name, "not UTF-8".into())),
            }
        }
        settings(vars)
    }

    /// A builder with the settings of a file of `NAME=VALUE` lines, with the names of
    /// [`from_env`](Self::from_env) (blank lines and lines starting with `#` are skipped; a value
    /// may be in double quotes): the format of a systemd `EnvironmentFile` or a `.env` file. A
    /// line that is not `NAME=VALUE`, a name that is not one of them, or a name given twice is an
    /// error naming the line.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = std::env::temp_dir().join(format!("shardline-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let file = dir.join("node.env");
    /// std::fs::write(&file, "# node 1\nSHARDLINE_CLUSTER=shop\nSHARDLINE_BIND=\"127.0.0.1:0\"\n")?;
    /// let builder = shardline::ClusterBuilder::from_file(&file)?;
    ///
    /// std::fs::write(&file, "SHARDLINE_BIMD=127.0.0.1:7101\n")?;
    /// let typo = shardline::ClusterBuilder::from_file(&file).err().unwrap();
    /// assert!(typo.to_string().contains("SHARDLINE_BIMD"), "{typo}");
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<ClusterBuilder, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Invalid { name: "settings file", reason: format!("{}: {e}", path.display()) })?;
        let mut vars = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = |what: String| ConfigError::Invalid {
                name: "settings file",
                reason: format!("{} line {}: {what}", path.display(), n + 1),
            };
            let Some((name, value)) = line.split_once('=') else {
                return Err(at(format!("{line:?} is not NAME=VALUE")));
            };
            let name = name.trim();
            let Some(known) = KNOWN.iter().chain(&MEMBERSHIP_IN_CODE).find(|k| **k == name) else {
                return Err(at(format!("{name} is not a setting (the settings: {})", KNOWN.join(", "))));
            };
            let value = unquoted(value.trim()).map_err(|why| at(format!("{name}: {why}")))?;
            if vars.insert(*known, value.to_string()).is_some() {
                return Err(at(format!("{name} is given twice")));
            }
        }
        settings(vars)
    }
}

/// A value as a systemd `EnvironmentFile` gives it: in double or single quotes, or bare.
fn unquoted(v: &str) -> Result<&str, String> {
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q) {
            return inner.strip_suffix(q).ok_or_else(|| format!("{v} has no closing {q}"));
        }
    }
    if v.ends_with(['"', '\'']) {
        return Err(format!("{v} has no opening quote"));
    }
    Ok(v)
}

fn invalid(name: &'static str, reason: String) -> ConfigError {
    ConfigError::Invalid { name, reason }
}

/// A non-empty value.
fn text(vars: &BTreeMap<&'static str, String>, name: &'static str) -> Result<Option<String>, ConfigError> {
    match vars.get(name) {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Err(invalid(name, "set but empty".into())),
        Some(v) => Ok(Some(v.trim().to_string())),
    }
}

/// A comma-separated list of non-empty items.
fn list(vars: &BTreeMap<&'static str, String>, name: &'static str) -> Result<Option<Vec<String>>, ConfigError> {
    let Some(v) = text(vars, name)? else { return Ok(None) };
    let items: Vec<String> = v.split(',').map(|s| s.trim().to_string()).collect();
    if items.iter().any(String::is_empty) {
        return Err(invalid(name, format!("{v:?} has an empty item")));
    }
    Ok(Some(items))
}

/// `HOST:PORT` (an IPv6 host in brackets).
fn address(name: &'static str, a: &str) -> Result<(), ConfigError> {
    let bad = |why: &str| invalid(name, format!("{a:?} is not HOST:PORT: {why}"));
    let (host, port) = a.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    if host.is_empty() {
        return Err(bad("no host"));
    }
    port.parse::<u16>().map(drop).map_err(|_| bad("the port is not a number from 0 to 65535"))
}

fn settings(vars: BTreeMap<&'static str, String>) -> Result<ClusterBuilder, ConfigError> {
    for name in MEMBERSHIP_IN_CODE {
        match vars.get(name).map(|v| v.trim()) {
            None => {}
            Some("seeds") if name == "SHARDLINE_MEMBERSHIP" => {}
            Some(v) => {
                return Err(invalid(
                    name,
                    format!("{v:?}: a library node takes its membership in code (ClusterBuilder::membership), not from {name}; unset it, or give the builder the provider"),
                ))
            }
        }
    }
    let mut b = Cluster::builder();
    if let Some(v) = text(&vars, "SHARDLINE_CLUSTER")? {
        b = b.cluster_name(v);
    }
    if let Some(v) = text(&vars, "SHARDLINE_NAME")? {
        b = b.node_name(v);
    }
    if let Some(v) = text(&vars, "SHARDLINE_BIND")? {
        address("SHARDLINE_BIND", &v)?;
        b = b.bind(v);
    }
    if let Some(seeds) = list(&vars, "SHARDLINE_SEEDS")? {
        for s in &seeds {
            address("SHARDLINE_SEEDS", s)?;
        }
        b = b.membership(Gossip::new(seeds));
    }
    for r in list(&vars, "SHARDLINE_ROLES")?.unwrap_or_default() {
        b = b.role(r);
    }
    if let Some(v) = text(&vars, "SHARDLINE_WEIGHT")? {
        match v.parse::<u32>() {
            Ok(w) if w >= 1 => b = b.weight(w),
            _ => return Err(invalid("SHARDLINE_WEIGHT", format!("{v:?} is not a whole number from 1"))),
        }
    }
    if let Some(v) = text(&vars, "SHARDLINE_APP_VERSION")? {
        b = b.app_version(v);
    }
    if let Some(v) = text(&vars, "SHARDLINE_OWNERSHIP_LOG")? {
        b = b.ownership_log(v);
    }
    let tls = (text(&vars, "SHARDLINE_TLS_CERT")?, text(&vars, "SHARDLINE_TLS_KEY")?, text(&vars, "SHARDLINE_TLS_CA")?);
    match tls {
        (None, None, None) => {}
        (Some(cert), Some(key), Some(ca)) => {
            let tls = TlsConfig::from_files(&cert, &key, &ca).map_err(|e| invalid("SHARDLINE_TLS_*", e.to_string()))?;
            b = b.tls(tls);
        }
        _ => {
            return Err(invalid(
                "SHARDLINE_TLS_CERT",
                "SHARDLINE_TLS_CERT, SHARDLINE_TLS_KEY and SHARDLINE_TLS_CA go together: some are set, not all".into(),
            ))
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&'static str, &str)]) -> Result<ClusterBuilder, ConfigError> {
        settings(pairs.iter().map(|(k, v)| (*k, v.to_string())).collect())
    }

    fn refused(pairs: &[(&'static str, &str)]) -> String {
        match from(pairs) {
            Ok(_) => panic!("{pairs:?} was taken"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn what_is_set_is_taken() {
        let b = from(&[
            ("SHARDLINE_CLUSTER", "shop"),
            ("SHARDLINE_NAME", "node-1"),
            ("SHARDLINE_BIND", "0.0.0.0:7101"),
            ("SHARDLINE_SEEDS", "10.0.0.1:7101, [::1]:7101"),
            ("SHARDLINE_ROLES", "web,worker"),
            ("SHARDLINE_WEIGHT", "3"),
            ("SHARDLINE_APP_VERSION", "1.2.0"),
        ])
        .unwrap();
        assert_eq!(b.cluster_name, "shop");
        assert_eq!(b.node_name.as_deref(), Some("node-1"));
        assert_eq!(b.bind, "0.0.0.0:7101");
        assert!(b.membership.is_some());
        assert_eq!(b.roles, ["web", "worker"]);
        assert_eq!(b.weight, 3);
        assert_eq!(b.app_version, "1.2.0");
        let d = from(&[]).unwrap();
        assert_eq!(
            (d.cluster_name, d.bind, d.membership.is_none()),
            (Cluster::builder().cluster_name, Cluster::builder().bind, true)
        );
    }

    #[test]
    fn what_cannot_be_read_is_an_error_naming_its_variable() {
        assert!(refused(&[("SHARDLINE_BIND", "7101")]).contains("SHARDLINE_BIND"));
        assert!(refused(&[("SHARDLINE_BIND", "host:71010")]).contains("port"));
        assert!(refused(&[("SHARDLINE_SEEDS", "a:1,,b:2")]).contains("empty item"));
        assert!(refused(&[("SHARDLINE_SEEDS", "a:1,b")]).contains("SHARDLINE_SEEDS"));
        assert!(refused(&[("SHARDLINE_WEIGHT", "0")]).contains("SHARDLINE_WEIGHT"));
        assert!(refused(&[("SHARDLINE_WEIGHT", "-2")]).contains("SHARDLINE_WEIGHT"));
        assert!(refused(&[("SHARDLINE_NAME", " ")]).contains("empty"));
        assert!(refused(&[("SHARDLINE_SPLIT_BRAIN", "off")]).contains("SHARDLINE_SPLIT_BRAIN"));
        assert!(refused(&[("SHARDLINE_MEMBERSHIP", "etcd://127.0.0.1:2379")]).contains("in code"));
        assert!(refused(&[("SHARDLINE_TLS_CERT", "c.pem"), ("SHARDLINE_TLS_KEY", "k.pem")]).contains("go together"));
        let missing = refused(&[
            ("SHARDLINE_TLS_CERT", "/nope/c"),
            ("SHARDLINE_TLS_KEY", "/nope/k"),
            ("SHARDLINE_TLS_CA", "/nope/a"),
        ]);
        assert!(missing.contains("/nope/c"), "{missing}");
    }

    #[test]
    fn a_file_is_read_line_by_line() {
        let dir = std::env::temp_dir().join(format!("shardline-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("node.env");
        let read = |text: &str| {
            std::fs::write(&file, text).unwrap();
            ClusterBuilder::from_file(&file)
        };
        let b = read("# a node\n\nSHARDLINE_CLUSTER = \"shop\"\nSHARDLINE_WEIGHT=2\nSHARDLINE_NAME='n 1'\n").unwrap();
        assert_eq!((b.cluster_name.as_str(), b.weight, b.node_name.as_deref()), ("shop", 2, Some("n 1")));
        let e = read("SHARDLINE_NAME='n1\n").err().unwrap().to_string();
        assert!(e.contains("closing"), "{e}");
        let e = read("SHARDLINE_MEMBERSHIP=etcd://127.0.0.1:2379\n").err().unwrap().to_string();
        assert!(e.contains("in code"), "{e}");
        assert!(read("SHARDLINE_MEMBERSHIP=seeds\n").is_ok());
        let e = read("SHARDLINE_CLUSTER=shop\nSHARDLINE_CLUSTER=other\n").err().unwrap().to_string();
        assert!(e.contains("line 2") && e.contains("twice"), "{e}");
        let e = read("SHARDLINE_CLUSTER shop\n").err().unwrap().to_string();
        assert!(e.contains("line 1") && e.contains("NAME=VALUE"), "{e}");
        let e = read("SHARDLINE_WEIGHT=heavy\n").err().unwrap().to_string();
        assert!(e.contains("SHARDLINE_WEIGHT"), "{e}");
        let gone = ClusterBuilder::from_file(dir.join("absent.env")).err().unwrap().to_string();
        assert!(gone.contains("absent.env"), "{gone}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
