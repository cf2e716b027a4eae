//! Starting a real coordination server (etcd, nats-server) for tests and demos: free loopback
//! ports, data in a fresh temporary directory, stopped when dropped. A missing binary is an
//! error that names the Debian package to install, never a silent skip.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process started for a test.
pub struct ServerProcess {
    program: String,
    args: Vec<String>,
    child: Option<Child>,
    dir: PathBuf,
    /// Where clients connect (`127.0.0.1:PORT`).
    pub addr: String,
}

fn free_port() -> Result<u16, String> {
    crate::ports::free_port().map_err(|e| e.to_string())
}

fn temp_dir(what: &str) -> Result<PathBuf, String> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("shardline-{what}-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

impl ServerProcess {
    /// Starts etcd (Debian package `etcd-server`) on free ports.
    pub fn etcd() -> Result<Self, String> {
        Self::etcd_with(|_| None)
    }

    /// Starts etcd as [`etcd`](Self::etcd) does; when `tls` gives a certificate and its key
    /// (files it may write in the server's directory), clients speak HTTPS only.
    pub fn etcd_with(tls: impl FnOnce(&std::path::Path) -> Option<(PathBuf, PathBuf)>) -> Result<Self, String> {
        let (client, peer) = (free_port()?, free_port()?);
        let dir = temp_dir("etcd")?;
        let tls = tls(&dir);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let c = format!("{scheme}://127.0.0.1:{client}");
        let p = format!("http://127.0.0.1:{peer}");
        let mut args = vec![
            "--name".into(),
            "test".into(),
            "--data-dir".into(),
            dir.join("data").display().to_string(),
            "--listen-client-urls".into(),
            c.clone(),
            "--advertise-client-urls".into(),
            c,
            "--listen-peer-urls".into(),
            p.clone(),
            "--initial-advertise-peer-urls".into(),
            p.clone(),
            "--initial-cluster".into(),
            format!("test={p}"),
        ];
        if let Some((cert, key)) = tls {
            args.extend([
                "--cert-file".into(),
                cert.display().to_string(),
                "--key-file".into(),
                key.display().to_string(),
            ]);
        }
        Self::start("etcd", "etcd-server", args, dir, format!("127.0.0.1:{client}"))
    }

    /// Starts nats-server with JetStream (Debian package `nats-server`) on a free port.
    pub fn nats() -> Result<Self, String> {
        Self::nats_with(|_| Vec::new())
    }

    /// Starts nats-server as [`nats`](Self::nats) does, with the flags `extra` gives from the
    /// server's directory (where it may write files the server reads: certificates).
    pub fn nats_with(extra: impl FnOnce(&std::path::Path) -> Vec<String>) -> Result<Self, String> {
        let port = free_port()?;
        let dir = temp_dir("nats")?;
        let mut args = vec![
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
            "-js".into(),
            "-sd".into(),
            dir.join("js").display().to_string(),
        ];
        args.extend(extra(&dir));
        Self::start("nats-server", "nats-server", args, dir, format!("127.0.0.1:{port}"))
    }

    fn start(program: &str, package: &str, args: Vec<String>, dir: PathBuf, addr: String) -> Result<Self, String> {
        let found = Command::new(program).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
        if found.is_err() {
            return Err(format!("{program} is required but not installed: apt-get install {package}"));
        }
        let mut s = ServerProcess { program: program.into(), args, child: None, dir, addr };
        s.resume()?;
        Ok(s)
    }

    /// Starts the server again (same ports, same data) after [`stop`](Self::stop).
    pub fn resume(&mut self) -> Result<(), String> {
        if self.child.is_some() {
            return Ok(());
        }
        let log = std::fs::File::create(self.dir.join("server.log")).map_err(|e| e.to_string())?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.program))?;
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(&self.addr).is_err() {
            if start.elapsed() > Duration::from_secs(20) {
                return Err(format!("{} did not listen on {} within 20 s", self.program, self.addr));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Stops the server (kill -9); its data stays for [`resume`](Self::resume).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
