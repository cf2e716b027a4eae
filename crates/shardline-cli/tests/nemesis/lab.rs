//! The nemesis run's lab: Linux network namespaces on one bridge, the processes that run in them,
//! nftables rules inside them, and a PostgreSQL server of the run's own. Everything it made is
//! taken down on drop, a panic included: processes, the server, the namespaces (and with them
//! their nftables tables), the bridge. The run's files stay in `target/tmp` when it failed.
//!
//! Every tool it needs (root, `ip`, `nft`, `etcd`, `runuser`, PostgreSQL's server binaries) is
//! looked for first, and a missing one fails the run with what to install: never a skip.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The `shardline` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_shardline");

/// The port the run's PostgreSQL listens on, in its own namespace (so no other server's).
const PG_PORT: u16 = 5432;

/// Runs `program args`; its stdout, or an error naming the command and what it said.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {} ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args).map(drop)
}

/// Whether `tool` is an executable on `PATH`.
fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file())).unwrap_or(false)
}

/// Fails the run, loudly, when something it needs is missing; the directory of PostgreSQL's
/// server binaries (the newest installed version).
pub fn require_tools() -> PathBuf {
    let uid = run("id", &["-u"]).unwrap_or_default();
    assert_eq!(uid.trim(), "0", "the nemesis run needs root (network namespaces, nftables, signals to its nodes)");
    for (tool, package) in
        [("ip", "iproute2"), ("nft", "nftables"), ("etcd", "etcd-server"), ("runuser", "util-linux"), ("bash", "bash")]
    {
        assert!(on_path(tool), "the nemesis run needs `{tool}` (Debian package {package}), which is not on PATH");
    }
    assert!(
        run("id", &["-u", "postgres"]).is_ok(),
        "the nemesis run starts PostgreSQL as the `postgres` OS user, which does not exist (apt-get install postgresql)"
    );
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path().join("bin"))
                .filter(|b| ["initdb", "pg_ctl", "postgres"].iter().all(|t| b.join(t).is_file()))
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs.pop().expect(
        "the nemesis run needs PostgreSQL's server binaries (initdb, pg_ctl, postgres) in /usr/lib/postgresql/*/bin: \
         apt-get install postgresql",
    )
}

/// Milliseconds since the Unix epoch (the ownership log's clock).
pub fn now_ms() -> u128 {
    shardline_cli::history::now_ms()
}

/// One host: a network namespace with one address.
pub struct Host {
    pub ns: String,
    pub addr: String,
}

/// A process of the lab, by name.
struct Proc {
    name: String,
    child: Child,
}

/// The run's PostgreSQL: its binaries, and a directory (data, socket, log) the `postgres` user
/// owns.
struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    host: usize,
}

/// Namespaces on one bridge, and what runs in them.
pub struct Lab {
    tag: String,
    /// The run's files: logs, the ownership log, the history, reports.
    pub dir: PathBuf,
    pub hosts: Vec<Host>,
    procs: Vec<Proc>,
    pg: Option<Postgres>,
    bridge: Option<String>,
}

impl Lab {
    /// `hosts` namespaces, each joined to one bridge by a veth pair, with addresses
    /// `10.251.X.1…`.
    pub fn new(hosts: usize) -> Result<Lab, String> {
        static LABS: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let n = LABS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{:x}{n}", pid % 0xffff);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("nemesis-{pid}-{n}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut lab = Lab { tag: tag.clone(), dir, hosts: Vec::new(), procs: Vec::new(), pg: None, bridge: None };
        let br = format!("nm{tag}b");
        ip(&["link", "add", &br, "type", "bridge"])?;
        lab.bridge = Some(br.clone());
        ip(&["link", "set", &br, "up"])?;
        let net = pid % 250;
        for i in 0..hosts {
            let ns = format!("nm{tag}n{i}");
            let veth = format!("nm{tag}h{i}");
            let addr = format!("10.251.{net}.{}", i + 1);
            ip(&["netns", "add", &ns])?;
            lab.hosts.push(Host { ns: ns.clone(), addr: addr.clone() });
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip(&["link", "set", &veth, "master", &br, "up"])?;
            ip(&["netns", "exec", &ns, "ip", "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", "eth0", "up"])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        }
        Ok(lab)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    pub fn log_path(&self, name: &str) -> PathBuf {
        self.path(&format!("{name}.log"))
    }

    /// What process `name` logged so far (every incarnation of it: the file is appended to),
    /// without the terminal colours its log lines carry.
    pub fn log(&self, name: &str) -> String {
        plain(&std::fs::read_to_string(self.log_path(name)).unwrap_or_default())
    }

    /// Runs `program args` in host `host`'s namespace as process `name`, its stdout and stderr
    /// appended to `{name}.log` (info level). A process of that name that exited is replaced.
    pub fn spawn(&mut self, host: usize, name: &str, program: &str, args: &[String]) {
        let mut log = OpenOptions::new().create(true).append(true).open(self.log_path(name)).expect("a log file");
        let _ = writeln!(log, "=== started by the nemesis run at {} ms", now_ms());
        let child = Command::new("ip")
            .args(["netns", "exec", &self.hosts[host].ns, program])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("a log file")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("ip netns exec {program}: {e}"));
        if let Some(i) = self.procs.iter().position(|p| p.name == name) {
            let mut old = self.procs.remove(i);
            assert!(old.child.try_wait().ok().flatten().is_some(), "{name} was still running when started again");
        }
        self.procs.push(Proc { name: name.to_string(), child });
    }

