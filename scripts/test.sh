#!/usr/bin/env bash
# The whole mintgate test suite, from a fresh machine: installs the peers the
# tests talk to (Debian packages), then format, lint, unit/property/
# integration/interop tests, and a short fuzzing run of every fuzz target.
#
#   scripts/test.sh            # everything
#   MINTGATE_FUZZ_SECONDS=0 scripts/test.sh   # skip the fuzz smoke run
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s (at %dm%02ds)\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }

# Debian packages the tests need. apt-get update first: a new machine's lists are empty.
PKGS=(libcoap3-bin mosquitto mosquitto-clients valgrind libssl-dev pkg-config socat openssl adduser iproute2)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The NATS JetStream tests' 3-node cluster: nats-server, Debian's package
# when apt offers one, else built with go install from the Go module proxy.
NATS_SERVER_GO_VERSION=v2.14.9
if ! command -v nats-server >/dev/null && [ ! -x /usr/sbin/nats-server ] && [ ! -x "${HOME:-/root}/go/bin/nats-server" ]; then
  step "installing nats-server"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  if apt-cache policy nats-server 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nats-server >/dev/null
  else
    go install "github.com/nats-io/nats-server/v2@${NATS_SERVER_GO_VERSION}"
  fi
fi

# The dashboard's browser test: Debian's chromium, driven headless.
if ! command -v chromium >/dev/null; then
  step "installing chromium"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

# The HTTP proxy's interop tests: curl (HTTP/1.1, HTTP/2) from Debian, and
# aioquic (PyPI, a third-party HTTP/3 client) in a venv under target/.
if ! command -v curl >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  step "installing curl python3-venv"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq curl python3-venv >/dev/null
fi
# py_has MODULES: the venv's python imports them (a comma-separated list).
py_has() { target/py-venv/bin/python -c "import $1" 2>/dev/null; }
# pip_add NAME SPEC: installs SPEC into the venv, NAME in the progress line.
pip_add() {
  step "installing $1 into target/py-venv"
  target/py-venv/bin/pip install -q "$2"
}
if ! py_has aioquic; then
  step "installing aioquic into target/py-venv"
  mkdir -p target
  python3 -m venv target/py-venv
  target/py-venv/bin/pip install -q 'aioquic>=1.2,<2'
fi
# aiocoap: a CoAP client no one here wrote that does not answer Echo
# (the anti-amplification interop test), and with its oscore extra (cbor2,
# cryptography, filelock) the OSCORE peer (tests/oscore_aiocoap.rs)
if ! py_has 'aiocoap.oscore, cbor2, filelock' || [ ! -x target/py-venv/bin/aiocoap-client ]; then
  pip_add 'aiocoap[oscore]' 'aiocoap[oscore]>=0.4.7,<0.5'
fi
# websockets: aiocoap's coap+ws transport (tests/coap_tcp_interop.rs)
if ! py_has websockets; then
  pip_add websockets 'websockets>=13,<16'
fi
# prometheus_client: the Prometheus project's parsers of the text format
# and of OpenMetrics, to read /metrics (tests/health.rs, metrics_parse.py)
if ! py_has prometheus_client.openmetrics.parser; then
  pip_add prometheus-client 'prometheus-client>=0.21,<1'
fi
# amqtt: an MQTT broker no one here wrote with WebSocket listeners (ws://,
# wss://; Debian's mosquitto cannot open one here)
if [ ! -x target/py-venv/bin/amqtt ]; then
  pip_add amqtt 'amqtt==0.12.1'
fi

# pymodbus: a Modbus TCP server and RTU slave no one here wrote, for the
# Modbus devices' interop tests (tests/modbus_pymodbus.rs,
# tests/modbus_peer.py; the RTU one on a pty pair from Debian's socat);
# its serial extra is pyserial
if ! py_has 'pymodbus, serial'; then
  pip_add 'pymodbus[serial]' 'pymodbus[serial]>=3.16,<3.17'
