//! `--store sqlite://PATH | postgres://… | memory`: where durable entities keep their journal.
//!
//! SQLite is compiled in and always available; PostgreSQL is the `postgres` cargo feature of this
//! crate. A spec naming a store this build lacks is an error that says which feature to turn on.

use std::sync::Arc;

use shardline::journal::{InMemoryJournal, Journal, SplitJournal};
use shardline_sqlite::{SqliteJournal, SqliteOptions, Synchronous};

/// A parsed `--store` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    /// In memory (one process only; for tests).
    Memory,
    /// The SQLite file at this path (`sqlite://PATH`), synced at every commit unless
    /// `?synchronous=normal` says otherwise (see [`Synchronous`]).
    Sqlite {
        /// The file.
        path: String,
        /// When commits reach the disk.
        synchronous: Synchronous,
    },
    /// PostgreSQL at this URL.
    Postgres(String),
    /// One journal split over these PostgreSQL databases (`URL,URL,…`, the same list in the
    /// same order on every node; see `SplitJournal`).
    PostgresSplit(Vec<String>),
}

/// Whether `s` is a PostgreSQL URL (a scheme and something after it).
fn is_postgres(s: &str) -> bool {
    ["postgres://", "postgresql://"].iter().any(|p| s.len() > p.len() && s.starts_with(p))
}

/// `URL,URL,…` cut before each comma that starts another PostgreSQL URL (a comma inside one, as
/// in a list of hosts, stays).
fn postgres_list(s: &str) -> Vec<&str> {
    let mut cuts: Vec<usize> = s.match_indices(',').map(|(i, _)| i).filter(|i| is_postgres(&s[i + 1..])).collect();
    cuts.push(s.len());
    let mut start = 0;
    cuts.into_iter()
        .map(|end| {
            let url = &s[start..end];
            start = end + 1;
            url
        })
        .collect()
}

impl std::str::FromStr for StoreSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "memory" {
            Ok(StoreSpec::Memory)
        } else if let Some(rest) = s.strip_prefix("sqlite://").filter(|p| !p.is_empty()) {
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            if path.is_empty() {
                return Err(format!("sqlite://PATH: no path in {s:?}"));
            }
            let mut synchronous = Synchronous::Full;
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                match pair.split_once('=') {
                    Some(("synchronous", v)) => synchronous = v.parse()?,
                    _ => {
                        return Err(format!("sqlite://PATH: unknown option {pair:?} (known: synchronous=full|normal)"))
                    }
                }
            }
            Ok(StoreSpec::Sqlite { path: path.to_string(), synchronous })
        } else if is_postgres(s) {
            let urls = postgres_list(s);
            match urls.as_slice() {
                [one] => Ok(StoreSpec::Postgres(one.to_string())),
                many => Ok(StoreSpec::PostgresSplit(many.iter().map(|u| u.to_string()).collect())),
            }
        } else {
            Err(format!("expected memory, sqlite://PATH or postgres://USER@HOST:PORT/DATABASE, got {s:?}"))
        }
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Memory => f.write_str("memory"),
            StoreSpec::Sqlite { path, synchronous: Synchronous::Full } => write!(f, "sqlite://{path}"),
            StoreSpec::Sqlite { path, synchronous: Synchronous::Normal } => {
                write!(f, "sqlite://{path}?synchronous=normal")
            }
            StoreSpec::Postgres(u) => f.write_str(u),
            StoreSpec::PostgresSplit(urls) => f.write_str(&urls.join(",")),
        }
    }
}

impl StoreSpec {
    /// The store's kind, as the JSON reports name it.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreSpec::Memory => "memory",
            StoreSpec::Sqlite { .. } => "sqlite",
            StoreSpec::Postgres(_) | StoreSpec::PostgresSplit(_) => "postgres",
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
        StoreSpec::Sqlite { path, synchronous } => {
            let options = SqliteOptions { synchronous: *synchronous, ..SqliteOptions::default() };
            let journal =
                SqliteJournal::open_with(path, options).map_err(|e| format!("SQLite journal at {path}: {e}"))?;
            Ok(Arc::new(journal))
        }
        StoreSpec::Postgres(url) => postgres(url, schema).await,
        StoreSpec::PostgresSplit(urls) => {
            let mut parts = Vec::new();
            for url in urls {
                parts.push(postgres(url, schema).await?);
            }
            let split = SplitJournal::new(parts).ok_or_else(|| "a journal split over no database".to_string())?;
            Ok(Arc::new(split))
        }
    }
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str, schema: &str) -> Result<Arc<dyn Journal>, String> {
    let config = shardline_postgres::PostgresConfig::new(url).schema(schema);
    let j = shardline_postgres::PostgresJournal::connect(config)
        .await
        .map_err(|e| format!("PostgreSQL at {}: {e}", crate::redacted(url)))?;
    Ok(Arc::new(j))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(url: &str, _schema: &str) -> Result<Arc<dyn Journal>, String> {
    Err(format!(
        "--store {} needs the `postgres` feature, which this build lacks: \
         rebuild with `cargo build --release -p shardline-cli --features postgres`",
        crate::redacted(url)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_specs_parse_or_say_what_is_expected() {
        assert_eq!("memory".parse(), Ok(StoreSpec::Memory));
        let sqlite = |path: &str, synchronous| StoreSpec::Sqlite { path: path.into(), synchronous };
        assert_eq!("sqlite:///var/lib/x.db".parse(), Ok(sqlite("/var/lib/x.db", Synchronous::Full)));
        assert_eq!("sqlite://x.db?synchronous=normal".parse(), Ok(sqlite("x.db", Synchronous::Normal)));
        assert_eq!("sqlite://x.db?synchronous=FULL".parse(), Ok(sqlite("x.db", Synchronous::Full)));
        for bad in ["sqlite://x.db?synchronous=off", "sqlite://x.db?fsync=0", "sqlite://?synchronous=full"] {
            assert!(bad.parse::<StoreSpec>().is_err(), "{bad:?}");
        }
        let pg = "postgres://postgres@127.0.0.1:5432/test";
        assert_eq!(pg.parse(), Ok(StoreSpec::Postgres(pg.into())));
        for bad in ["", "sqlite://", "postgres://", "mysql://x", "/tmp/x.db"] {
            let err = bad.parse::<StoreSpec>().unwrap_err();
            assert!(err.contains("expected memory, sqlite://PATH"), "{bad:?}: {err}");
        }
        assert_eq!(sqlite("a.db", Synchronous::Full).to_string(), "sqlite://a.db");
        let normal = sqlite("a.db", Synchronous::Normal);
        assert_eq!(normal.to_string().parse(), Ok(normal), "a spec survives its display (nodes get it so)");
        assert_eq!(schema_name("Shardline-demo.1"), "shardline_demo_1");
        // Several databases: cut before each URL, a list of hosts inside one kept.
        let two = "postgres://postgres@127.0.0.1:5432/test,postgresql://u@h1:1,h2:2/db?x=1";
        let split = StoreSpec::PostgresSplit(vec![
            "postgres://postgres@127.0.0.1:5432/test".into(),
            "postgresql://u@h1:1,h2:2/db?x=1".into(),
        ]);
        assert_eq!(two.parse(), Ok(split.clone()));
        assert_eq!(split.to_string(), two, "a list survives its display");
        assert_eq!("postgres://h1:1,h2:2/db".parse(), Ok(StoreSpec::Postgres("postgres://h1:1,h2:2/db".into())));
    }
}
