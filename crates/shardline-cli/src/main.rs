//! The `shardline` binary: node runner, demo cluster, load benchmark.

mod admin_client;
mod args;
mod bench;
mod check;
mod demo;
mod durable_bench;
mod external_load;
mod false_downs;
mod floors;
mod journal_bench;
mod load;
mod node;
mod paired;
mod passivation_bench;
mod procs;
mod remember_bench;
mod reminders_bench;
mod standalone;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: shardline_cli::heap::Counting = shardline_cli::heap::Counting;

fn init_logs(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// One admin call: the answer as a table (`render`) or JSON on stdout, exit 0; an error as one
/// line on stderr, exit 1.
async fn admin(a: &args::AdminArgs, method: &str, path: String, render: impl Fn(&serde_json::Value) -> String) -> i32 {
    let ca = match &a.ca {
        Some(path) => match std::fs::read(path) {
            Ok(pem) => Some(pem),
            Err(e) => {
                eprintln!("error: cannot read the admin CA {}: {e}", path.display());
                return 1;
            }
        },
        None => None,
    };
    let url =
        admin_client::AdminUrl::parse(&a.url).and_then(|u| u.with_token(a.token.clone())).and_then(|u| match &ca {
            Some(pem) => u.with_ca(pem),
            None => Ok(u),
        });
    let answer = match url {
        Ok(url) => url.call(method, &path).await,
        Err(e) => Err(e),
    };
    match answer {
        Ok(v) if a.json => {
            println!("{v:#}");
            0
        }
        Ok(v) => {
            print!("{}", render(&v));
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn main() {
    let cli = args::Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(async move {
        match cli.command {
            args::Command::Node(a) => {
                init_logs("info");
                node::run(a).await
            }
            args::Command::Demo(a) => {
                init_logs("warn");
                demo::run(a).await
            }
            args::Command::Load(a) => {
                init_logs("warn");
                external_load::run(a).await
            }
            args::Command::Bench(a) => {
                init_logs("warn");
                bench::run(a).await
            }
            args::Command::EchoServer { bind } => floors::echo_server(&bind).await,
            args::Command::Floor { kind, addr, callers, entities, duration_ms } => {
                standalone::run(&kind, addr.as_deref(), callers, entities, duration_ms).await
            }
            args::Command::Certs { out, nodes, days } => {
                match shardline::dev_certs::write_dev_certs(&out, &nodes, days) {
                    Ok(files) => {
                        for f in files {
                            println!("{}", f.display());
                        }
                        0
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        1
                    }
                }
            }
            args::Command::Status(a) => admin(&a, "GET", "/api/cluster".into(), admin_client::render_status).await,
            args::Command::Shards { type_key, admin: a } => {
                let query = type_key.map(|t| format!("?type={}", admin_client::encode(&t))).unwrap_or_default();
                admin(&a, "GET", format!("/api/shards{query}"), admin_client::render_shards).await
            }
            args::Command::Drain { node, admin: a } => {
                let path = format!("/api/nodes/{}/drain", admin_client::encode(&node));
                admin(&a, "POST", path, |v| {
                    format!("draining {}: it hands its shards off and leaves\n", v["node"].as_str().unwrap_or("?"))
                })
                .await
            }
            args::Command::Rebalance { type_key, admin: a } => {
                let path = format!("/api/rebalance?type={}", admin_client::encode(&type_key));
                admin(&a, "POST", path, admin_client::render_rebalancing).await
            }
            args::Command::Check { histories, ownership_log, killed } => {
                check::run(&histories, ownership_log.as_deref(), &killed)
            }
        }
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    std::process::exit(code);
}
