#!/usr/bin/env bash
# The whole test suite: formatting, lints, the Kubernetes manifests' schemas, unit, property,
# multi-node and multi-process tests (real partitions between network namespaces among them: run
# as root), 10,000 simulated schedules of each simulated world, a bounded run of each fuzz
# target, and a short demo run. Installs what it needs from Debian's packages (the manifests'
# checker from PyPI, cargo-fuzz from crates.io) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The etcd and NATS tests start their own servers from these packages; protoc builds etcd-client.
need_apt=()
command -v jq >/dev/null || need_apt+=(jq)
command -v etcd >/dev/null || need_apt+=(etcd-server)
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
command -v nats-server >/dev/null || need_apt+=(nats-server)
# The partition tests put node processes in network namespaces (ip netns, ip link).
command -v ip >/dev/null || need_apt+=(iproute2)
command -v nft >/dev/null || need_apt+=(nftables)
# The dashboard's test drives it in headless Chromium through chromedriver.
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
[ -x /usr/bin/chromedriver ] || need_apt+=(chromium-driver)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing: ${need_apt[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

# The journal tests need PostgreSQL (trust authentication, database `test`); every machine of this
# project runs it on 127.0.0.1:5432. Say so loudly when it is not there rather than fail obscurely.
pg_url=${SHARDLINE_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}
if command -v pg_isready >/dev/null && ! pg_isready -q -d "$pg_url"; then
  echo "PostgreSQL is not accepting connections at $pg_url (the journal tests need it; set SHARDLINE_TEST_POSTGRES)"
  exit 1
fi

echo "== fmt"
cargo fmt --all -- --check
echo "== default build needs no protoc"
# The README's first command builds the CLI with default features: no etcd-client, so no protoc.
if cargo tree -p shardline-cli --edges normal,build | grep -q etcd-client; then
  echo "shardline-cli's default features pull in etcd-client (needs protoc)"; exit 1
fi
echo "== clippy"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== docs"
# Every crate's docs, with every feature, without a single warning (rustdoc's or cargo's).
docs=$(RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features 2>&1) || { echo "$docs"; exit 1; }
if grep -q "^warning" <<<"$docs"; then echo "$docs"; exit 1; fi
echo "== kubernetes manifests"
# Checked against the Kubernetes API's schemas, offline (no API server): kubernetes-validate
# from PyPI bundles them.
python3 -c 'import kubernetes_validate' 2>/dev/null || python3 -m pip install -q kubernetes-validate
python3 -m kubernetes_validate --strict --quiet deploy/kubernetes/*.yaml
echo "== simulation (${SHARDLINE_SIM_SCHEDULES:-10000} schedules per world, from a fresh base seed)"
# Each world prints its base seed and every failing seed with the command that replays it;
# SHARDLINE_SIM_SCHEDULES may raise the count above 10,000, never lower it, and
# SHARDLINE_SIM_BASE_SEED runs a printed base seed's schedules again.
cargo test -p shardline-core --release sim -- --nocapture
echo "== runtime simulation (1,000 schedules or more, from a fresh base seed)"
# Whole nodes (builder, drivers, hosts, entity tasks, lease or gossip membership) on a simulated
# network and clock; prints its base seed and every failing seed with the command that replays it.
# The same binary's three sabotage tests must each find a violation in a runtime broken on purpose.
cargo test --release --all-features -p shardline-cli --test sim_runtime -- --nocapture
echo "== tests"
cargo test --workspace --release --all-features -- --skip sim_
echo "== fuzz (${SHARDLINE_FUZZ_SECS:=30} s per target)"
# Each fuzz target (fuzz/: frames, messages, the handshake, the coordination store's values) for
# a bounded time from the seed corpus in fuzz/corpus, under libFuzzer with AddressSanitizer.
# cargo-fuzz needs nightly flags: RUSTC_BOOTSTRAP lets the stable toolchain take them. New
# inputs go to a scratch corpus, never into the repository; a crash fails the suite and leaves
# its input in fuzz/artifacts.
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --version 0.13.2 --locked
for t in frames message handshake lease_value; do
  mkdir -p "target/fuzz-corpus/$t"
  log="target/fuzz-$t.log"
  if ! RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz "$t" "target/fuzz-corpus/$t" "fuzz/corpus/$t" -- \
      -max_total_time="$SHARDLINE_FUZZ_SECS" -rss_limit_mb=2048 -malloc_limit_mb=128 -timeout=10 >"$log" 2>&1; then
    grep -E -A12 "panicked|ERROR|SUMMARY|artifact" "$log" | head -60 || tail -40 "$log"
    echo "fuzz target $t failed: its input is in fuzz/artifacts/$t"; exit 1
  fi
  echo "$t: $(grep -E "DONE" "$log" | tail -1)"
done
echo "== examples"
cargo run --release -q -p shardline --example counter
cargo run --release -q -p shardline --example devices
cargo run --release -q -p shardline --example daemon
cargo run --release -q -p shardline-sqlite --example cart
cargo run --release -q -p shardline-sqlite --example reminders
cargo run --release -q -p shardline-testkit --example testkit
cargo run --release -q -p shardline-otlp --example traces
echo "== demo (short run)"
mkdir -p target
cargo run --release -q -p shardline-cli -- demo --duration-secs 2 --entities 2000 --json target/demo-smoke.json
jq -e '(.phases | length) == 5 and .invariants.lost_acked == 0 and .invariants.double_applied == 0 and .invariants.ledger_mismatches == 0
  and .invariants.reads_checked > 0 and .invariants.stale_reads == 0 and .invariants.history_violations == 0
  and .invariants.ownership_overlaps == 0 and .in_memory.acked > 0 and .durable_ratio > 0' target/demo-smoke.json >/dev/null
echo "demo: 5 phases, invariants hold, its history checked, its in-memory floor measured"