fi
# asyncua: an OPC UA server no one here wrote, for the OPC UA devices'
# interop tests (tests/opcua_asyncua.rs, tests/opcua_peer.py; their
# certificates are made by openssl, from Debian's openssl package)
if ! py_has asyncua; then
  pip_add asyncua 'asyncua>=2.1,<2.2'
fi

# The MQTT lab's peer: Eclipse Paho (Java), the paper's client, built with
# Maven from Maven Central (the lab test requires it under
# MINTGATE_REQUIRE_PEERS).
step "building peers/paho (mvn package)"
mvn -q -B -f peers/paho/pom.xml package
# Eclipse Californium (cf-oscore) for the OSCORE interop tests
# (tests/oscore_californium.rs) and the footprint lab's comparison.
step "building peers/californium (mvn package)"
mvn -q -B -f peers/californium/pom.xml package

# A one-off build gains nothing from incremental state (gigabytes under
# target/debug/incremental); set CARGO_INCREMENTAL=1 to keep it.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
disk() { echo "disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free, target/ $(du -sh target 2>/dev/null | cut -f1)"; }
disk

step "cargo fmt --check"
cargo fmt --all -- --check

# Every feature on (the labs and the load generator are behind mintgate-cli's
# `labs`); then the lean gateway alone (no labs, no embedded broker), so that
# code behind a feature cannot rot in the build users install.
step "cargo clippy (-D warnings)"
cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings
cargo clippy -p mintgate-cli --no-default-features --quiet -- -D warnings

step "cargo test (peers required)"
export MINTGATE_REQUIRE_PEERS=1
cargo test --workspace --all-features 2>&1 | tee target/test-output.txt
disk

# The Debian package from the debug build above (cargo-deb, installed
# pinned when missing): contents checked, installed with dpkg -i, run as
# the mintgate user against /etc/mintgate/mintgate.toml (READY=1 and
# WATCHDOG=1 on a notify socket, a CoAP GET, /readyz), then purged.
step "Debian package: build, check, install, run, purge (scripts/deb.sh)"
scripts/deb.sh 2>&1 | tee -a target/test-output.txt

# The buffer pool's unsafe code, two more ways, each built in a target dir
# of its own under target/ (the main build stays valid): its loom model of
# the free list and of shared blocks' reference counts (tests/loom.rs,
# preemption bound 3), and its unit and concurrency tests under
# AddressSanitizer with the nightly toolchain (the one the fuzzing uses).
step "mintgate-buf: loom model (--cfg loom)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=3 \
  CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_DEBUG=0 \
  cargo test -p mintgate-buf --release --test loom 2>&1 | tee -a target/test-output.txt
step "mintgate-buf: tests under AddressSanitizer (nightly)"
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "FAILED: no nightly toolchain (rustup toolchain list) for -Zsanitizer=address"
  exit 1
fi
host="$(rustc +nightly -vV | sed -n 's/^host: //p')"
RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=target/asan \
  cargo +nightly test -p mintgate-buf --target "$host" --lib --test pool_threads 2>&1 \
  | tee -a target/test-output.txt

# Every target (19) built in the dev profile (half the build time of
# release) and run 5 s each, then every committed corpus replayed: about 3
# minutes. Longer runs: scripts/fuzz.sh SECONDS.
fuzz_s="${MINTGATE_FUZZ_SECONDS:-5}"
if [ "$fuzz_s" != "0" ]; then
  step "fuzz smoke run (${fuzz_s}s per target, dev profile, then corpus replay)"
  MINTGATE_REQUIRE_FUZZ=1 MINTGATE_FUZZ_DEV=1 scripts/fuzz.sh "$fuzz_s"
fi

disk

# one closing line for CI, from cargo's own per-binary summaries
passed=$(grep -Eo '[0-9]+ passed' target/test-output.txt | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' target/test-output.txt | awk '{s+=$1} END {print s+0}')
echo
echo "tests: ${passed} passed, ${failed} failed"
