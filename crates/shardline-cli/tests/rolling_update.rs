//! A rolling update across wire protocol versions, with real processes: three `shardline node`
//! processes of the last build before protocol version 4 (which spoke only version 3) are
//! replaced one at a time, each by SIGTERM and a node of this build at the same name and
//! address, under load. This test process is a proxy node of this build from the start.
//!
//! It needs the previous build: `git` must find [`PREVIOUS`] in this repository, and the first
//! run builds it (a few minutes) into `target/previous`.
//!
//! What must hold: the cluster serves throughout, mixed; connections between the two builds
//! speak version 3 and, once every node is new, the newest version (5); every acknowledged
//! deposit is in its account exactly once.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardline::{Cluster, Gossip, StrategyKind};
use shardline_cli::{register_accounts, AccountCmd, Accounts};

mod deposits;
use deposits::{deposit_until_stopped, Acked};

/// The last commit before protocol version 4: its nodes speak version 3 only.
const PREVIOUS: &str = "76eb884b74a68731be400e8585b1e55bee8f3026";

const SHARDS: u32 = 32;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The previous build's `shardline` binary, built once from the repository's history.
fn previous_build() -> PathBuf {
    let root = repo().join("target/previous");
    let bin = root.join(format!("release/shardline-{}", &PREVIOUS[..12]));
    if bin.exists() {
        return bin;
    }
    let src = root.join(format!("src-{}", &PREVIOUS[..12]));
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).expect("the previous build's folder");
    let archive =
        Command::new("git").current_dir(repo()).args(["archive", "--format=tar", PREVIOUS]).output().expect("git runs");
    assert!(
        archive.status.success(),
        "this test needs commit {PREVIOUS} of this repository (a clone with its history): {}",
        String::from_utf8_lossy(&archive.stderr)
    );
    let mut tar = Command::new("tar").arg("-x").current_dir(&src).stdin(Stdio::piped()).spawn().expect("tar runs");
    std::io::Write::write_all(tar.stdin.as_mut().expect("tar's input"), &archive.stdout).expect("tar reads");
    drop(tar.stdin.take());
    assert!(tar.wait().expect("tar ends").success(), "the previous sources unpack");
    let built = Command::new(env!("CARGO"))
        .current_dir(&src)
        .args(["build", "--release", "--locked", "-p", "shardline-cli", "--bin", "shardline", "--target-dir"])
        .arg(&root)
        .status()
        .expect("cargo runs");
    assert!(built.success(), "the previous build compiles");
    std::fs::copy(root.join("release/shardline"), &bin).expect("the previous binary is kept");
    bin
}

fn free_port() -> u16 {
    shardline::ports::free_port().unwrap()
}

struct Node {
    child: Child,
    log: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn log_of(name: &str, tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("shardline-rolling-{}-{name}-{tag}.log", std::process::id()))
}

