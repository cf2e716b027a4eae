//! Security of `shardline node` processes on 127.0.0.1: a mutual-TLS cluster made with
//! `shardline certs` refuses a node without TLS, and an admin API beyond loopback needs its token
//! (which no log shows).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    shardline::ports::free_port().unwrap()
}

fn dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardline-security-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `shardline node NAME` on `port`, seeded by `seed`, its log (info) in `log`.
fn node(name: &str, port: u16, seed: u16, extra: &[&str], log: &Path) -> Node {
    let child = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args(["node", "--name", name, "--bind", &format!("127.0.0.1:{port}")])
        .args(["--seeds", &format!("127.0.0.1:{seed}"), "--shards", "16", "--store", "memory"])
        .args(extra)
        .env("RUST_LOG", "info")
        .env_remove("SHARDLINE_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .spawn()
        .expect("the shardline binary starts");
    Node(child)
}

fn shardline(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shardline"));
    c.args(args).env_remove("SHARDLINE_ADMIN_TOKEN").env_remove("SHARDLINE_ADMIN_URL");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the shardline binary starts")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

fn tls_flags(certs: &Path, name: &str) -> Vec<String> {
    let f = |file: String| certs.join(file).display().to_string();
    vec![
        "--tls-cert".into(),
        f(format!("{name}.pem")),
        "--tls-key".into(),
        f(format!("{name}.key")),
        "--tls-ca".into(),
        f("ca.pem".into()),
    ]
}

/// The members `shardline status --json` lists through the admin API on `admin`, by status.
fn members(admin: u16) -> Vec<(String, String)> {
    let out = shardline(&["status", "--json", "--admin", &format!("http://127.0.0.1:{admin}")], &[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let members = v["members"].as_array().cloned().unwrap_or_default();
    members
        .iter()
        .map(|m| (m["name"].as_str().unwrap_or("").into(), m["status"].as_str().unwrap_or("").into()))
        .collect()
}

async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn log_lines(log: &Path, what: &str) -> Vec<String> {
    std::fs::read_to_string(log).unwrap_or_default().lines().filter(|l| l.contains(what)).map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_made_with_shardline_certs_refuses_a_node_without_tls() {
    let d = dir("tls");
    let certs = d.join("certs");
    let out = shardline(&["certs", "--out", &certs.display().to_string(), "--nodes", "n1,n2"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for f in ["ca.pem", "ca.key", "n1.pem", "n1.key", "n2.pem", "n2.key"] {
        assert!(certs.join(f).is_file(), "shardline certs wrote {f}");
    }
    let bad = shardline(&["certs", "--out", &certs.display().to_string(), "--nodes", "n1,not a name"], &[]);
    assert_eq!(bad.status.code(), Some(1), "a node name no certificate can carry is refused");

    let (p1, p2, p3, admin) = (free_port(), free_port(), free_port(), free_port());
    let log1 = d.join("n1.log");
    let mut f1 = tls_flags(&certs, "n1");
    f1.extend(["--admin".into(), admin.to_string()]);
    let f1: Vec<&str> = f1.iter().map(String::as_str).collect();
    let _n1 = node("n1", p1, p1, &f1, &log1);
    let f2 = tls_flags(&certs, "n2");
    let _n2 = node("n2", p2, p1, &f2.iter().map(String::as_str).collect::<Vec<_>>(), &d.join("n2.log"));
    let both_up = |m: &Vec<(String, String)>| m.len() == 2 && m.iter().all(|(_, s)| s == "Up");
    eventually("n1 and n2 up over TLS", Duration::from_secs(60), || both_up(&members(admin))).await;
    assert!(log_lines(&log1, "NO TLS").is_empty(), "a TLS node does not warn of plain TCP");

    let log3 = d.join("n3.log");
    let _n3 = node("n3", p3, p1, &[], &log3);
    eventually("n1 refuses the plain node", Duration::from_secs(30), || {
        !log_lines(&log1, "does not speak TLS").is_empty()
    })
    .await;
    let refusal = &log_lines(&log1, "refusing connection")[0];
    assert!(refusal.contains("WARN"), "{refusal}");
    assert!(!log_lines(&log3, "NO TLS").is_empty(), "the plain node says loudly that it runs without TLS");
    // n3 keeps trying; the cluster stays the two TLS nodes and keeps serving them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let m = members(admin);
    assert!(both_up(&m) && !m.iter().any(|(n, _)| n == "n3"), "{m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_api_beyond_loopback_needs_its_token_and_never_logs_it() {
    let d = dir("token");
    let port = free_port();
    let exposed = format!("0.0.0.0:{}", free_port());
    let start = |extra: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_shardline"));
        c.args(["node", "--name", "n1", "--bind", &format!("127.0.0.1:{}", free_port()), "--store", "memory"])
            .args(extra)
            .env_remove("SHARDLINE_ADMIN_TOKEN");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let out = start(&["--admin", &exposed], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("needs a token"), "{}", text(&out.stderr));
    let out = start(&["--admin", &exposed, "--admin-token", "short"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("shorter than 16"), "{}", text(&out.stderr));

    let secret = "s3cret-token-for-this-test-only";
    let admin = free_port();
    let log = d.join("n1.log");
    let child = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args(["node", "--name", "n1", "--bind", &format!("127.0.0.1:{port}"), "--store", "memory"])
        .args(["--admin", &format!("0.0.0.0:{admin}")])
        .env("SHARDLINE_ADMIN_TOKEN", secret)
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let mut n1 = Node(child);
    eventually("n1 up", Duration::from_secs(30), || members(admin).iter().any(|(_, s)| s == "Up")).await;
    let url = format!("http://127.0.0.1:{admin}");
    let drain = |env: &[(&str, &str)], extra: &[&str]| {
        let mut args = vec!["drain", "n1", "--admin", &url];
        args.extend(extra);
        shardline(&args, env)
    };
    for (what, out) in
        [("no token", drain(&[], &[])), ("a wrong token", drain(&[], &["--admin-token", "not-the-right-token-at-all"]))]
    {
        assert_eq!(out.status.code(), Some(1), "{what}");
        let err = text(&out.stderr);
        assert!(err.starts_with("error: 401") && err.contains("bearer token"), "{what}: {err}");
    }
    let out = drain(&[("SHARDLINE_ADMIN_TOKEN", secret)], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let start = Instant::now();
    while n1.0.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(60), "the drained node exits");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("admin request refused: missing bearer token"), "refusals are logged");
    assert!(logged.contains("admin request refused: wrong bearer token"), "refusals are logged");
    assert!(!logged.contains(secret), "the token is never logged");
}

/// An admin API served over HTTPS (`--admin-tls-cert`, `--admin-tls-key`): `shardline status`
/// reaches it with its CA, and not without one, nor in plain HTTP, nor trusting another CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_api_over_https_answers_clients_that_trust_its_ca_only() {
    let d = dir("https");
    let certs = d.join("certs");
    let out = shardline(&["certs", "--out", &certs.display().to_string(), "--nodes", "localhost"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let other = d.join("other");
    let out = shardline(&["certs", "--out", &other.display().to_string(), "--nodes", "localhost"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (port, admin) = (free_port(), free_port());
    let f = |file: &str| certs.join(file).display().to_string();
    let log = d.join("n1.log");
    let admin_flag = admin.to_string();
    let extra =
        ["--admin", &admin_flag, "--admin-tls-cert", &f("localhost.pem"), "--admin-tls-key", &f("localhost.key")];
    let _n1 = node("n1", port, port, &extra, &log);
    let https = format!("https://localhost:{admin}");
    let status = |url: &str, ca: Option<&Path>| {
        let mut args = vec!["status".to_string(), "--json".into(), "--admin".into(), url.to_string()];
        if let Some(ca) = ca {
            args.extend(["--admin-ca".into(), ca.display().to_string()]);
        }
        shardline(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[])
    };
    let ca = certs.join("ca.pem");
    eventually("the node answers over HTTPS", Duration::from_secs(30), || status(&https, Some(&ca)).status.success())
        .await;
    let out = status(&https, Some(&ca));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["members"][0]["name"], "n1", "{v}");
    // Without the CA, trusting another CA, or in plain HTTP: no answer.
    let out = status(&https, None);
    assert!(!out.status.success() && text(&out.stderr).contains("--admin-ca"), "{}", text(&out.stderr));
    let out = status(&https, Some(&other.join("ca.pem")));
    assert!(!out.status.success() && text(&out.stderr).contains("TLS"), "{}", text(&out.stderr));
    let out = status(&format!("http://localhost:{admin}"), None);
    assert!(!out.status.success(), "plain HTTP to the HTTPS port: {}", text(&out.stdout));
    // The API still serves after the failed handshakes.
    assert!(status(&https, Some(&ca)).status.success());
    // A certificate that cannot be read stops the node at start, with the reason.
    let bad = shardline(
        &["node", "--name", "x", "--bind", "127.0.0.1:1", "--seeds", "127.0.0.1:1", "--store", "memory"]
            .into_iter()
            .chain(["--admin", "0", "--admin-tls-cert", &f("ca.pem"), "--admin-tls-key", &f("ca.pem")])
            .collect::<Vec<_>>(),
        &[],
    );
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad.stderr));
    assert!(text(&bad.stderr).contains("admin API TLS"), "{}", text(&bad.stderr));
    let _ = std::fs::remove_dir_all(&d);
}
