//! The partition tests' lab: Linux network namespaces, one host each, on two bridges joined by a
//! trunk link; the processes that run in them (nodes, load drivers, etcd) and the routes that cut
//! hosts apart. Everything it made is taken down on drop, a panic included: processes, namespaces,
//! the trunk, the bridges.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The shard count every member and load driver runs with.
const SHARDS: u32 = 64;
/// The `shardline` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_shardline");

/// Runs `ip` with `args`; a failure is an error naming the command and what it said.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// One host: a network namespace with one address.
pub struct Host {
    ns: String,
    pub addr: String,
}

/// Two bridges joined by a trunk, and hosts on each; everything is removed on drop.
pub struct Lab {
    tag: String,
    /// The `--split-brain` policy every member runs.
    policy: String,
    /// How members find the cluster (`--seeds …` or `--membership …`).
    pub membership: Vec<String>,
    pub hosts: Vec<Host>,
    procs: Vec<Child>,
    dir: PathBuf,
}

impl Lab {
    /// `sides[i]` is the bridge (0 or 1) of host `i`.
    pub fn new(sides: &[usize], policy: &str) -> Result<Lab, String> {
        static LABS: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let n = LABS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{:x}{n}", pid % 0xfff);
        let dir = std::env::temp_dir().join(format!("shardline-partitions-{pid}-{n}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut lab = Lab {
            tag: tag.clone(),
            policy: policy.to_string(),
            membership: Vec::new(),
            hosts: Vec::new(),
            procs: Vec::new(),
            dir,
        };
        let net = pid % 250;
        for b in 0..2 {
            let br = lab.bridge(b);
            ip(&["link", "add", &br, "type", "bridge"])?;
            ip(&["link", "set", &br, "up"])?;
        }
        let (ta, tb) = (format!("sl{tag}ta"), format!("sl{tag}tb"));
        ip(&["link", "add", &ta, "type", "veth", "peer", "name", &tb])?;
        ip(&["link", "set", &ta, "master", &lab.bridge(0), "up"])?;
        ip(&["link", "set", &tb, "master", &lab.bridge(1), "up"])?;
        for (i, side) in sides.iter().enumerate() {
            let ns = format!("sl{tag}n{i}");
            let veth = format!("sl{tag}h{i}");
            let addr = format!("10.250.{net}.{}", i + 1);
            ip(&["netns", "add", &ns])?;
            lab.hosts.push(Host { ns: ns.clone(), addr: addr.clone() });
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip(&["link", "set", &veth, "master", &lab.bridge(*side), "up"])?;
            ip(&["netns", "exec", &ns, "ip", "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", "eth0", "up"])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        }
        Ok(lab)
    }

    fn bridge(&self, side: usize) -> String {
        format!("sl{}b{side}", self.tag)
    }

    /// Splits the two bridges (`false`) or joins them again (`true`).
    pub fn trunk(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["link", "set", &format!("sl{}ta", self.tag), state]).expect("the trunk link changes state");
    }

    fn journal(&self) -> PathBuf {
        self.dir.join("journal.db")
    }

    pub fn ownership(&self) -> PathBuf {
        self.dir.join("ownership.log")
    }

