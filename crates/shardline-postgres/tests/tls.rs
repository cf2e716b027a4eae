//! TLS to the database, on a PostgreSQL server of this test's own that takes TLS connections
//! only (`hostssl` in its `pg_hba.conf`), with a certificate for `localhost` from a CA made for
//! the run.
//!
//! Needs: Debian's PostgreSQL server binaries (`initdb`, `postgres`, package `postgresql`); a
//! missing binary fails the test and says what to install.

mod common;

use std::time::Duration;

use common::Server;
use shardline::dev_certs::DevCa;
use shardline_postgres::{PostgresConfig, PostgresJournal};

async fn connects(url: &str) -> Result<(), String> {
    let config = PostgresConfig { timeout: Duration::from_secs(5), ..PostgresConfig::new(url).schema("tls") };
    PostgresJournal::connect(config).await.map(drop).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_encrypts_and_the_verifying_modes_check_the_servers_certificate() {
    let ca = DevCa::new("shardline test CA").expect("a CA");
    let other = DevCa::new("another CA").expect("a CA");
    let server_pem = ca.node("localhost", 1).expect("a certificate for localhost");
    let mut roots = (std::path::PathBuf::new(), std::path::PathBuf::new());
    let server = Server::init_with(|dir| {
        std::fs::write(dir.join("server.crt"), &server_pem.cert).unwrap();
        std::fs::write(dir.join("server.key"), &server_pem.key).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.join("server.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        std::fs::write(dir.join("pg_hba.conf"), "local all all trust\nhostssl all all 127.0.0.1/32 trust\n").unwrap();
        roots = (dir.join("ca.pem"), dir.join("other.pem"));
        std::fs::write(&roots.0, &ca.pem().cert).unwrap();
        std::fs::write(&roots.1, &other.pem().cert).unwrap();
        let at = |f: &str| dir.join(f).display().to_string();
        vec![
            "ssl=on".into(),
            format!("ssl_cert_file={}", at("server.crt")),
            format!("ssl_key_file={}", at("server.key")),
            format!("hba_file={}", at("pg_hba.conf")),
        ]
    });
    let port = server.port();
    let (ca_pem, other_pem) = (roots.0.display().to_string(), roots.1.display().to_string());
    let at = |host: &str, options: &str| format!("postgres://postgres@{host}:{port}/postgres?{options}");

    // The server takes no plain connection: each mode that connects spoke TLS.
    let plain = connects(&at("127.0.0.1", "sslmode=disable")).await;
    assert!(plain.is_err(), "the server refuses plain connections");
    connects(&server.url()).await.expect("prefer (the default) takes TLS when the server offers it");
    connects(&at("127.0.0.1", "sslmode=require")).await.expect("require");
    connects(&at("localhost", &format!("sslmode=verify-full&sslrootcert={ca_pem}"))).await.expect("verify-full");
    connects(&at("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={ca_pem}"))).await.expect("verify-ca");

    // A certificate for another name, or from another CA: refused by the modes that check.
    let wrong_name = connects(&at("127.0.0.1", &format!("sslmode=verify-full&sslrootcert={ca_pem}"))).await;
    assert!(wrong_name.as_ref().is_err_and(|e| e.contains("certificate")), "{wrong_name:?}");
    let wrong_ca = connects(&at("localhost", &format!("sslmode=verify-full&sslrootcert={other_pem}"))).await;
    assert!(wrong_ca.as_ref().is_err_and(|e| e.contains("certificate")), "{wrong_ca:?}");
    let wrong_ca = connects(&at("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={other_pem}"))).await;
    assert!(wrong_ca.as_ref().is_err_and(|e| e.contains("certificate")), "{wrong_ca:?}");
    let no_root = connects(&at("localhost", "sslmode=verify-full")).await;
    assert!(no_root.as_ref().is_err_and(|e| e.contains("sslrootcert")), "{no_root:?}");
}
