//! The ask benches' floors as programs of their own (`shardline floor`): each prints its rate as
//! JSON, and a floor it cannot run is an error, not a rate of zero.

use std::process::Command;

fn shardline() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shardline"))
}

#[test]
fn the_local_floor_runs_alone_and_prints_its_rate() {
    let out = shardline().args(["floor", "local", "--duration-ms", "200", "--entities", "10"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["floor"], "local");
    assert!(v["ops_per_s"].as_f64().is_some_and(|r| r > 0.0), "{v}");
    assert!(v["latency_us"]["p99"].as_f64().is_some(), "{v}");
}

#[test]
fn a_remote_floor_without_a_server_or_an_unknown_floor_fails_loudly() {
    let out = shardline().args(["floor", "remote", "--duration-ms", "100"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs --addr"));
    assert!(out.stdout.is_empty(), "no rate printed");
    // A server that is not there: the connection fails, and no rate is printed.
    let out = shardline().args(["floor", "remote", "--addr", "127.0.0.1:1", "--duration-ms", "100"]).output().unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let out = shardline().args(["floor", "nope"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown floor"));
}
