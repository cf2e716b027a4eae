//! The dashboard in a real browser: headless Chromium driven through chromedriver (Debian's
//! `chromium` and `chromium-driver`; the README's test command installs them). Three node
//! processes; the page is opened on one; another is killed with SIGKILL; the page, never reloaded,
//! re-colours the dead node's shards to the survivors from the event stream. A screenshot is left
//! in `target/dashboard.png`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SHARDS: u32 = 64;
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

fn free_port() -> u16 {
    shardline::ports::free_port().unwrap()
}

/// A child process, killed with SIGKILL when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The admin token of the node whose page the test opens: the page must bring it to follow the
/// events.
const TOKEN: &str = "dashboard-test-token-0123";

fn node(name: &str, port: u16, seed: u16, admin: u16, token: Option<&str>) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args(["node", "--name", name, "--bind", &format!("127.0.0.1:{port}")])
        .args(["--seeds", &format!("127.0.0.1:{seed}"), "--shards", &SHARDS.to_string(), "--store", "memory"])
        .args(["--admin", &format!("127.0.0.1:{admin}")])
        .args(token.map(|t| vec!["--admin-token", t]).unwrap_or_default())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the shardline binary starts");
    Proc(child)
}

/// One HTTP/1.1 exchange with a JSON body (or none), on a connection of its own.
async fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Option<(u16, Value)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.ok()?;
    // Read by Content-Length: chromedriver may keep the connection open.
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let (head, body_start, length) = loop {
        let n = s.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_string();
            let length = head
                .lines()
                .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-length")))
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())?;
            break (head, end + 4, length);
        }
    };
    while raw.len() < body_start + length {
        let n = s.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, serde_json::from_slice(&raw[body_start..body_start + length]).unwrap_or(Value::Null)))
}

/// A WebDriver session of headless Chromium.
struct Browser {
    port: u16,
    session: String,
    _driver: Proc,
}

impl Browser {
    async fn start() -> Browser {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                std::path::Path::new(program).exists(),
                "this test needs {program}: apt-get install chromium chromium-driver (the README's test command does)"
            );
        }
        let port = free_port();
        let driver = Proc(
            Command::new(CHROMEDRIVER)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver starts"),
        );
        let start = Instant::now();
        while !matches!(http(port, "GET", "/status", None).await, Some((200, v)) if v["value"]["ready"] == true) {
            assert!(start.elapsed() < Duration::from_secs(30), "chromedriver never became ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,760"],
            },
        }}});
        let (status, v) = http(port, "POST", "/session", Some(&caps)).await.expect("chromedriver answers");
        assert_eq!(status, 200, "no browser session: {v}");
        let session = v["value"]["sessionId"].as_str().expect("a session id").to_string();
        Browser { port, session, _driver: driver }
    }

    async fn command(&self, method: &str, what: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}/{what}", self.session);
        let (status, v) = http(self.port, method, &path, body.as_ref()).await.expect("chromedriver answers");
        assert_eq!(status, 200, "{method} {what}: {v}");
        v["value"].clone()
    }

    async fn open(&self, url: &str) {
        self.command("POST", "url", Some(json!({ "url": url }))).await;
    }

    async fn run(&self, script: &str) -> Value {
        self.command("POST", "execute/sync", Some(json!({ "script": script, "args": [] }))).await
    }

    async fn screenshot(&self, to: &std::path::Path) {
        let b64 = self.command("GET", "screenshot", None).await;
        let png = base64(b64.as_str().expect("a base64 screenshot"));
        std::fs::write(to, png).expect("the screenshot is written");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The driver process is killed right after; its browser goes with the session.
        let (port, path) = (self.port, format!("/session/{}", self.session));
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    tokio::time::timeout(Duration::from_secs(5), http(port, "DELETE", &path, None)).await
                })
                .ok();
            }
        })
        .join();
    }
}

fn base64(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0);
    for v in s.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// The owner of every cell of the grid, as the page shows it ("" for none).
