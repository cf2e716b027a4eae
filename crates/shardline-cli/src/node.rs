//! `shardline node`: one node of the demo application. Stops cleanly on SIGTERM/SIGINT by
//! leaving the cluster gracefully. A node fenced by its membership (lease lost, declared down)
//! stops every shard at once and rejoins as a new incarnation.

use std::time::Duration;

use std::sync::Arc;

use shardline::journal::Journal;
use shardline::{Cluster, EntitySettings, StrategyKind};
use shardline_admin::AdminToken;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use crate::args::NodeArgs;
use shardline::membership::lease::LeaseConfig;
use shardline::GossipConfig;
use shardline_cli::membership::{lease_config, provider_with};
use shardline_cli::{account_type, register_accounts_with, register_alarms, register_memory_accounts, store, Echo};

/// The entity types every demo node serves; accounts keep their journal in `journal`, and are
/// remembered (restarted where their shard starts, at most `remember` per second) when it says.
pub async fn register_all(
    cluster: &Cluster,
    shards: u32,
    strategy: &StrategyKind,
    journal: Arc<dyn Journal>,
    remember: Option<u32>,
) -> Result<(), shardline::ConfigError> {
    let accounts = account_type(shards, strategy, Some(journal));
    let accounts = match remember {
        Some(per_second) => accounts.remember_entities(per_second),
        None => accounts,
    };
    register_accounts_with(cluster, accounts).await?;
    cluster.register::<Echo>(EntitySettings::new("echo").shards(shards)).await?;
    // The demo's floor: the same accounts in memory.
    register_memory_accounts(cluster, shards, strategy).await?;
    Ok(())
}

/// Builds and registers this process's node; `rejoining` after an incarnation was fenced.
async fn start(args: &NodeArgs, journal: &Arc<dyn Journal>, rejoining: bool) -> Result<Cluster, String> {
    // Ranges orders hosts by their numbered membership slots.
    let (leases, gossip) = args.members.settings()?;
    // Gossip terms live only as long as the cluster: a cluster restarted from scratch must start
    // above the fences its earlier incarnation left in the journal. Lease terms come from a
    // counter in the store, which knows nothing of a journal written before it (a replaced
    // store, a cluster that ran on gossip).
    let floor = journal.highest_term().await.map_err(|e| format!("cannot read the journal: {e}"))?;
    let leases = LeaseConfig { numbered_slots: args.strategy.0 == StrategyKind::Ranges, term_floor: floor, ..leases };
    // A first seed that was downed must not start a cluster of its own while the one that downed
    // it is out of reach (see `GossipConfig::rejoin`).
    let gossip = GossipConfig { term_floor: floor, rejoin: rejoining, ..gossip };
    let m = &args.members;
    let membership = provider_with(&m.spec(), &args.cluster, &m.seeds, leases, gossip).await?;
    let mut b = Cluster::builder()
        .cluster_name(&args.cluster)
        .node_name(&args.name)
        .bind(&args.bind)
        .app_version(&args.app_version)
        .membership_boxed(membership);
    if let Some(p) = &args.ownership_log {
        b = b.ownership_log(p);
    }
    // Drains, rebalances and assignments that reach this node through another one must carry
    // the admin token's tag (or come from a TLS-certified peer).
    if let Some(token) = &args.admin_token {
        b = b.admin_secret(token.as_bytes());
    }
    // Read at every start: a node that rejoins takes a renewed certificate.
    if let Some(tls) = args.tls.load()? {
        b = b.tls(tls);
    }
    let cluster = b.build().await.map_err(|e| e.to_string())?;
    register_all(&cluster, args.shards, &args.strategy.0, journal.clone(), args.remember_entities)
        .await
        .map_err(|e| e.to_string())?;
    if args.alarms {
        register_alarms(&cluster, args.shards, Some(journal.clone())).await.map_err(|e| e.to_string())?;
    }
    if let Some(dir) = &args.heartbeats {
        heartbeats(&cluster, &args.name, dir.clone()).await?;
    }
    Ok(cluster)
}

