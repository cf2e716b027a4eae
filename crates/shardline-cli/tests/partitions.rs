//! Real partitions: `shardline node` processes, each in a Linux network namespace of its own,
//! joined by veth pairs to one of two bridges; the bridges are joined by a veth "trunk" whose
//! link is taken down to split the cluster and brought up to heal it. Load comes from
//! `shardline load`, in a namespace of its own on the majority's side, which audits its ledger
//! at the end. An ownership log that every node appends to proves no shard was hosted on both
//! sides.
//!
//! Needs root and iproute2 (`ip netns`, `ip link`; the test command installs iproute2 when it is
//! missing). Without them this fails, loudly: it is never skipped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod ownership;
use ownership::check_ownership;

const SHARDS: u32 = 64;
const BIN: &str = env!("CARGO_BIN_EXE_shardline");

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
struct Host {
    ns: String,
    addr: String,
}

/// Two bridges joined by a trunk, and hosts on each; everything is removed on drop.
struct Lab {
    tag: String,
    hosts: Vec<Host>,
    procs: Vec<Child>,
    dir: PathBuf,
}

impl Lab {
    /// `sides[i]` is the bridge (0 or 1) of host `i`.
    fn new(sides: &[usize]) -> Result<Lab, String> {
        let pid = std::process::id();
        let tag = format!("{:x}", pid % 0xffff);
        let dir = std::env::temp_dir().join(format!("shardline-partitions-{pid}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut lab = Lab { tag: tag.clone(), hosts: Vec::new(), procs: Vec::new(), dir };
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
    fn trunk(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["link", "set", &format!("sl{}ta", self.tag), state]).expect("the trunk link changes state");
    }

    fn journal(&self) -> PathBuf {
        self.dir.join("journal.db")
    }

    fn ownership(&self) -> PathBuf {
        self.dir.join("ownership.log")
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// Runs `shardline ARGS` in host `i`'s namespace, its stderr (info log) to `{name}.log`.
    fn spawn(&mut self, i: usize, name: &str, args: &[String]) -> usize {
        let log = std::fs::File::create(self.log(name)).expect("log file");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.hosts[i].ns, BIN])
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

    /// Starts `shardline node` named `name` on host `i`, joining through `seeds`.
    fn node(&mut self, i: usize, name: &str, seeds: &str) {
        let addr = format!("{}:7000", self.hosts[i].addr);
        let args: Vec<String> = [
            "node",
            "--name",
            name,
            "--bind",
            &addr,
            "--seeds",
            seeds,
            "--shards",
            &SHARDS.to_string(),
            "--split-brain",
            "keep-majority",
            "--stable-after-ms",
            "2000",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["--store".into(), format!("sqlite://{}", self.journal().display())])
        .chain(["--ownership-log".into(), self.ownership().display().to_string()])
        .collect();
        self.spawn(i, name, &args);
    }

    /// Starts `shardline load` on host `i` for `secs`, its report to `{name}.json`.
    fn load(&mut self, i: usize, name: &str, seeds: &str, secs: u64) -> usize {
        let args: Vec<String> = [
            "load",
            "--name",
            name,
            "--bind",
            &format!("{}:7100", self.hosts[i].addr),
            "--seeds",
            seeds,
            "--shards",
            &SHARDS.to_string(),
            "--entities",
            "500",
            "--concurrency",
            "16",
            "--duration-secs",
            &secs.to_string(),
            "--split-brain",
            "keep-majority",
            "--stable-after-ms",
            "2000",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["--json".into(), self.dir.join(format!("{name}.json")).display().to_string()])
        .collect();
        self.spawn(i, name, &args)
    }

    /// Waits for process `p` to exit; its exit code.
    fn wait(&mut self, p: usize, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.procs[p].try_wait().expect("wait") {
                return status.code();
            }
            assert!(start.elapsed() < limit, "process {p} still running after {limit:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn report(&self, name: &str) -> serde_json::Value {
        let path = self.dir.join(format!("{name}.json"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), self.text(name)));
        serde_json::from_slice(&bytes).expect("a JSON report")
    }

    fn text(&self, name: &str) -> String {
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

/// The names of the hosts in a load report's `nodes`.
fn hosts_in(report: &serde_json::Value) -> Vec<String> {
    report["nodes"]
        .as_array()
        .map_or(Vec::new(), |a| a.iter().filter_map(|n| n["name"].as_str()).map(String::from).collect())
}

fn audit_is_clean(report: &serde_json::Value) -> bool {
    ["lost_acked", "double_applied", "ledger_mismatches"].iter().all(|k| report["invariants"][k].as_u64() == Some(0))
}

/// Gossip with `KeepMajority`, five nodes split 2|3 under load for 25 s: the two down themselves,
/// the three take every shard, no shard is hosted on both sides, nothing acknowledged is lost;
/// after the heal the two come back as new incarnations and are given shards again.
#[test]
fn gossip_keep_majority_survives_a_2_3_split() {
    // Hosts 0–2 and the load driver (5) on bridge 0, hosts 3–4 on bridge 1.
    let mut lab = match Lab::new(&[0, 0, 0, 1, 1, 0]) {
        Ok(lab) => lab,
        Err(e) => panic!("this test needs root and iproute2 (network namespaces): {e}"),
    };
    let seeds = format!("{}:7000,{}:7000", lab.hosts[0].addr, lab.hosts[1].addr);
    for (i, name) in ["n1", "n2", "n3", "n4", "n5"].iter().enumerate() {
        lab.node(i, name, &seeds);
        if i == 0 {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    // Every node hosts shards before the split (a short load run reports where shards live).
    let start = Instant::now();
    loop {
        let p = lab.load(5, "warmup", &seeds, 2);
        assert_eq!(lab.wait(p, Duration::from_secs(120)), Some(0), "warm-up load:\n{}", lab.text("warmup"));
        let hosts = hosts_in(&lab.report("warmup"));
        if hosts.len() == 5 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(90), "the cluster never spread over five nodes: {hosts:?}");
    }
    let load = lab.load(5, "load", &seeds, 50);
    std::thread::sleep(Duration::from_secs(5));
    lab.trunk(false);
    std::thread::sleep(Duration::from_secs(25));
    lab.trunk(true);
    assert_eq!(lab.wait(load, Duration::from_secs(150)), Some(0), "load:\n{}", lab.text("load"));
    let report = lab.report("load");
    assert!(audit_is_clean(&report), "{report}");
    assert!(report["acked"].as_u64().unwrap_or(0) > 0, "{report}");
    for name in ["n4", "n5"] {
        let text = lab.text(name);
        assert!(text.contains("this node was declared down"), "{name} downed itself:\n{text}");
        assert!(text.contains("rejoining as a new incarnation"), "{name} came back:\n{text}");
    }
    let survivors: String = ["n1", "n2", "n3"].iter().map(|n| lab.text(n)).collect();
    assert!(survivors.contains("this side survives"), "the majority resolved the split");
    // After the heal the two rejoin and are given shards again.
    let start = Instant::now();
    loop {
        let p = lab.load(5, "after", &seeds, 2);
        assert_eq!(lab.wait(p, Duration::from_secs(120)), Some(0), "load after the heal:\n{}", lab.text("after"));
        let after = lab.report("after");
        assert!(audit_is_clean(&after), "{after}");
        if hosts_in(&after).len() == 5 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "n4 and n5 never hosted again: {after}");
    }
    check_ownership(&lab.ownership(), &[]);
}