    fn proc(&mut self, name: &str) -> &mut Child {
        let p = self.procs.iter_mut().find(|p| p.name == name);
        &mut p.unwrap_or_else(|| panic!("no process {name}")).child
    }

    /// `ip netns exec` execs the program, so this is the program's own pid.
    pub fn pid(&mut self, name: &str) -> u32 {
        self.proc(name).id()
    }

    /// Sends `sig` to process `name`.
    pub fn signal(&mut self, name: &str, sig: libc::c_int) {
        let pid = self.pid(name) as libc::pid_t;
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child's.
        #[allow(unsafe_code)]
        let r = unsafe { libc::kill(pid, sig) };
        assert_eq!(r, 0, "kill({pid}, {sig}) failed: {}", std::io::Error::last_os_error());
    }

    /// kill -9 of process `name`; once it is gone, the time (ms): nothing it did can come later.
    pub fn kill9(&mut self, name: &str) -> (u128, ExitStatus) {
        let child = self.proc(name);
        child.kill().unwrap_or_else(|e| panic!("kill -9 {name}: {e}"));
        let status = child.wait().unwrap_or_else(|e| panic!("wait for {name}: {e}"));
        (now_ms(), status)
    }

    /// Waits for process `name` to exit, at most `limit`.
    pub fn wait_exit(&mut self, name: &str, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.proc(name).try_wait().expect("wait") {
                return s;
            }
            assert!(start.elapsed() < limit, "{name} still running after {limit:?}:\n{}", tail(&self.log(name), 40));
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether process `name` still runs.
    pub fn running(&mut self, name: &str) -> bool {
        self.proc(name).try_wait().ok().flatten().is_none()
    }

    /// Whether `addr:port` accepts connections from host `host`.
    fn answers(&self, host: usize, addr: &str, port: u16) -> bool {
        let probe = format!("echo > /dev/tcp/{addr}/{port}");
        Command::new("ip")
            .args(["netns", "exec", &self.hosts[host].ns, "bash", "-c", &probe])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts etcd (Debian's `etcd-server`) on host `host`; its client address once it answers.
    pub fn etcd(&mut self, host: usize) -> String {
        let addr = self.hosts[host].addr.clone();
        let client = format!("http://{addr}:2379");
        let peer = "http://127.0.0.1:2380";
        let data = self.path("etcd").display().to_string();
        let args: Vec<String> = [
            "--name",
            "nemesis",
            "--data-dir",
            &data,
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            &format!("nemesis={peer}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        self.spawn(host, "etcd", "etcd", &args);
        let start = Instant::now();
        while !self.answers(host, &addr, 2379) {
            assert!(start.elapsed() < Duration::from_secs(30), "etcd did not start:\n{}", tail(&self.log("etcd"), 30));
            std::thread::sleep(Duration::from_millis(200));
        }
        format!("{addr}:2379")
    }

    /// A command run as the `postgres` user in the server's namespace (PostgreSQL refuses to run
    /// as root).
    fn as_postgres(&self, program: &str) -> Command {
        let pg = self.pg.as_ref().expect("PostgreSQL was set up");
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[pg.host].ns, "runuser", "-u", "postgres", "--"])
            .arg(pg.bin.join(program))
            .stdin(Stdio::null());
        c
    }

    /// `pg_ctl ARGS` on the run's server; its output goes to `pg_ctl.log`.
    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let pg = self.pg.as_ref().expect("PostgreSQL was set up");
        let mut log = OpenOptions::new().create(true).append(true).open(self.path("pg_ctl.log")).expect("a log file");
        let _ = writeln!(log, "=== pg_ctl {} at {} ms", args.join(" "), now_ms());
        let status = self
            .as_postgres("pg_ctl")
            .arg("-D")
            .arg(pg.dir.join("data"))
            .args(args)
            .stdout(Stdio::from(log.try_clone().expect("a log file")))
            .stderr(Stdio::from(log))
            .status()
            .map_err(|e| format!("pg_ctl {}: {e}", args.join(" ")))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("pg_ctl {} ({status}):\n{}", args.join(" "), tail(&self.pg_text(), 30)))
        }
    }

    /// The server's log and pg_ctl's, as far as they go.
    pub fn pg_text(&self) -> String {
        let server = self.pg.as_ref().map(|pg| std::fs::read_to_string(pg.dir.join("server.log")).unwrap_or_default());
        let ctl = std::fs::read_to_string(self.path("pg_ctl.log")).unwrap_or_default();
        format!("{ctl}\n--- server log\n{}", server.unwrap_or_default())
    }