    /// The history `shardline load` named `name` recorded.
    pub fn history(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.history.jsonl"))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// Runs `program ARGS` in host `i`'s namespace, its stderr (info log) to `{name}.log`.
    fn spawn(&mut self, i: usize, name: &str, program: &str, args: &[String]) -> usize {
        let log = std::fs::File::create(self.log(name)).expect("log file");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.hosts[i].ns, program])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log file")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("ip netns exec starts");
        self.procs.push(child);
        self.procs.len() - 1
    }

    /// The flags every member and load driver runs with: membership and partition settings
    /// (none for the policy `default`: the defaults are under test).
    fn member_flags(&self) -> Vec<String> {
        let mut flags = self.membership.clone();
        flags.extend(["--shards".into(), SHARDS.to_string()]);
        if self.policy != "default" {
            flags.extend(["--split-brain".into(), self.policy.clone()]);
            flags.extend(["--stable-after-ms".into(), "2000".into()]);
        }
        flags
    }

    /// Starts `shardline node` named `name` on host `i`.
    pub fn node(&mut self, i: usize, name: &str) -> usize {
        let addr = format!("{}:7000", self.hosts[i].addr);
        let mut args: Vec<String> = vec!["node".into(), "--name".into(), name.into(), "--bind".into(), addr];
        args.extend(self.member_flags());
        args.extend(["--store".into(), format!("sqlite://{}", self.journal().display())]);
        args.extend(["--ownership-log".into(), self.ownership().display().to_string()]);
        self.spawn(i, name, BIN, &args)
    }

    /// Starts `shardline load` on host `i` for `secs`, its report to `{name}.json`.
    pub fn load(&mut self, i: usize, name: &str, secs: u64) -> usize {
        let bind = format!("{}:7100", self.hosts[i].addr);
        let mut args: Vec<String> = vec!["load".into(), "--name".into(), name.into(), "--bind".into(), bind];
        args.extend(self.member_flags());
        for (flag, value) in
            [("--entities", "500".to_string()), ("--concurrency", "16".into()), ("--duration-secs", secs.to_string())]
        {
            args.extend([flag.to_string(), value]);
        }
        args.extend(["--json".into(), self.dir.join(format!("{name}.json")).display().to_string()]);
        args.extend(["--history".into(), self.history(name).display().to_string()]);
        self.spawn(i, name, BIN, &args)
    }

    /// Starts etcd on host `i` (Debian's `etcd-server`); its client address once it answers.
    pub fn etcd(&mut self, i: usize) -> String {
        let addr = self.hosts[i].addr.clone();
        let client = format!("http://{addr}:2379");
        let peer = "http://127.0.0.1:2380".to_string();
        let data = self.dir.join("etcd").display().to_string();
        let args: Vec<String> = [
            "--name",
            "lab",
            "--data-dir",
            &data,
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("lab={peer}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        self.spawn(i, "etcd", "etcd", &args);
        let start = Instant::now();
        let probe = format!("echo > /dev/tcp/{addr}/2379");
        while !Command::new("ip")
            .args(["netns", "exec", &self.hosts[i].ns, "bash", "-c", &probe])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "etcd (package etcd-server) did not start:\n{}",
                self.text("etcd")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        format!("{addr}:2379")
    }

    /// Cuts host `x` from hosts `others` both ways (`cut`), or joins them again: routes that drop
    /// every packet, so the hosts' other links (the store's) stay up.
    pub fn isolate(&self, x: usize, others: &[usize], cut: bool) {
        for &o in others {
            self.cut_one_way(x, o, cut);
            self.cut_one_way(o, x, cut);
        }
    }

    /// Drops every packet host `from` sends to host `to` (`cut`), or lets them through again.
    pub fn cut_one_way(&self, from: usize, to: usize, cut: bool) {
        let verb = if cut { "add" } else { "del" };
        let dst = format!("{}/32", self.hosts[to].addr);
        ip(&["netns", "exec", &self.hosts[from].ns, "ip", "route", verb, "blackhole", &dst])
            .expect("the blackhole route changes");
    }

    /// Sends `sig` to process `p` (`SIGSTOP`, `SIGCONT`).
    pub fn signal(&self, p: usize, sig: libc::c_int) {
        let pid = self.procs[p].id() as libc::pid_t;
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child's
        // (`ip netns exec` execs the program in its place).
        #[allow(unsafe_code)]
        let r = unsafe { libc::kill(pid, sig) };
        assert_eq!(r, 0, "kill({pid}, {sig}) failed: {}", std::io::Error::last_os_error());
    }

    /// Waits for process `p` to exit; its exit code.
    pub fn wait(&mut self, p: usize, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.procs[p].try_wait().expect("wait") {
                return status.code();
            }
            assert!(start.elapsed() < limit, "process {p} still running after {limit:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn report(&self, name: &str) -> serde_json::Value {
        let path = self.dir.join(format!("{name}.json"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), self.text(name)));
        serde_json::from_slice(&bytes).expect("a JSON report")
    }

    pub fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.log(name)).unwrap_or_default()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.kill();
            let _ = p.wait();
        }
        for h in &self.hosts {
            let _ = ip(&["netns", "del", &h.ns]);
        }
        let _ = ip(&["link", "del", &format!("sl{}ta", self.tag)]);
        for b in 0..2 {
            let _ = ip(&["link", "del", &self.bridge(b)]);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
