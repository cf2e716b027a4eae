//! Real `shardline node` processes on 127.0.0.1, for the multi-process tests: spawned with a
//! journal per cluster, signalled and killed for real.

#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const SHARDS: u32 = 64;

pub fn free_port() -> u16 {
    shardline::ports::free_port().unwrap()
}

pub struct Node(pub Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spawn(name: &str, port: u16, seed: u16) -> Node {
    let level = std::env::var("SHARDLINE_TEST_NODE_LOG").unwrap_or_else(|_| "warn".into());
    spawn_with(name, port, seed, &[], Stdio::inherit(), &level)
}

/// A node whose log (at info level) goes to `log`, with `extra` flags.
pub fn spawn_logged(name: &str, port: u16, seed: u16, extra: &[&str], log: &std::path::Path) -> Node {
    let file = std::fs::File::create(log).expect("log file");
    spawn_with(name, port, seed, extra, Stdio::from(file), "info")
}

pub fn spawn_with(name: &str, port: u16, seed: u16, extra: &[&str], stderr: Stdio, level: &str) -> Node {
    let child = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args([
            "node",
            "--name",
            name,
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--seeds",
            &format!("127.0.0.1:{seed}"),
            "--shards",
            &SHARDS.to_string(),
        ])
        // The nodes of one cluster (one seed) share one journal.
        .args(["--store", &format!("sqlite://{}", journal(seed).display())])
        .args(extra)
        .env("RUST_LOG", level)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("the shardline binary starts");
    Node(child)
}

/// The journal of the cluster whose seed listens on `seed`.
pub fn journal(seed: u16) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("shardline-processes-{}-{seed}.db", std::process::id()))
}

/// Sends a signal. libc::kill has no memory-safety preconditions.
pub fn signal(node: &Node, sig: libc::c_int) {
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(node.0.id() as libc::pid_t, sig);
    }
}

/// The exit code once the process exits, polled; panics after `limit`.
pub async fn exit_code(node: &mut Node, what: &str, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = node.0.try_wait().expect("wait") {
            return status.code();
        }
        assert!(start.elapsed() < limit, "{what}: still running after {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
