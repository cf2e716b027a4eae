//! `shardline check` on recorded histories and ownership logs: exit 0 when everything holds,
//! 1 with the violation counted in its JSON, 2 when a file cannot be read.

use std::path::PathBuf;
use std::process::Command;

fn file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shardline-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn op(
    kind: &str,
    op: u64,
    amount: i64,
    t: (u64, u64),
    outcome: &str,
    balance: Option<i64>,
    ops: Option<&[u64]>,
) -> String {
    let applied = match (kind, outcome) {
        ("deposit" | "withdraw", "ok") => "true",
        _ => "null",
    };
    serde_json::json!({
        "account": "acct-1", "kind": kind, "op": op, "amount": amount, "request_id": format!("r{op}"),
        "invoke_us": t.0, "complete_us": t.1, "outcome": outcome,
        "applied": serde_json::from_str::<serde_json::Value>(applied).unwrap(),
        "balance": balance, "ops": ops,
    })
    .to_string()
}

fn check(args: &[&std::ffi::OsStr]) -> (Option<i32>, serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardline")).arg("check").args(args).output().unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code(), json, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_clean_history_holds_and_a_stale_read_fails() {
    let good = [
        op("deposit", 1, 10, (0, 10), "ok", Some(10), None),
        op("balance", 0, 0, (20, 30), "ok", Some(10), None),
        op("audit", 0, 0, (40, 50), "ok", Some(10), Some(&[1])),
    ]
    .join("\n");
    let path = file("good.jsonl", &good);
    let (code, json, _) = check(&[path.as_os_str()]);
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["reads_checked"], 3, "{json}");
    assert_eq!(json["stale_reads"], 0, "{json}");
    // The same, but the balance read after the deposit was answered sees the old balance.
    let stale = good.replace("\"balance\":10,\"complete_us\":30", "\"balance\":0,\"complete_us\":30");
    assert_ne!(stale, good, "the read was changed");
    let path = file("stale.jsonl", &stale);
    let (code, json, _) = check(&[path.as_os_str()]);
    assert_eq!(code, Some(1), "{json}");
    assert_eq!(json["stale_reads"], 1, "{json}");
}

#[test]
fn an_overlap_in_the_ownership_log_fails_and_a_bad_file_is_named() {
    let history = file("h.jsonl", &op("audit", 0, 0, (0, 1), "ok", Some(0), Some(&[])));
    let log =
        file("own.log", "1000 n1#1 account 3 1.1 start\n1500 n2#1 account 3 2.1 start\n2000 n1#1 account 3 1.1 stop\n");
    let (code, json, _) = check(&[history.as_os_str(), "--ownership-log".as_ref(), log.as_os_str()]);
    assert_eq!(code, Some(1), "{json}");
    assert_eq!(json["ownership_overlaps"], 1, "{json}");
    // n1 killed before n2 started: no overlap.
    let log = file("own2.log", "1000 n1#1 account 3 1.1 start\n1500 n2#1 account 3 2.1 start\n");
    let (code, json, _) = check(&[
        history.as_os_str(),
        "--ownership-log".as_ref(),
        log.as_os_str(),
        "--killed".as_ref(),
        "n1@1400".as_ref(),
    ]);
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["ownership_overlaps"], 0, "{json}");
    let bad = file("bad.jsonl", "{\"account\": 1}\n");
    let (code, _, err) = check(&[bad.as_os_str()]);
    assert_eq!(code, Some(2));
    assert!(err.contains("bad.jsonl, line 1"), "{err}");
}
