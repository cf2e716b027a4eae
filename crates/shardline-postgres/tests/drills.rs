//! The end-to-end failure drills on real PostgreSQL servers.
//!
//! Needs: PostgreSQL at `SHARDLINE_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`) for the two-owners drill, and Debian's PostgreSQL
//! server binaries (`initdb`, `postgres`, package `postgresql`) for the outage drill, which
//! starts, stops and restarts a server of its own on a free port. Either missing fails the test
//! and says what to install.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardline::drills;
use shardline_postgres::{PostgresConfig, PostgresJournal};

fn url() -> String {
    std::env::var("SHARDLINE_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn stamp() -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{}_{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_owners_of_one_shard() {
    let schema = format!("shardline_test_owners_{}", stamp());
    let j = match PostgresJournal::connect(PostgresConfig::new(url()).schema(&schema)).await {
        Ok(j) => j,
        Err(e) => panic!("this test needs PostgreSQL at {} (set SHARDLINE_TEST_POSTGRES): {e}", url()),
    };
    drills::two_owners_of_one_shard(Arc::new(j), "pg").await.unwrap();
    let (client, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls).await.expect("connects");
    tokio::spawn(conn);
    client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("schema dropped");
}

/// The directory of Debian's PostgreSQL server binaries (the newest installed version).
fn server_bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(Result::ok).map(|e| e.path().join("bin")).filter(|p| p.join("initdb").exists()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.pop().expect("this test needs PostgreSQL's server binaries: apt-get install postgresql")
}

/// A PostgreSQL server of this test's own, on a free port, in a fresh data directory. The
/// server refuses to run as root, so as root it runs as the `postgres` user.
struct Server {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

fn as_server_user(program: &Path) -> Command {
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

impl Server {
    fn init() -> Server {
        let bin = server_bin();
        let dir = std::env::temp_dir().join(format!("shardline-pg-{}", stamp()));
        std::fs::create_dir_all(&dir).expect("data directory");
        let chown = Command::new("chown").args(["postgres:postgres"]).arg(&dir).status();
        let _ = chown; // Not root: the directory is ours already.
        let ok = as_server_user(&bin.join("initdb"))
            .args(["-D"])
            .arg(dir.join("data"))
            .args(["-A", "trust", "-U", "postgres"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("initdb runs")
            .success();
        assert!(ok, "initdb failed in {}", dir.display());
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut s = Server { bin, dir, port, child: None };
        s.start();
        s
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn start(&mut self) {
        let child = as_server_user(&self.bin.join("postgres"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.dir)
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("postgres starts");
        self.child = Some(child);
        let start = Instant::now();
        // The port opens before the server accepts sessions ("the database system is starting
        // up"): wait until it answers as a database.
        let ready = || {
            Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success())
        };
        while !ready() {
            assert!(start.elapsed() < Duration::from_secs(30), "the test's PostgreSQL did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server at once (SIGQUIT: no clean shutdown), as a crash would.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // The postmaster's own pid (under runuser, the child is runuser).
            let pid = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
                .ok()
                .and_then(|t| t.lines().next().map(str::to_string))
                .unwrap_or_else(|| c.id().to_string());
            let _ = Command::new("kill").args(["-QUIT", &pid]).status();
            let _ = c.wait();
        }
        // The postmaster's children go with it; wait until the port is free.
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server stops under load and comes back on the same port: the node's asks fail meanwhile,
/// it serves again afterwards without a restart, and nothing acknowledged is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_under_load() {
    let server = Arc::new(Mutex::new(Server::init()));
    let url = server.lock().unwrap().url();
    let config = PostgresConfig { timeout: Duration::from_secs(2), ..PostgresConfig::new(&url).schema("drill") };
    let j = PostgresJournal::connect(config).await.expect("connects to the test's server");
    let (down, up) = (server.clone(), server.clone());
    let cut = async move { tokio::task::spawn_blocking(move || down.lock().unwrap().stop()).await.unwrap() };
    let restore = async move { tokio::task::spawn_blocking(move || up.lock().unwrap().start()).await.unwrap() };
    drills::outage_under_load(Arc::new(j), "pg", cut, restore).await.unwrap();
}
