//! What the tests on a server of their own share: Debian's PostgreSQL server binaries (`initdb`,
//! `postgres`, package `postgresql`) started on a free port in a fresh data directory, stopped and
//! started again. A missing binary fails the test and says what to install.

#![allow(dead_code)] // Each test file uses a part.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The shared server's URL: `SHARDLINE_TEST_POSTGRES`, by default
/// `postgres://postgres@127.0.0.1:5432/test`.
pub fn url() -> String {
    std::env::var("SHARDLINE_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A suffix no other test run uses.
pub fn stamp() -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{}_{nanos}", std::process::id())
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
pub struct Server {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    /// `-c name=value` settings beyond the defaults.
    settings: Vec<String>,
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
    pub fn init() -> Server {
        Server::init_with(|_| Vec::new())
    }

    /// A server whose extra settings `settings` gives from its directory (where it may write
    /// files the server reads: certificates, an `pg_hba.conf`).
    pub fn init_with(settings: impl FnOnce(&Path) -> Vec<String>) -> Server {
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
        let port = shardline::ports::free_port().unwrap();
        let settings = settings(&dir);
        // The files written for the server are the server user's (a key must be its own, 0600).
        let _ = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status();
        let mut s = Server { bin, dir, port, child: None, settings };
        s.start();
        s
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn start(&mut self) {
        let child = as_server_user(&self.bin.join("postgres"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.dir)
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .args(self.settings.iter().flat_map(|kv| ["-c", kv.as_str()]))
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

    /// The postmaster's own pid (under runuser, the child is runuser).
    fn postmaster(&self, child: &Child) -> String {
        std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().map(str::to_string))
            .unwrap_or_else(|| child.id().to_string())
    }

    /// Sends `signal` to the process started (runuser, as root: it stops itself when its child
    /// stops, and would not reap it until continued), the postmaster and its children (the
    /// sessions' backends, the server's workers).
    fn signal_all(&self, signal: &str) {
        let Some(child) = &self.child else { return };
        let pid = self.postmaster(child);
        let children = Command::new("ps").args(["-o", "pid=", "--ppid", &pid]).output().map(|o| o.stdout);
        let children = String::from_utf8_lossy(children.as_deref().unwrap_or_default()).into_owned();
        let _ = Command::new("kill")
            .arg(signal)
            .arg(child.id().to_string())
            .arg(&pid)
            .args(children.split_whitespace())
            .status();
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing answers, as on a hung
    /// machine or behind a partition.
    pub fn pause(&self) {
        self.signal_all("-STOP");
    }

    /// Thaws a paused server.
    pub fn resume(&self) {
        self.signal_all("-CONT");
    }

    /// Stops the server at once (SIGQUIT: no clean shutdown), as a crash would.
    pub fn stop(&mut self) {
        self.resume();
        if let Some(mut c) = self.child.take() {
            let pid = self.postmaster(&c);
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