/// The demo's sharded daemon: [`HEARTBEAT_WORKERS`] workers, each writing the name of the node
/// it runs on to `dir/worker-INDEX` every 100 ms, so that a test sees where each one runs.
async fn heartbeats(cluster: &Cluster, node: &str, dir: std::path::PathBuf) -> Result<(), String> {
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let node = node.to_string();
    cluster
        .daemon("heartbeat", HEARTBEAT_WORKERS, move |index, mut ctx| {
            let (path, node) = (dir.join(format!("worker-{index}")), node.clone());
            // Written aside, then renamed over: a reader never sees a half-written file.
            let aside = dir.join(format!(".worker-{index}-{node}"));
            async move {
                while !ctx.is_stopping() {
                    if let Err(e) = std::fs::write(&aside, &node).and_then(|()| std::fs::rename(&aside, &path)) {
                        warn!(path = %path.display(), error = %e, "heartbeat not written");
                    }
                    tokio::select! {
                        () = ctx.stopping() => {}
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
            }
        })
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Workers of the demo's heartbeat daemon.
pub const HEARTBEAT_WORKERS: u32 = 4;

/// Serves `cluster`'s admin API on `addr` in a task of its own.
async fn serve_admin(
    addr: std::net::SocketAddr,
    cluster: &Cluster,
    metrics: Option<shardline_admin::PrometheusHandle>,
    token: Option<AdminToken>,
    tls: Option<shardline_admin::AdminTls>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(%addr, token = token.is_some(), https = tls.is_some(), "admin API listening");
    let router = shardline_admin::router(cluster.clone(), metrics, token);
    Ok(tokio::spawn(async move {
        let served = match tls {
            Some(tls) => shardline_admin::serve_tls(listener, router, tls).await,
            None => shardline_admin::serve(listener, router).await,
        };
        if let Err(e) = served {
            error!(%addr, error = %e, "the admin API stopped");
        }
    }))
}

/// A second signal during the leave: stop at once. Shards still here are not handed off; peers
/// see this node as crashed and take them once its membership lapses.
fn cut_short(cluster: &Cluster) -> i32 {
    error!("leave cut short by a second signal: stopping at once without handing off");
    cluster.crash();
    LEAVE_CUT_SHORT
}

/// Exit code of a node whose graceful leave was cut short by a second signal (128 + SIGINT, as
/// shells report an interrupted program).
const LEAVE_CUT_SHORT: i32 = 130;

/// Runs a node until it is told to stop; returns the process exit code.
pub async fn run(mut args: NodeArgs) -> i32 {
    if args.members.membership.is_none() {
        args.members.default_to_journal(&args.store);
        if args.members.membership.is_some() {
            info!("membership: leases in the journal's PostgreSQL database (the default with a PostgreSQL journal; --membership seeds for gossip)");
        }
    }
    let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(t), Ok(i)) => (t, i),
        _ => {
            error!("cannot install signal handlers");
            return 1;
        }
    };
    // One journal for the life of the process: a rejoining incarnation keeps using it.
    let schema = args.store_schema.clone().unwrap_or_else(|| store::schema_name(&args.cluster));
    let journal = match store::open(&args.store, &schema).await {
        Ok(j) => j,
        Err(e) => {
            error!(error = %e, "cannot open the journal");
            eprintln!("cannot open the journal: {e}");
            return 1;
        }
    };
    // The admin API's address is checked before anything joins; the listener is bound again for
    // each incarnation, whose cluster it serves.
    let metrics = args.admin.as_ref().and_then(|_| match shardline_admin::install_prometheus() {
        Ok(h) => Some(h),
        Err(e) => {
            warn!(error = %e, "the admin API serves no metrics");
            None
        }
    });
    let token = match args.admin_token.clone().map(AdminToken::new).transpose() {
        Ok(t) => t,
        Err(e) => {
            error!(error = %e, "cannot serve the admin API");
            eprintln!("{e}");
            return 1;
        }
    };
    let admin_tls = match (&args.admin_tls_cert, &args.admin_tls_key) {
        (Some(cert), Some(key)) => match shardline_admin::AdminTls::from_files(cert, key) {
            Ok(t) => Some(t),
            Err(e) => {
                error!(error = %e, "cannot serve the admin API");
                eprintln!("cannot serve the admin API: {e}");
                return 1;
            }
        },
        _ => None,
    };
    let mut admin_addr = None;
    if let Some(a) = &args.admin {
        // A bare port is on loopback: reachable from this host only, unless said otherwise.
        let a = if a.parse::<u16>().is_ok() { format!("127.0.0.1:{a}") } else { a.clone() };
        let checked = match tokio::net::TcpListener::bind(&a).await.and_then(|l| l.local_addr()) {
            Ok(addr) => shardline_admin::check_exposure(addr, token.as_ref()).map(|()| addr).map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot listen on {a}: {e}")),
        };
        match checked {
            Ok(addr) => admin_addr = Some(addr),
            Err(e) => {
                error!(error = %e, "cannot serve the admin API");
                eprintln!("cannot serve the admin API: {e}");
                return 1;
            }
        }
    }
    let mut admin: Option<tokio::task::JoinHandle<()>> = None;
    let mut first = true;
    loop {
        let cluster = match start(&args, &journal, !first).await {
            Ok(c) => c,
            Err(e) if first => {
                error!(error = %e, "cannot start the node");
                eprintln!("cannot start the node: {e}");
                return 1;
            }
            Err(e) => {
                warn!(error = %e, "cannot rejoin yet");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        first = false;
        if let Some(a) = admin_addr {
            if let Some(old) = admin.take() {
                old.abort();
                let _ = old.await;
            }
            admin = match serve_admin(a, &cluster, metrics.clone(), token.clone(), admin_tls.clone()).await {
                Ok(t) => Some(t),
                Err(e) => {
                    error!(addr = %a, error = %e, "cannot listen for the admin API");
                    return 1;
                }
            };
        }
        info!(node = %cluster.node_id(), addr = %cluster.local_addr(), membership = %shardline_cli::redacted(&args.members.spec().to_string()), store = %shardline_cli::redacted(&args.store.to_string()), "serving");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            // Drained through the admin API: the leave runs already; the process ends with it.
            left = cluster.left() => return match left {
                Ok(()) => {
                    info!("drained: left the cluster");
                    0
                }
                Err(e) => {
                    error!(error = %e, "graceful leave did not complete");
                    1
                }
            },
            reason = cluster.downed() => {
                warn!(%reason, "this node was fenced; rejoining as a new incarnation");
                cluster.crash();
                drop(cluster);
                // Let the old incarnation's lease lapse before the new one claims the name.
                tokio::time::sleep(lease_config().ttl).await;
                continue;
            }
        }
        info!("stopping: leaving the cluster (a second SIGINT/SIGTERM stops at once)");
        return tokio::select! {
            left = cluster.leave_within(Duration::from_secs(60)) => match left {
                Ok(()) => 0,
                Err(e) => {
                    error!(error = %e, "graceful leave did not complete");
                    1
                }
            },
            _ = term.recv() => cut_short(&cluster),
            _ = int.recv() => cut_short(&cluster),
        };
    }
}
