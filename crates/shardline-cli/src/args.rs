//! Command line.

use clap::{Args, Parser, Subcommand};
use shardline::membership::lease::LeaseConfig;
use shardline::GossipConfig;
use shardline_cli::membership::{resolve_split_brain, MembershipSpec, SplitBrainArg};
use shardline_cli::store::StoreSpec;
use shardline_cli::StrategyArg;

/// Shardline: cluster sharding for Rust.
#[derive(Parser, Debug)]
#[command(name = "shardline", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one node of the demo application.
    Node(NodeArgs),
    /// Run a local demo cluster of separate processes under load, through scale-out, graceful
    /// leave and kill -9, checking every account against a ledger.
    Demo(DemoArgs),
    /// Run the demo's ledger load against a cluster this process did not start, as a proxy
    /// member, and audit every account it wrote at the end.
    Load(LoadArgs),
    /// Measure the runtime against its physical baselines.
    Bench(BenchArgs),
    /// The cluster as a node sees it: the leader, and every member with its status and what it
    /// hosts.
    Status(AdminArgs),
    /// An entity type's shard map: shards per node, then every shard's node and epoch.
    Shards {
        /// The entity type (default: the only one registered).
        #[arg(long = "type")]
        type_key: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Drain a member: it hands its shards off and leaves the cluster.
    Drain {
        /// The member's name (default: `SHARDLINE_NAME`, this node's own name where a node runs,
        /// so that a pod's `preStop` hook is `shardline drain`).
        #[arg(env = "SHARDLINE_NAME")]
        node: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Ask the leader to rebalance an entity type now rather than at its next periodic check.
    Rebalance {
        /// The entity type.
        #[arg(long = "type")]
        type_key: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Make a development CA and a certificate per node for mutual TLS between nodes: `ca.pem`,
    /// `ca.key`, `NODE.pem`, `NODE.key` (keys readable by their owner only). Not for production.
    Certs {
        /// Directory to write them to (created if missing; files there are replaced).
        #[arg(long)]
        out: std::path::PathBuf,
        /// Node names, comma separated (each a DNS name: letters, digits, '-' and '.').
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// Days the node certificates are valid.
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
        days: u32,
    },
    /// Check recorded histories (`shardline load --history FILE`, the demo's): every
    /// acknowledged write applied exactly once, nothing answered "not applied" applied, reads
    /// linearizable per account; with `--ownership-log`, no shard on two nodes at once. Prints
    /// the findings as JSON; exit 1 on a violation, 2 when a file cannot be read.
    Check {
        /// History files (one JSON operation per line), of one run.
        #[arg(required = true)]
        histories: Vec<std::path::PathBuf>,
        /// The nodes' ownership log (`shardline node --ownership-log`).
        #[arg(long)]
        ownership_log: Option<std::path::PathBuf>,
        /// A node killed with kill -9, and when (milliseconds since the Unix epoch): its shards
        /// end there. Repeatable.
        #[arg(long = "killed", value_name = "NAME@MS", value_parser = parse_killed)]
        killed: Vec<(String, u128)>,
    },
    /// (internal) A bare TCP echo server, the baseline of `bench --scenario remote-ask`.
    #[command(hide = true)]
    EchoServer {
        /// Address to listen on.
        #[arg(long)]
        bind: String,
    },
    /// (internal) One floor of the ask benches in a process of its own: `local` (a task per
    /// entity behind a channel) or `remote` (callers multiplexed over one connection to an echo
    /// server). Prints its rate as JSON.
    #[command(hide = true)]
    Floor {
        /// `local` or `remote`.
        kind: String,
        /// The echo server (remote).
        #[arg(long)]
        addr: Option<String>,
        /// Concurrent callers.
        #[arg(long, default_value_t = 64)]
        callers: u64,
        /// Entities (local).
        #[arg(long, default_value_t = 1_000)]
        entities: u64,
        /// How long to run.
        #[arg(long, default_value_t = 2_000)]
        duration_ms: u64,
    },
}

/// How the admin commands reach the cluster.
#[derive(Args, Debug, Clone)]
pub struct AdminArgs {
    /// The admin API of any node of the cluster, http://HOST:PORT or https://HOST:PORT.
    #[arg(long = "admin", env = "SHARDLINE_ADMIN_URL")]
    pub url: String,
    /// The CA certificate (PEM) that signed an https admin API's certificate.
    #[arg(long = "admin-ca", env = "SHARDLINE_ADMIN_CA")]
    pub ca: Option<std::path::PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The admin API's bearer token (needed to drain and rebalance, unless the API has none).
    #[arg(long = "admin-token", env = "SHARDLINE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct NodeArgs {
    /// Stable node name.
    #[arg(long, env = "SHARDLINE_NAME")]
    pub name: String,
    /// Listen address, host:port.
    #[arg(long, env = "SHARDLINE_BIND")]
    pub bind: String,
    /// Number of shards per entity type (the same on every node).
    #[arg(long, env = "SHARDLINE_SHARDS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub shards: u32,
    /// How the node finds the cluster.
    #[command(flatten)]
    pub members: MembershipArgs,
    /// Cluster name.
    #[arg(long, env = "SHARDLINE_CLUSTER", default_value = "shardline-demo")]
    pub cluster: String,
    /// Application version (for version-aware allocation).
    #[arg(long, env = "SHARDLINE_APP_VERSION", default_value = "1")]
    pub app_version: String,
    /// Allocation strategy of the account type: least-shards, version-aware, consistent-hash,
    /// ranges or external (placed through the admin API; the same on every node).
    #[arg(long, env = "SHARDLINE_STRATEGY", default_value = "least-shards")]
    pub strategy: StrategyArg,
    /// Append shard start/stop lines to this file.
    #[arg(long, env = "SHARDLINE_OWNERSHIP_LOG")]
    pub ownership_log: Option<String>,
    /// The accounts' journal: sqlite://PATH (one file that the nodes of one host share),
    /// postgres://USER@HOST:PORT/DATABASE (the `postgres` feature; schema named after the
    /// cluster) or memory (this process only: state does not follow a moved shard).
    #[arg(long, env = "SHARDLINE_STORE", default_value = "sqlite://shardline-journal.db")]
    pub store: StoreSpec,
    /// The PostgreSQL schema of the journal (default: the cluster name, with `_` for anything
    /// but letters and digits).
    #[arg(long, env = "SHARDLINE_STORE_SCHEMA")]
    pub store_schema: Option<String>,
    /// Remember the accounts that wrote, and restart them where their shard starts, at most
    /// this many per second (and 64 recovering at once per node).
    #[arg(long, env = "SHARDLINE_REMEMBER_ENTITIES", value_parser = clap::value_parser!(u32).range(1..))]
    pub remember_entities: Option<u32>,
    /// Serve the demo's alarms (`shardline_cli::alarm`): an event-sourced type with durable
    /// reminders in the journal (every node of the cluster gives the same flag).
    #[arg(long, env = "SHARDLINE_ALARMS")]
    pub alarms: bool,
    /// Run the demo's sharded daemon: 4 workers over the cluster, each writing its node's name
    /// to `DIR/worker-INDEX` every 100 ms (every node of the cluster gives the same flag).
    #[arg(long, env = "SHARDLINE_HEARTBEATS")]
    pub heartbeats: Option<std::path::PathBuf>,
    /// Serve the admin HTTP API (health probes, metrics, the dashboard, drain and rebalance) on
    /// this address: PORT (on 127.0.0.1) or HOST:PORT. Beyond loopback it needs --admin-token.
    #[arg(long, env = "SHARDLINE_ADMIN")]
    pub admin: Option<String>,
    /// Bearer token the admin API's actions (drain, rebalance, shard assignments) and its event
    /// stream require; at least 16 visible characters. Required when the admin API listens on an
    /// address other than loopback.
    #[arg(long, env = "SHARDLINE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Serve the admin API over HTTPS with this certificate (PEM, its chain after it).
    #[arg(long, env = "SHARDLINE_ADMIN_TLS_CERT", requires = "admin_tls_key")]
    pub admin_tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --admin-tls-cert.
    #[arg(long, env = "SHARDLINE_ADMIN_TLS_KEY", requires = "admin_tls_cert")]
    pub admin_tls_key: Option<std::path::PathBuf>,
    /// Mutual TLS between nodes.
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// Mutual TLS between nodes: all three files, or none (plain TCP, for development only).
#[derive(Args, Debug, Clone)]
pub struct TlsArgs {
    /// This node's certificate (PEM), issued for its node name by the cluster's CA.
    #[arg(long, env = "SHARDLINE_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "SHARDLINE_TLS_KEY", requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<std::path::PathBuf>,
    /// The cluster's CA certificate(s) (PEM): peers must show a certificate it signed.
    #[arg(long, env = "SHARDLINE_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<std::path::PathBuf>,
}

impl TlsArgs {
    /// The TLS settings these flags name (None: no certificate given); an unreadable file is an
    /// error that names it.
    pub fn load(&self) -> Result<Option<shardline::TlsConfig>, String> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => {
                shardline::TlsConfig::from_files(cert, key, ca).map(Some).map_err(|e| e.to_string())
            }
            (None, None, None) => Ok(None),
            _ => Err("--tls-cert, --tls-key and --tls-ca go together".into()),
        }
    }
}

/// How a process finds its cluster, and how partitions are resolved (the same on every member).
#[derive(Args, Debug, Clone)]
pub struct MembershipArgs {
    /// Seed addresses, comma separated (the first one may start the cluster); only for
    /// `--membership seeds`.
    #[arg(long, env = "SHARDLINE_SEEDS", value_delimiter = ',', required_if_eq("membership", "seeds"))]
    pub seeds: Vec<String>,
    /// Membership: seeds, etcd://HOST:PORT, nats://HOST:PORT, postgres://USER@HOST:PORT/DATABASE
    /// (leases in the database, in the cluster's schema) or sqlite://PATH (the nodes of one host).
    /// Default: a node whose journal is PostgreSQL and that names no seeds keeps its leases in
    /// that database; otherwise seeds.
    #[arg(long, env = "SHARDLINE_MEMBERSHIP")]
    pub membership: Option<MembershipSpec>,
    /// Split-brain resolution: off, keep-majority (the default), keep-oldest or
    /// static-quorum:N. Gossip: the side that keeps the majority survives and the other stops
    /// its shards before they are taken over; off lets both sides of a partition host the same
    /// shards. Lease membership races for a key in its store, which keeps the larger side:
    /// keep-majority or off.
    #[arg(long, env = "SHARDLINE_SPLIT_BRAIN")]
    pub split_brain: Option<SplitBrainArg>,
    /// How long the set of unreachable members must stay the same before the resolver decides,
    /// in milliseconds.
    #[arg(long, env = "SHARDLINE_STABLE_AFTER_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub stable_after_ms: u64,
}

impl MembershipArgs {
    /// The lease and gossip settings these flags give; a policy lease membership cannot run is
    /// an error.
    pub fn settings(&self) -> Result<(LeaseConfig, GossipConfig), String> {
        resolve_split_brain(&self.spec(), self.split_brain.as_ref(), self.stable_after_ms)
    }

    /// The membership named, or seeds (without any seed, a node is a cluster of its own).
    pub fn spec(&self) -> MembershipSpec {
        self.membership.clone().unwrap_or(MembershipSpec::Seeds)
    }

    /// A node's default: leases in its journal's PostgreSQL database, when it has one and
    /// neither a membership nor seeds were named (seeds say gossip: a gossip cluster whose nodes
    /// are updated one by one must not split into a gossip half and a lease half).
    pub fn default_to_journal(&mut self, store: &StoreSpec) {
        let first = match store {
            StoreSpec::Postgres(url) => Some(url),
            // A split journal's leases live in its first database.
            StoreSpec::PostgresSplit(urls) => urls.first(),
            _ => None,
        };
        if let (None, true, Some(url)) = (&self.membership, self.seeds.is_empty(), first) {
            self.membership = Some(MembershipSpec::Postgres(url.clone()));
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    /// How the driver finds the cluster (the cluster's settings: it follows its side of a
    /// partition like a member).
    #[command(flatten)]
    pub members: MembershipArgs,
    /// Cluster name (the cluster's).
    #[arg(long, env = "SHARDLINE_CLUSTER", default_value = "shardline-demo")]
    pub cluster: String,
    /// Shards of the account type (the cluster's).
    #[arg(long, env = "SHARDLINE_SHARDS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub shards: u32,
    /// Listen address of this driver (peers must reach it), host:port.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: String,
    /// Name of this driver in the cluster (default: load-PID).
    #[arg(long)]
    pub name: Option<String>,
    /// Accounts this driver writes.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub entities: u64,
    /// Number of its first account (default: one drawn per run, so that drivers sharing a
    /// cluster write accounts of their own and each audits only what it wrote).
    #[arg(long)]
    pub first_account: Option<u64>,
    /// Concurrent callers.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: u64,
    /// Seconds of load.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub duration_secs: u64,
    /// How long to wait for every shard to have a home before starting, in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub join_timeout_secs: u64,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<String>,
    /// Record every operation to this file, one JSON object per line, for `shardline check`.
    #[arg(long)]
    pub history: Option<std::path::PathBuf>,
    /// Mutual TLS with the cluster (the driver's own certificate, for its `--name`).
    #[command(flatten)]
    pub tls: TlsArgs,
}

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Node processes to start with.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub nodes: u32,
    /// Shards of the account type.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub shards: u32,
    /// Accounts.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub entities: u64,
    /// Seconds of load in each phase.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub duration_secs: u64,
    /// Concurrent callers of the load driver.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: u64,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<String>,
    /// First port of the node processes (default: free ports chosen by the system).
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Membership: seeds, etcd://HOST:PORT, nats://HOST:PORT, postgres://USER@HOST:PORT/DATABASE
    /// (leases in the database, in the cluster's schema) or sqlite://PATH (the nodes of one host).
    /// Default: leases in the SQLite file of the journal, which every node shares (with a
    /// PostgreSQL journal: seeds).
    #[arg(long)]
    pub membership: Option<MembershipSpec>,
    /// `standard`: scale-out, graceful leave, kill -9. `rolling-restart`: every node restarted
    /// one by one with a new application version.
    #[arg(long, default_value = "standard", value_parser = ["standard", "rolling-restart"])]
    pub scenario: String,
    /// Allocation strategy of the account type (passed to every node).
    #[arg(long, default_value = "least-shards")]
    pub strategy: StrategyArg,
    /// The accounts' journal, shared by every node: sqlite://PATH (default: a file in the run
    /// directory) or postgres://USER@HOST:PORT/DATABASE (the `postgres` feature).
    #[arg(long)]
    pub store: Option<StoreSpec>,
    /// Mutual TLS between the nodes and the driver, with a development CA and certificates
    /// made for the run (as `shardline certs` makes them).
    #[arg(long)]
    pub tls: bool,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Which scenario.
    #[arg(long, value_parser = ["local-ask", "remote-ask", "idle-memory", "rebalance", "failover", "journal", "durable-ask", "remember", "passivation", "reminders"])]
    pub scenario: String,
    /// The journal (journal, durable-ask and reminders scenarios): sqlite://PATH (default: a file in a
    /// fresh directory) or postgres://USER@HOST:PORT/DATABASE (the `postgres` feature).
    #[arg(long)]
    pub store: Option<StoreSpec>,
    /// Membership of the cluster scenarios: seeds, etcd://HOST:PORT, nats://HOST:PORT,
    /// postgres://USER@HOST:PORT/DATABASE or sqlite://PATH.
    #[arg(long, default_value = "seeds")]
    pub membership: MembershipSpec,
    /// Seconds of load before the first kill (failover), watching for members downed that
    /// nobody killed: `false_downs` in the JSON.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub steady_secs: u64,
    /// Repetitions (failover, journal).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
    /// Write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<String>,
    /// Seconds of load (ask scenarios).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub duration_secs: u64,
    /// Concurrent callers (ask scenarios).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: u64,
    /// Entities: asked (ask scenarios), activated (idle-memory, rebalance), scanned past the
    /// hot set (passivation, default 1,000,000); reminders pending (reminders, default
    /// 1,000,000); appends per writer
    /// (journal, default 1,000).
    #[arg(long)]
    pub entities: Option<u64>,
    /// Mutual TLS between the nodes (remote-ask), against the same plain-TCP floor: the ratio
    /// then includes the cost of TLS.
    #[arg(long)]
    pub tls: bool,
}

/// `NAME@MS` of `shardline check --killed`.
fn parse_killed(s: &str) -> Result<(String, u128), String> {
    let (name, at) = s.rsplit_once('@').ok_or_else(|| format!("{s:?}: expected NAME@MS"))?;
    let at = at.parse().map_err(|_| format!("{s:?}: {at:?} is not a time in milliseconds"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: no node name"));
    }
    Ok((name.to_string(), at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(args: &[&str]) -> NodeArgs {
        let mut argv = vec!["shardline", "node", "--name", "n1", "--bind", "127.0.0.1:7101"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv) {
            Ok(Cli { command: Command::Node(n), .. }) => n,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn a_node_on_a_postgres_journal_keeps_its_leases_there_unless_told_otherwise() {
        let pg = "postgres://postgres@127.0.0.1:5432/test";
        let mut n = node(&["--store", pg]);
        n.members.default_to_journal(&n.store);
        assert_eq!(n.members.spec(), MembershipSpec::Postgres(pg.into()));
        // Seeds say gossip: a gossip cluster updated node by node must not split.
        let mut n = node(&["--store", pg, "--seeds", "127.0.0.1:7101"]);
        n.members.default_to_journal(&n.store);
        assert_eq!(n.members.spec(), MembershipSpec::Seeds);
        let mut n = node(&["--store", pg, "--membership", "etcd://127.0.0.1:2379"]);
        n.members.default_to_journal(&n.store);
        assert_eq!(n.members.spec(), MembershipSpec::Etcd("127.0.0.1:2379".into()));
        // SQLite journal, no seeds: gossip, a cluster of its own (as before leases in the
        // journal's database existed).
        let mut n = node(&[]);
        n.members.default_to_journal(&n.store);
        assert_eq!(n.members.spec(), MembershipSpec::Seeds);
    }
}