const OWNERS: &str = "return Array.from(document.querySelectorAll('#grid .cell')).map(c => c.dataset.node || '')";

async fn owners_until(b: &Browser, what: &str, limit: Duration, cond: impl Fn(&[String]) -> bool) -> Vec<String> {
    let start = Instant::now();
    loop {
        let v = b.run(OWNERS).await;
        let owners: Vec<String> =
            v.as_array().map(|a| a.iter().filter_map(|o| o.as_str().map(str::to_string)).collect()).unwrap_or_default();
        if cond(&owners) {
            return owners;
        }
        assert!(start.elapsed() < limit, "{what}: the page shows {owners:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_recolours_a_killed_nodes_shards() {
    let (p1, p2, p3) = (free_port(), free_port(), free_port());
    let (a1, a2, a3) = (free_port(), free_port(), free_port());
    let _n1 = node("n1", p1, p1, a1, None);
    let _n2 = node("n2", p2, p1, a2, Some(TOKEN));
    let n3 = node("n3", p3, p1, a3, None);
    // The cluster forms: every shard of the type the page shows has one of the three owners.
    let start = Instant::now();
    loop {
        if let Some((200, v)) = http(a2, "GET", "/api/cluster", None).await {
            let members = v["members"].as_array().cloned().unwrap_or_default();
            if members.len() == 3 && members.iter().all(|m| m["status"] == "Up" && m["shards"].as_u64() > Some(0)) {
                break;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the cluster never formed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let b = Browser::start().await;
    // n2's API has a token: the page takes it from its address, and drops it from there.
    b.open(&format!("http://127.0.0.1:{a2}/#token={TOKEN}")).await;
    let all = |o: &[String]| o.len() == SHARDS as usize && ["n1", "n2", "n3"].iter().all(|n| o.iter().any(|x| x == n));
    owners_until(&b, "the grid shows all three nodes", Duration::from_secs(30), all).await;
    let live = b.run("return document.getElementById('stream').textContent").await;
    assert_eq!(live, "live", "the event stream is connected, with the token");
    assert_eq!(b.run("return location.hash").await, "", "the token is no longer in the page's address");
    // Marks this page: a reload would lose the mark.
    b.run("window.shardlineMark = 7; return null").await;

    drop(n3); // SIGKILL
    let survivors = |o: &[String]| o.len() == SHARDS as usize && o.iter().all(|x| x == "n1" || x == "n2");
    let owners = owners_until(&b, "n3's shards re-coloured to the survivors", Duration::from_secs(60), survivors).await;
    assert!(owners.iter().any(|x| x == "n1") && owners.iter().any(|x| x == "n2"), "{owners:?}");
    assert_eq!(b.run("return window.shardlineMark").await, 7, "the page was not reloaded: the events did it");
    let feed = b.run("return document.getElementById('feed').textContent").await;
    assert!(feed.as_str().is_some_and(|f| f.contains("NodeFailed") && f.contains("ShardAssigned")), "{feed}");

    // What the page shows agrees with the API.
    let (_, map) = http(a1, "GET", "/api/shards?type=account", None).await.expect("n1 answers");
    let from_api: Vec<String> =
        map["shards"].as_array().unwrap().iter().map(|s| s["node"].as_str().unwrap_or("").to_string()).collect();
    let shown = owners_until(&b, "the page agrees with the API", Duration::from_secs(10), |o| o == from_api).await;
    assert_eq!(shown.len(), SHARDS as usize);

    // The nodes table follows: n3 is down or gone.
    let start = Instant::now();
    let n3_row = "const r = document.querySelector('#nodes tr[data-node=\"n3\"]'); return r ? r.children[1].textContent : 'gone'";
    while b.run(n3_row).await == "Up" {
        assert!(start.elapsed() < Duration::from_secs(30), "the nodes table still shows n3 up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let shot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/dashboard.png");
    b.screenshot(&shot).await;
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 10_000), "a screenshot of the page");
}