/// A node of `binary`, logging the transport's handshakes (which name the protocol spoken).
fn spawn(binary: &Path, name: &str, port: u16, seed: u16, journal: &Path, tag: &str) -> Node {
    let log = log_of(name, tag);
    let child = Command::new(binary)
        .args(["node", "--name", name, "--bind", &format!("127.0.0.1:{port}")])
        .args(["--seeds", &format!("127.0.0.1:{seed}"), "--shards", &SHARDS.to_string()])
        .args(["--store", &format!("sqlite://{}", journal.display())])
        .env("RUST_LOG", "info,shardline::transport=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).expect("log file")))
        .spawn()
        .expect("the node starts");
    Node { child, log }
}

async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn owners(h: &Accounts) -> Vec<String> {
    h.entity_handle().shard_homes().iter().map(|o| o.as_ref().map(|n| n.name.to_string()).unwrap_or_default()).collect()
}

/// The protocol versions a node's log says its connections spoke.
fn protocols(log: &Path) -> Vec<u32> {
    let text = std::fs::read_to_string(log).expect("the node wrote its log");
    let mut found: Vec<u32> = text
        .lines()
        .map(without_colours)
        .filter(|l| l.contains("connected") || l.contains("accepted"))
        .filter_map(|l| l.split("protocol=").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

/// A log line without its terminal colour codes (`ESC [ … m`).
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_the_previous_protocol_is_updated_one_node_at_a_time_under_load() {
    let previous = previous_build();
    let current = PathBuf::from(env!("CARGO_BIN_EXE_shardline"));
    let journal = std::env::temp_dir().join(format!("shardline-rolling-{}.db", std::process::id()));
    let names = ["n1", "n2", "n3"];
    let ports: Vec<u16> = names.iter().map(|_| free_port()).collect();
    let seed = ports[0];
    let mut nodes: Vec<Node> =
        names.iter().zip(&ports).map(|(n, p)| spawn(&previous, n, *p, seed, &journal, "previous")).collect();

    let driver = Cluster::builder()
        .cluster_name("shardline-demo")
        .node_name("test-driver")
        .proxy()
        .membership(Gossip::new([format!("127.0.0.1:{seed}")]))
        .build()
        .await
        .expect("the driver starts");
    let h = register_accounts(&driver, SHARDS, &StrategyKind::LeastShards, None).await.expect("the type registers");
    let h2 = h.clone();
    eventually("every node of the previous build hosts shards", Duration::from_secs(60), move || {
        let o = owners(&h2);
        o.iter().all(|n| !n.is_empty()) && names.iter().all(|n| o.iter().any(|o| o == n))
    })
    .await;

    const ACCOUNTS: u64 = 40;
    const CALLERS: u64 = 8;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let began = Instant::now();
    let callers: Vec<_> = (1..=CALLERS)
        .map(|c| tokio::spawn(deposit_until_stopped(h.clone(), c, ACCOUNTS, began, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;

    for (i, name) in names.iter().enumerate() {
        // SIGTERM: the node of the previous build hands its shards off and exits 0.
        #[allow(unsafe_code)]
        // SAFETY: kill(2) on a child's pid has no memory-safety preconditions.
        unsafe {
            libc::kill(nodes[i].child.id() as libc::pid_t, libc::SIGTERM);
        }
        let start = Instant::now();
        let status = loop {
            if let Some(s) = nodes[i].child.try_wait().expect("wait") {
                break s;
            }
            assert!(start.elapsed() < Duration::from_secs(90), "{name} did not leave");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(status.code(), Some(0), "{name} of the previous build left gracefully");
        nodes[i] = spawn(&current, name, ports[i], if i == 0 { ports[1] } else { seed }, &journal, "current");
        let h2 = h.clone();
        eventually(&format!("{name} of this build hosts shards"), Duration::from_secs(60), move || {
            owners(&h2).iter().any(|o| o == name)
        })
        .await;
        // Serve a while mixed (or, at the end, all new) before the next step.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked: Vec<Acked> = Vec::new();
    for c in callers {
        acked.extend(c.await.expect("caller"));
    }
    assert!(acked.len() > 100, "the load ran: {} deposits", acked.len());
    for a in 0..ACCOUNTS {
        let r = h.ask_timeout(format!("acct-{a}"), AccountCmd::Audit, Duration::from_secs(10)).await.unwrap();
        let mut got = r.ops.clone();
        got.sort_unstable();
        let mut expected: Vec<u64> = acked.iter().filter(|d| d.account == a).map(|d| d.op).collect();
        expected.sort_unstable();
        assert_eq!(got, expected, "acct-{a}: every acknowledged deposit exactly once, nothing else");
    }
    // The first new node spoke 3 with the nodes of the previous build, and 5 with the new ones.
    let first = protocols(&nodes[0].log);
    assert_eq!(first, vec![3, 5], "the protocols n1 of this build spoke");
    let last = protocols(&nodes[2].log);
    assert!(last.contains(&5), "n3 of this build spoke version 5: {last:?}");
    // How long the cluster went without answering any deposit (reported, not asserted: timing).
    let mut answered: Vec<Duration> = acked.iter().map(|d| d.answered).collect();
    answered.sort_unstable();
    let longest_gap = answered.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
    println!(
        "rolling update: {} deposits acknowledged across three replacements, {} resent after an unknown \
         outcome, longest time without an answer {longest_gap:?}",
        acked.len(),
        acked.iter().filter(|d| d.resent_after_unknown).count()
    );
    drop(nodes);
    // Kept when the test fails (a panic skips this), for the post-mortem.
    for (name, tag) in names.iter().flat_map(|n| [(n, "previous"), (n, "current")]) {
        let _ = std::fs::remove_file(log_of(name, tag));
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", journal.display()));
    }
}
