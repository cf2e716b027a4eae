//! The `shardline` binary: node runner, demo cluster, load benchmark.

mod args;
mod bench;
mod demo;
mod external_load;
mod false_downs;
mod floors;
mod heap;
mod journal_bench;
mod load;
mod node;
mod procs;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: heap::Counting = heap::Counting;

fn init_logs(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
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
        }
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    std::process::exit(code);
}
