//! Node processes started by the demo and the benchmarks; all are killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A `shardline node` child process.
pub struct NodeProc {
    pub name: String,
    pub child: Option<Child>,
}

impl NodeProc {
    /// Starts `shardline node` for `name` on `addr` with `seeds`, and `extra` flags.
    pub fn spawn(
        name: &str,
        addr: &str,
        seeds: &str,
        shards: u32,
        membership: &str,
        dir: &std::path::Path,
        extra: &[String],
    ) -> std::io::Result<NodeProc> {
        let exe = std::env::current_exe()?;
        let log = dir.join(format!("{name}.log"));
        // Append: a restarted node keeps the log of its earlier incarnation.
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let child = Command::new(exe)
            .args(["node", "--name", name, "--bind", addr, "--seeds", seeds, "--shards", &shards.to_string()])
            .args(["--membership", membership, "--ownership-log", &dir.join("ownership.log").display().to_string()])
            .args(extra)
            .env("RUST_LOG", std::env::var("SHARDLINE_NODE_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            .spawn()?;
        Ok(NodeProc { name: name.into(), child: Some(child) })
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM: the node leaves gracefully. Returns its exit status once it exited.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        let pid = c.id() as libc::pid_t;
        send_sigterm(pid);
        c.wait().ok().and_then(|s| s.code())
    }
}

fn send_sigterm(pid: libc::pid_t) {
    // libc::kill is an FFI call; it has no memory-safety preconditions.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Flags that point a node at the SQLite journal in `dir`, which every node of a run shares.
pub fn journal_flags(dir: &std::path::Path) -> Vec<String> {
    vec!["--store".into(), format!("sqlite://{}", dir.join("journal.db").display())]
}

pub use shardline::ports::free_port;

/// A fresh directory for logs.
pub fn work_dir(what: &str) -> std::io::Result<PathBuf> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("shardline-{what}-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Development certificates for the nodes of a run (`--tls` of the demo and the benchmarks).
pub struct RunCerts {
    dir: PathBuf,
}

impl RunCerts {
    /// A new CA and a certificate for each of `names`, in `dir/certs`.
    pub fn make(dir: &std::path::Path, names: &[String]) -> Result<RunCerts, String> {
        let dir = dir.join("certs");
        shardline::dev_certs::write_dev_certs(&dir, names, 1).map_err(|e| e.to_string())?;
        Ok(RunCerts { dir })
    }

    /// The flags that give node `name` its certificate.
    pub fn flags(&self, name: &str) -> Vec<String> {
        let file = |f: String| self.dir.join(f).display().to_string();
        vec![
            "--tls-cert".into(),
            file(format!("{name}.pem")),
            "--tls-key".into(),
            file(format!("{name}.key")),
            "--tls-ca".into(),
            file("ca.pem".into()),
        ]
    }

    /// The TLS settings of `name`, for a member in this process (the driver).
    pub fn config(&self, name: &str) -> Result<shardline::TlsConfig, String> {
        let file = |f: String| self.dir.join(f);
        shardline::TlsConfig::from_files(
            file(format!("{name}.pem")),
            file(format!("{name}.key")),
            file("ca.pem".into()),
        )
        .map_err(|e| e.to_string())
    }
}
