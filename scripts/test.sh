#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, property, multi-node and multi-process tests,
# 10,000 simulated schedules of the sharding protocol, and a short demo run. Installs what it
# needs from Debian's packages when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The etcd and NATS tests start their own servers from these packages; protoc builds etcd-client.
need_apt=()
command -v jq >/dev/null || need_apt+=(jq)
command -v etcd >/dev/null || need_apt+=(etcd-server)
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
command -v nats-server >/dev/null || need_apt+=(nats-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing: ${need_apt[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

echo "== fmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== simulation (${SHARDLINE_SIM_SCHEDULES:=10000} schedules)"
SHARDLINE_SIM_SCHEDULES=$SHARDLINE_SIM_SCHEDULES cargo test -p shardline-core --release sim -- --nocapture
echo "== tests"
cargo test --workspace --release -- --skip sim_
echo "== demo (short run)"
cargo run --release -q -p shardline-cli -- demo --duration-secs 2 --entities 2000 --json target/demo-smoke.json
jq -e '(.phases | length) == 5 and .invariants.lost_acked == 0 and .invariants.double_applied == 0 and .invariants.ledger_mismatches == 0' target/demo-smoke.json >/dev/null
echo "demo: 5 phases, invariants hold"
