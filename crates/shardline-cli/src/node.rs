//! `shardline node`: one node of the demo application. Stops cleanly on SIGTERM/SIGINT by
//! leaving the cluster gracefully.

use std::time::Duration;

use shardline::{Cluster, EntitySettings, Seeds};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info};

use crate::args::NodeArgs;
use shardline_cli::{account_settings, Account, Echo};

/// The entity types every demo node serves.
pub async fn register_all(cluster: &Cluster, shards: u32) -> Result<(), shardline::ConfigError> {
    cluster.register::<Account>(account_settings(shards)).await?;
    cluster.register::<Echo>(EntitySettings::new("echo").shards(shards)).await?;
    Ok(())
}

/// Runs a node until it is told to stop; returns the process exit code.
pub async fn run(args: NodeArgs) -> i32 {
    let mut b = Cluster::builder()
        .cluster_name(&args.cluster)
        .node_name(&args.name)
        .bind(&args.bind)
        .app_version(&args.app_version)
        .membership(Seeds::new(args.seeds.clone()));
    if let Some(p) = &args.ownership_log {
        b = b.ownership_log(p);
    }
    let cluster = match b.build().await {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "cannot start the node");
            return 1;
        }
    };
    if let Err(e) = register_all(&cluster, args.shards).await {
        error!(error = %e, "cannot register entity types");
        return 1;
    }
    info!(node = %cluster.node_id(), addr = %cluster.local_addr(), "serving");
    let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(t), Ok(i)) => (t, i),
        _ => {
            error!("cannot install signal handlers");
            return 1;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        reason = cluster.downed() => {
            error!(%reason, "this node was removed from the cluster");
            return 3;
        }
    }
    info!("stopping: leaving the cluster");
    match cluster.leave_within(Duration::from_secs(60)).await {
        Ok(()) => 0,
        Err(e) => {
            error!(error = %e, "graceful leave did not complete");
            1
        }
    }
}
