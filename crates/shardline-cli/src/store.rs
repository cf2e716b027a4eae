//! `--store sqlite://PATH | postgres://… | memory`: where durable entities keep their journal.
//!
//! SQLite is compiled in and always available; PostgreSQL is the `postgres` cargo feature of this
//! crate. A spec naming a store this build lacks is an error that says which feature to turn on.

use std::sync::Arc;

use shardline::journal::{InMemoryJournal, Journal};
use shardline_sqlite::SqliteJournal;

/// A parsed `--store` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    /// In memory (one process only; for tests).
    Memory,
    /// The SQLite file at this path.
    Sqlite(String),
    /// PostgreSQL at this URL.
    Postgres(String),
}

impl std::str::FromStr for StoreSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "memory" {
            Ok(StoreSpec::Memory)
        } else if let Some(path) = s.strip_prefix("sqlite://").filter(|p| !p.is_empty()) {
            Ok(StoreSpec::Sqlite(path.to_string()))
        } else if ["postgres://", "postgresql://"].iter().any(|p| s.len() > p.len() && s.starts_with(p)) {
            Ok(StoreSpec::Postgres(s.to_string()))
        } else {
            Err(format!("expected memory, sqlite://PATH or postgres://USER@HOST:PORT/DATABASE, got {s:?}"))
        }
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Memory => f.write_str("memory"),
            StoreSpec::Sqlite(p) => write!(f, "sqlite://{p}"),
            StoreSpec::Postgres(u) => f.write_str(u),
        }
    }
}

impl StoreSpec {
    /// The store's kind, as the JSON reports name it.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreSpec::Memory => "memory",
            StoreSpec::Sqlite(_) => "sqlite",
            StoreSpec::Postgres(_) => "postgres",
        }
    }
}

/// A PostgreSQL schema name for a cluster name: letters, digits and underscores.
pub fn schema_name(cluster: &str) -> String {
    cluster.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect()
}

/// Opens the journal of a spec; `schema` names PostgreSQL's schema. An unreachable store is an
/// error.
pub async fn open(spec: &StoreSpec, schema: &str) -> Result<Arc<dyn Journal>, String> {
    match spec {
        StoreSpec::Memory => Ok(Arc::new(InMemoryJournal::new())),
        StoreSpec::Sqlite(path) => {
            Ok(Arc::new(SqliteJournal::open(path).map_err(|e| format!("SQLite journal at {path}: {e}"))?))
        }
        StoreSpec::Postgres(url) => postgres(url, schema).await,
    }
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str, schema: &str) -> Result<Arc<dyn Journal>, String> {
    let config = shardline_postgres::PostgresConfig::new(url).schema(schema);
    let j =
        shardline_postgres::PostgresJournal::connect(config).await.map_err(|e| format!("PostgreSQL at {url}: {e}"))?;
    Ok(Arc::new(j))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(url: &str, _schema: &str) -> Result<Arc<dyn Journal>, String> {
    Err(format!(
        "--store {url} needs the `postgres` feature, which this build lacks: \
         rebuild with `cargo build --release -p shardline-cli --features postgres`"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_specs_parse_or_say_what_is_expected() {
        assert_eq!("memory".parse(), Ok(StoreSpec::Memory));
        assert_eq!("sqlite:///var/lib/x.db".parse(), Ok(StoreSpec::Sqlite("/var/lib/x.db".into())));
        let pg = "postgres://postgres@127.0.0.1:5432/test";
        assert_eq!(pg.parse(), Ok(StoreSpec::Postgres(pg.into())));
        for bad in ["", "sqlite://", "postgres://", "mysql://x", "/tmp/x.db"] {
            let err = bad.parse::<StoreSpec>().unwrap_err();
            assert!(err.contains("expected memory, sqlite://PATH"), "{bad:?}: {err}");
        }
        assert_eq!(StoreSpec::Sqlite("a.db".into()).to_string(), "sqlite://a.db");
        assert_eq!(schema_name("Shardline-demo.1"), "shardline_demo_1");
    }
}