    /// Makes a fresh PostgreSQL cluster (trust authentication) and starts it on host `host`,
    /// listening on that host's address; the URL nodes reach it at.
    pub fn postgres(&mut self, host: usize, bin: PathBuf) -> String {
        // The data directory must belong to the `postgres` user, which cannot enter target/.
        let dir = std::env::temp_dir().join(format!("shardline-nemesis-pg-{}", self.tag));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        run("chown", &["postgres:postgres", &dir.display().to_string()]).expect("chown of PostgreSQL's directory");
        self.pg = Some(Postgres { bin, dir: dir.clone(), host });
        let out = self
            .as_postgres("initdb")
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .output()
            .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb failed in {}: {}{}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        // initdb's trust covers the loopback only; the nodes connect from the lab's subnet.
        let hba = dir.join("data/pg_hba.conf");
        let mut conf = OpenOptions::new().append(true).open(&hba).unwrap_or_else(|e| panic!("{}: {e}", hba.display()));
        writeln!(conf, "host all all 10.251.0.0/16 trust").expect("pg_hba.conf is written");
        self.pg_start().unwrap_or_else(|e| panic!("PostgreSQL did not start: {e}"));
        format!("postgres://postgres@{}:{PG_PORT}/postgres", self.hosts[host].addr)
    }

    /// Starts the run's server and waits until it accepts connections.
    pub fn pg_start(&self) -> Result<(), String> {
        let pg = self.pg.as_ref().expect("PostgreSQL was set up");
        let opts = format!(
            "-c listen_addresses={} -p {PG_PORT} -k {} -c fsync=off -c max_connections=200",
            self.hosts[pg.host].addr,
            pg.dir.display()
        );
        let log = pg.dir.join("server.log").display().to_string();
        self.pg_ctl(&["-l", &log, "-o", &opts, "-w", "-t", "60", "start"])
    }

    /// Stops the run's server with `mode` (`fast`: every session is ended, transactions in
    /// progress roll back; `immediate`: no shutdown at all) and waits until it is gone.
    pub fn pg_stop(&self, mode: &str) -> Result<(), String> {
        self.pg_ctl(&["-m", mode, "-w", "-t", "60", "stop"])
    }

    /// Whether the run's server runs (`pg_ctl status`).
    pub fn pg_running(&self) -> bool {
        self.pg_ctl(&["status"]).is_ok()
    }

    /// Loads `rules` (an nftables script) in host `host`'s namespace; the script is kept in the
    /// run's directory.
    pub fn nft(&self, host: usize, file: &str, rules: &str) {
        let path = self.path(file);
        std::fs::write(&path, rules).expect("the nftables script is written");
        run("ip", &["netns", "exec", &self.hosts[host].ns, "nft", "-f", &path.display().to_string()])
            .unwrap_or_else(|e| panic!("nftables rules for {}: {e}", self.hosts[host].ns));
    }

    /// Packets the counters of table `inet nemesis` in host `host` saw; the table is deleted.
    pub fn nft_remove(&self, host: usize) -> u64 {
        let ns = &self.hosts[host].ns;
        let listed = run("ip", &["netns", "exec", ns, "nft", "list", "table", "inet", "nemesis"])
            .unwrap_or_else(|e| panic!("listing the nftables table in {ns}: {e}"));
        run("ip", &["netns", "exec", ns, "nft", "delete", "table", "inet", "nemesis"])
            .unwrap_or_else(|e| panic!("deleting the nftables table in {ns}: {e}"));
        let words: Vec<&str> = listed.split_whitespace().collect();
        words
            .windows(3)
            .filter(|w| w[0] == "counter" && w[1] == "packets")
            .filter_map(|w| w[2].parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        if let Some(pg) = &self.pg {
            if self.pg_stop("immediate").is_err() {
                // pg_ctl failed: the postmaster's pid is the first line of postmaster.pid.
                if let Some(pid) = std::fs::read_to_string(pg.dir.join("data/postmaster.pid"))
                    .ok()
                    .and_then(|t| t.lines().next().map(str::to_string))
                {
                    let _ = run("kill", &["-KILL", &pid]);
                }
            }
            let _ = std::fs::copy(pg.dir.join("server.log"), self.path("postgres.log"));
            let _ = std::fs::remove_dir_all(&pg.dir);
        }
        for h in &self.hosts {
            let _ = ip(&["netns", "del", &h.ns]);
        }
        if let Some(br) = &self.bridge {
            let _ = ip(&["link", "del", br]);
        }
        let keep = std::env::var_os("SHARDLINE_NEMESIS_KEEP").is_some();
        if std::thread::panicking() || keep {
            eprintln!("the nemesis run's files (logs, ownership log, history) are in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `text` without ANSI escape sequences (`ESC [ … letter`).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Skip to the sequence's final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
