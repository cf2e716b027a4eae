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
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod ownership;
use ownership::{check_ownership, now_ms, ownership_events};

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
    /// The `--split-brain` policy every member runs.
    policy: String,
    /// How members find the cluster (`--seeds …` or `--membership …`).
    membership: Vec<String>,
    hosts: Vec<Host>,
    procs: Vec<Child>,
    dir: PathBuf,
}

impl Lab {
    /// `sides[i]` is the bridge (0 or 1) of host `i`.
    fn new(sides: &[usize], policy: &str) -> Result<Lab, String> {
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

    /// The history `shardline load` named `name` recorded.
    fn history(&self, name: &str) -> PathBuf {
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
    fn node(&mut self, i: usize, name: &str) -> usize {
        let addr = format!("{}:7000", self.hosts[i].addr);
        let mut args: Vec<String> = vec!["node".into(), "--name".into(), name.into(), "--bind".into(), addr];
        args.extend(self.member_flags());
        args.extend(["--store".into(), format!("sqlite://{}", self.journal().display())]);
        args.extend(["--ownership-log".into(), self.ownership().display().to_string()]);
        self.spawn(i, name, BIN, &args)
    }

    /// Starts `shardline load` on host `i` for `secs`, its report to `{name}.json`.
    fn load(&mut self, i: usize, name: &str, secs: u64) -> usize {
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
    fn etcd(&mut self, i: usize) -> String {
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
    fn isolate(&self, x: usize, others: &[usize], cut: bool) {
        for &o in others {
            self.cut_one_way(x, o, cut);
            self.cut_one_way(o, x, cut);
        }
    }

    /// Drops every packet host `from` sends to host `to` (`cut`), or lets them through again.
    fn cut_one_way(&self, from: usize, to: usize, cut: bool) {
        let verb = if cut { "add" } else { "del" };
        let dst = format!("{}/32", self.hosts[to].addr);
        ip(&["netns", "exec", &self.hosts[from].ns, "ip", "route", verb, "blackhole", &dst])
            .expect("the blackhole route changes");
    }

    /// Sends `sig` to process `p` (`SIGSTOP`, `SIGCONT`).
    fn signal(&self, p: usize, sig: libc::c_int) {
        let pid = self.procs[p].id() as libc::pid_t;
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child's
        // (`ip netns exec` execs the program in its place).
        #[allow(unsafe_code)]
        let r = unsafe { libc::kill(pid, sig) };
        assert_eq!(r, 0, "kill({pid}, {sig}) failed: {}", std::io::Error::last_os_error());
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

/// Nodes `n1`… on the bridges `sides` says (the load driver on bridge 0, with the first two
/// nodes as seeds), all with `policy`; the trunk is cut for 25 s under load. The nodes named in
/// `downed` must down themselves and the others survive; nothing acknowledged is lost, no shard
/// is hosted on both sides, and after the heal every node hosts shards again. With `cut_after`,
/// the downed nodes stay cut from the other nodes (not from the load driver) for that long after
/// the trunk comes back, so that the driver, a proxy, is their only way to the cluster.
fn split_under_load(sides: &[usize], policy: &str, downed: &[&str], cut_after: Duration) {
    split_for(sides, policy, downed, cut_after, Duration::from_secs(25), Duration::from_secs(60));
}

/// [`split_under_load`] with the trunk down for `cut_for`, and every node hosting again within
/// `rehosted_within` of the heal.
fn split_for(
    sides: &[usize],
    policy: &str,
    downed: &[&str],
    cut_after: Duration,
    cut_for: Duration,
    rehosted_within: Duration,
) {
    let _turn = one_at_a_time();
    let mut all = sides.to_vec();
    all.push(0);
    let mut lab = match Lab::new(&all, policy) {
        Ok(lab) => lab,
        Err(e) => panic!("this test needs root and iproute2 (network namespaces): {e}"),
    };
    let driver = sides.len();
    let names: Vec<String> = (1..=sides.len()).map(|i| format!("n{i}")).collect();
    let seeds = format!("{}:7000,{}:7000", lab.hosts[0].addr, lab.hosts[1].addr);
    lab.membership = vec!["--seeds".into(), seeds];
    for (i, name) in names.iter().enumerate() {
        lab.node(i, name);
        if i == 0 {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    every_node_hosts(&mut lab, driver, names.len(), "warmup", Duration::from_secs(90));
    let load = lab.load(driver, "load", 50);
    std::thread::sleep(Duration::from_secs(5));
    lab.trunk(false);
    // Routes that drop the downed nodes' traffic with the survivors, set while the trunk is
    // down and kept a while after it comes back.
    let (cut_off, others): (Vec<usize>, Vec<usize>) =
        (0..names.len()).partition(|i| downed.contains(&names[*i].as_str()));
    if !cut_after.is_zero() {
        for &x in &cut_off {
            lab.isolate(x, &others, true);
        }
    }
    std::thread::sleep(cut_for);
    lab.trunk(true);
    if !cut_after.is_zero() {
        std::thread::sleep(cut_after);
        for &x in &cut_off {
            lab.isolate(x, &others, false);
        }
    }
    assert_eq!(lab.wait(load, Duration::from_secs(150)), Some(0), "load:\n{}", lab.text("load"));
    let report = lab.report("load");
    assert!(audit_is_clean(&report), "{report}");
    assert!(report["acked"].as_u64().unwrap_or(0) > 0, "{report}");
    for name in &names {
        let text = lab.text(name);
        if downed.contains(&name.as_str()) {
            assert!(text.contains("this node was declared down"), "{name} downed itself:\n{text}");
            assert!(text.contains("rejoining as a new incarnation"), "{name} came back:\n{text}");
        } else {
            assert!(!text.contains("this node was declared down"), "{name} survived:\n{text}");
        }
    }
    // Any member of the surviving side may decide first and spread it, the load driver (a proxy)
    // included.
    let survivors: String =
        names.iter().filter(|n| !downed.contains(&n.as_str())).map(|n| lab.text(n)).chain([lab.text("load")]).collect();
    assert!(survivors.contains("this side survives"), "the surviving side resolved the split");
    // After the heal the downed rejoin and are given shards again.
    every_node_hosts(&mut lab, driver, names.len(), "after", rehosted_within);
    let ownership = lab.ownership();
    if let Err(overlap) = std::panic::catch_unwind(|| check_ownership(&ownership, &[])) {
        print_decisions(&lab, names.iter().map(String::as_str));
        std::panic::resume_unwind(overlap);
    }
}

/// Prints the lines of every node's log (and the load driver's) that tell when each decided and
/// stopped: an overlap is read from those.
fn print_decisions<'a>(lab: &Lab, names: impl Iterator<Item = &'a str>) {
    let wanted =
        ["declared down", "survives", "unreachable", "shard st", "fenced", "rejoin", "leads", "gone", "majority"];
    for name in names.chain(["load"]) {
        let text = lab.text(name);
        let lines: Vec<&str> = text.lines().filter(|l| wanted.iter().any(|w| l.contains(w))).collect();
        eprintln!("--- {name}\n{}", lines.join("\n"));
    }
}

/// One lab at a time: their timing (a 2 s stable-after) is what is under test, and two of them
/// at once on two cores would be measuring the machine.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Short load runs from host `driver` until every one of the `nodes` hosts shards (each run
/// reports where shards live, and audits what it wrote).
fn every_node_hosts(lab: &mut Lab, driver: usize, nodes: usize, name: &str, limit: Duration) {
    let start = Instant::now();
    loop {
        let p = lab.load(driver, name, 2);
        assert_eq!(lab.wait(p, Duration::from_secs(120)), Some(0), "load {name}:\n{}", lab.text(name));
        let report = lab.report(name);
        assert!(audit_is_clean(&report), "{report}");
        if hosts_in(&report).len() == nodes {
            return;
        }
        assert!(start.elapsed() < limit, "{name}: not every node hosts shards: {report}");
    }
}

/// A shard in the ownership log: its entity type and number.
type ShardKey = (String, String);

/// The shards n3 hosted at `cut` (by the ownership log), and those of them no other node has
/// started since.
fn not_taken_over(lab: &Lab, cut: u128) -> (Vec<ShardKey>, Vec<ShardKey>) {
    let events = ownership_events(&lab.ownership());
    let mut held = std::collections::BTreeSet::new();
    for (_, _, key, start) in events.iter().filter(|e| e.0 <= cut && e.1.starts_with("n3#")) {
        if *start {
            held.insert(key.clone());
        } else {
            held.remove(key);
        }
    }
    let waiting = held
        .iter()
        .filter(|key| {
            !events.iter().any(|(t, node, k, start)| *start && k == *key && *t > cut && !node.starts_with("n3#"))
        })
        .cloned()
        .collect();
    (held.into_iter().collect(), waiting)
}

/// Waits until every shard n3 hosted at `cut` has started on another node (at most 120 s).
fn until_taken_over(lab: &Lab, cut: u128) {
    let start = Instant::now();
    loop {
        let (held, waiting) = not_taken_over(lab, cut);
        assert!(!held.is_empty(), "n3 hosted nothing at the cut");
        if waiting.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "shards of n3 never taken over while it was out: {waiting:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// How n3 is taken out in [`n3_out_until_taken_over`].
#[derive(Clone, Copy, Debug)]
enum Out {
    /// `SIGSTOP`, and `SIGCONT` to undo it.
    Frozen,
    /// Everything n3 sends to the others is dropped; it still hears them.
    Mute,
    /// Everything the others send to n3 is dropped; they still hear it.
    Deaf,
}

/// Three nodes at the defaults (only `--seeds`) under load with a recorded history: n3 is taken
/// out (`out`) until every shard it hosted has started on another node, then brought back. It
/// must have stopped processing before the others started: the ownership log shows no shard on
/// two nodes, the history no stale read, the ledger nothing lost; n3 learns it was downed,
/// rejoins and hosts again.
fn n3_out_until_taken_over(out: Out) {
    let _turn = one_at_a_time();
    let mut lab = match Lab::new(&[0, 0, 0, 0], "default") {
        Ok(lab) => lab,
        Err(e) => panic!("this test needs root and iproute2 (network namespaces): {e}"),
    };
    let driver = 3;
    let seeds = format!("{}:7000,{}:7000", lab.hosts[0].addr, lab.hosts[1].addr);
    lab.membership = vec!["--seeds".into(), seeds];
    let names = ["n1", "n2", "n3"];
    let mut procs = Vec::new();
    for (i, name) in names.iter().enumerate() {
        procs.push(lab.node(i, name));
        if i == 0 {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    every_node_hosts(&mut lab, driver, names.len(), "warmup", Duration::from_secs(90));
    let load = lab.load(driver, "load", 45);
    std::thread::sleep(Duration::from_secs(5));
    let cut = now_ms();
    let links = |lab: &Lab, on: bool| {
        for o in [0, 1, driver] {
            match out {
                Out::Mute => lab.cut_one_way(2, o, on),
                Out::Deaf => lab.cut_one_way(o, 2, on),
                Out::Frozen => {}
            }
        }
    };
    match out {
        Out::Frozen => lab.signal(procs[2], libc::SIGSTOP),
        Out::Mute | Out::Deaf => links(&lab, true),
    }
    until_taken_over(&lab, cut);
    let taken_over = now_ms() - cut;
    match out {
        Out::Frozen => lab.signal(procs[2], libc::SIGCONT),
        Out::Mute | Out::Deaf => links(&lab, false),
    }
    assert_eq!(lab.wait(load, Duration::from_secs(150)), Some(0), "load:\n{}", lab.text("load"));
    let report = lab.report("load");
    assert!(audit_is_clean(&report), "{report}");
    let n3 = lab.text("n3");
    assert!(n3.contains("this node was declared down"), "n3 learnt it was downed:\n{n3}");
    for n in ["n1", "n2"] {
        assert!(!lab.text(n).contains("this node was declared down"), "{n} survived:\n{}", lab.text(n));
    }
    // Measured, not asserted: detection, the resolver's window and its margin.
    println!("{out:?}: every shard of n3 served elsewhere {taken_over} ms after it went out");
    every_node_hosts(&mut lab, driver, names.len(), "after", Duration::from_secs(60));
    let history = lab.history("load").display().to_string();
    let ownership = lab.ownership().display().to_string();
    let checked = Command::new(BIN).args(["check", &history, "--ownership-log", &ownership]).output();
    let checked = checked.expect("shardline check runs");
    let said = format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
    if checked.status.code() != Some(0) {
        print_decisions(&lab, names.iter().copied());
        panic!("{out:?}: the history or the ownership log is not clean:\n{said}");
    }
}

/// n3 frozen by `SIGSTOP` past its detection and the takeover of its shards, then woken: it
/// wakes unable to process (no majority answered it within the window) and hears it was downed.
#[test]
fn gossip_at_the_defaults_a_frozen_node_processes_nothing_once_its_shards_moved() {
    n3_out_until_taken_over(Out::Frozen);
}

/// n3's packets to the others dropped (it still hears them): no answers reach it, it stops
/// within the window, before the others take over.
#[test]
fn gossip_at_the_defaults_a_node_whose_packets_are_lost_stops_before_its_shards_move() {
    n3_out_until_taken_over(Out::Mute);
}

/// The others' packets to n3 dropped (they still hear it): the same.
#[test]
fn gossip_at_the_defaults_a_node_that_hears_nothing_stops_before_its_shards_move() {
    n3_out_until_taken_over(Out::Deaf);
}

/// Gossip with `KeepMajority`, five nodes split 2|3: the two down themselves.
#[test]
fn gossip_keep_majority_survives_a_2_3_split() {
    split_under_load(&[0, 0, 0, 1, 1], "keep-majority", &["n4", "n5"], Duration::ZERO);
}

/// Three nodes given only `--seeds` (the defaults: `KeepMajority`, 5 s stable-after), split
/// 2|1 for 20 s: the one downs itself, no shard is hosted on two nodes at any instant, and every
/// node hosts again within 20 s of the heal.
#[test]
fn gossip_at_the_defaults_survives_a_2_1_split_healed_after_20_s() {
    split_for(&[0, 0, 1], "default", &["n3"], Duration::ZERO, Duration::from_secs(20), Duration::from_secs(20));
}

/// `KeepMajority` on a 2|2 split: a tie, which the side with the lowest node (`n1`) keeps. The
/// load driver is a proxy: it does not count, and follows its side.
#[test]
fn gossip_keep_majority_breaks_a_2_2_tie_by_the_lowest_node() {
    split_under_load(&[0, 0, 1, 1], "keep-majority", &["n3", "n4"], Duration::ZERO);
}

/// The 2|2 split again, with the downed `n3` and `n4` still cut from `n1` and `n2` for 8 s after
/// the trunk comes back: the load driver, a proxy, is their only way to the cluster. Its status
/// carries the cluster's term, and a rejoined member that had heard of no other member took a
/// term above it on that alone: its coordinator gave shards to itself that `n2` still hosted (a
/// shard on two nodes for 147 ms in one run of the plain 2|2 test). A member takes no term above
/// one whose leader it has not heard of until that leader's status had time to arrive.
#[test]
fn gossip_keep_majority_2_2_with_the_downed_side_reaching_only_the_driver_after_the_heal() {
    split_under_load(&[0, 0, 1, 1], "keep-majority", &["n3", "n4"], Duration::from_secs(8));
}

/// `StaticQuorum` of 3 on a 2|3 split: only the side with three members may go on. (The first
/// seed stays on that side: a downed first seed that restarts while still cut off would start a
/// second cluster; see the design notes.)
#[test]
fn gossip_static_quorum_keeps_the_side_with_a_quorum() {
    split_under_load(&[0, 1, 0, 0, 1], "static-quorum:3", &["n2", "n5"], Duration::ZERO);
}

/// Lease membership on etcd: `n3` is cut from its peers and the load driver, but not from etcd.
/// Its key lives on, so only the keep-alives show the cut: the majority wins the split-brain race
/// at once, `n3` reads the flag, stops its shards and deletes its key, the others take its shards
/// while the cut lasts; after the heal it rejoins as a new incarnation and hosts again.
#[test]
fn lease_a_node_cut_from_its_peers_but_not_from_etcd_loses_the_race() {
    let _turn = one_at_a_time();
    // Hosts: etcd, n1, n2, n3, the load driver; one bridge.
    let mut lab = match Lab::new(&[0, 0, 0, 0, 0], "keep-majority") {
        Ok(lab) => lab,
        Err(e) => panic!("this test needs root and iproute2 (network namespaces): {e}"),
    };
    let etcd = lab.etcd(0);
    lab.membership = vec!["--membership".into(), format!("etcd://{etcd}")];
    let names = ["n1", "n2", "n3"];
    for (i, name) in names.iter().enumerate() {
        lab.node(i + 1, name);
    }
    let driver = 4;
    every_node_hosts(&mut lab, driver, names.len(), "warmup", Duration::from_secs(90));
    let load = lab.load(driver, "load", 45);
    std::thread::sleep(Duration::from_secs(5));
    let cut = now_ms();
    lab.isolate(3, &[1, 2, driver], true);
    std::thread::sleep(Duration::from_secs(20));
    // The cut lasts until every shard n3 hosted has started on another node: what the cut must
    // bring about, however long it takes here (the figure is printed below).
    until_taken_over(&lab, cut);
    let heal = now_ms();
    lab.isolate(3, &[1, 2, driver], false);
    assert_eq!(lab.wait(load, Duration::from_secs(150)), Some(0), "load:\n{}", lab.text("load"));
    let report = lab.report("load");
    assert!(audit_is_clean(&report), "{report}");
    assert!(report["acked"].as_u64().unwrap_or(0) > 0, "{report}");
    let n3 = lab.text("n3");
    assert!(n3.contains("downed by the split-brain resolver"), "n3 lost the race:\n{n3}");
    assert!(n3.contains("rejoining as a new incarnation"), "n3 came back:\n{n3}");
    let survivors: String = ["n1", "n2", "load"].iter().map(|n| lab.text(n)).collect();
    assert!(survivors.contains("this side survives"), "the majority won the race");
    for n in ["n1", "n2"] {
        assert!(!lab.text(n).contains("downed by the split-brain resolver"), "{n} survived:\n{}", lab.text(n));
    }
    // Every shard n3 hosted at the cut started on another node before the heal.
    let events = ownership_events(&lab.ownership());
    let (held, _) = not_taken_over(&lab, cut);
    let mut slowest = 0;
    for key in &held {
        let moved =
            events.iter().find(|(t, node, k, start)| *start && k == key && *t > cut && !node.starts_with("n3#"));
        match moved {
            Some((t, ..)) if *t < heal => slowest = slowest.max(t - cut),
            _ => panic!("shard {key:?} of n3 was not taken over while n3 was cut off"),
        }
    }
    // Measured, not asserted (timings are the benchmarks' business): TTL 3 s + stable-after 2 s
    // + 1 s is the goal.
    println!("the {} shards of the cut node all served elsewhere {slowest} ms after the cut", held.len());
    every_node_hosts(&mut lab, driver, names.len(), "after", Duration::from_secs(60));
    check_ownership(&lab.ownership(), &[]);
}
