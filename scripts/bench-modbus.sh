#!/usr/bin/env bash
# Modbus polling cost: `mintgate serve` polls DEVICES Modbus TCP devices
# (pymodbus servers, all in one Python process, on loopback), each with
# POINTS contiguous u16 holding registers read every 1/HZ s, for DURATION s;
# prints the gateway's CPU (of one core, and per request and per point),
# the simulators' CPU in the same window, the requests and points read per
# second, and the polls' lateness (p99 and most, of the worst device).
# The anchor: the ThingsBoard gateway's users report 100 % CPU and an
# unresponsive gateway at 50-200 Hz of Modbus polling.
#
#   scripts/bench-modbus.sh                 # 20 devices x 50 points at 10 Hz
#   DEVICES=4 POINTS=100 HZ=200 scripts/bench-modbus.sh
#
# Tunables (environment): DEVICES (20), POINTS (50, up to 125 per request:
# more are read in more requests), HZ (10), DURATION (10), WARMUP (2),
# MINTGATE (the binary; default target/release/mintgate, built if missing),
# GW_TOML (more of the gateway's TOML, before its tables, e.g.
# '[directpath]\nwait = "park"'),
# PYTHON (default target/py-venv/bin/python with pymodbus, as
# scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICES=${DEVICES:-20} POINTS=${POINTS:-50} HZ=${HZ:-10} DURATION=${DURATION:-10} WARMUP=${WARMUP:-2}
TARGET=${CARGO_TARGET_DIR:-target}
MINTGATE=${MINTGATE:-$TARGET/release/mintgate}
PYTHON=${PYTHON:-target/py-venv/bin/python}
[ -x "$MINTGATE" ] || cargo build --release -q -p mintgate-cli --bin mintgate
"$PYTHON" -c 'import pymodbus' || { echo "pymodbus is missing in $PYTHON (scripts/test.sh installs it)"; exit 2; }

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -s "$DIR/serve.log" ] && { echo "mintgate serve said:"; tail -5 "$DIR/serve.log"; }
  rm -rf "$DIR"
}
trap cleanup EXIT

ports=()
for _ in $(seq "$DEVICES"); do ports+=("$(free_port)"); done
mkfifo "$DIR/sim.in"
"$PYTHON" crates/mintgate-cli/tests/modbus_peer.py many "$(IFS=,; echo "${ports[*]}")" "$POINTS" \
  <"$DIR/sim.in" >"$DIR/sim.out" 2>/dev/null &
SIM=$!; PIDS+=("$SIM")
exec 3>"$DIR/sim.in"   # keeps the simulators' stdin open
for _ in $(seq 100); do grep -q ready "$DIR/sim.out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$DIR/sim.out" || { echo "the pymodbus servers did not start"; exit 1; }

COAP=$(free_port) METRICS=$(free_port)
period_us=$((1000000 / HZ))
{
  printf '%b\n' "${GW_TOML:-}"
  printf '[coap]\nbind = ["127.0.0.1:%s"]\n[metrics]\nbind = "127.0.0.1:%s"\n' "$COAP" "$METRICS"
  i=0
  for port in "${ports[@]}"; do
    printf '[[devices.list]]\nname = "d%s"\nkind = "modbus"\nhost = "127.0.0.1:%s"\nperiod = "%sus"\ntimeout = "1s"\nhistory = 16\n' "$i" "$port" "$period_us"
    for a in $(seq 0 $((POINTS - 1))); do
      printf '[[devices.list.points]]\nname = "p%s"\ntable = "holding"\naddress = %s\n' "$a" "$a"
    done
    i=$((i + 1))
  done
} >"$DIR/gw.toml"
"$MINTGATE" --log warn serve -c "$DIR/gw.toml" 2>"$DIR/serve.log" &
GW=$!; PIDS+=("$GW")

metrics() { curl -s "http://127.0.0.1:$METRICS/metrics"; }
for _ in $(seq 100); do
  kill -0 "$GW" 2>/dev/null || { echo "mintgate serve exited"; exit 1; }
  metrics >/dev/null 2>&1 && break; sleep 0.1
done
sleep "$WARMUP"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
sum() { grep "^$1{" | awk '{s += $2} END {print s + 0}'; }
m0=$(metrics); g0=$(ticks "$GW"); s0=$(ticks "$SIM"); t0=$(date +%s.%N)
sleep "$DURATION"
m1=$(metrics); g1=$(ticks "$GW"); s1=$(ticks "$SIM"); t1=$(date +%s.%N)
HZ_TICKS=$(getconf CLK_TCK)
polls=$(( $(sum mintgate_field_polls_total <<<"$m1") - $(sum mintgate_field_polls_total <<<"$m0") ))
errors=$(( $(sum mintgate_field_errors_total <<<"$m1") - $(sum mintgate_field_errors_total <<<"$m0") ))
skipped=$(( $(sum mintgate_field_skipped_polls_total <<<"$m1") - $(sum mintgate_field_skipped_polls_total <<<"$m0") ))
late50=$(grep '^mintgate_field_poll_lateness_seconds{.*quantile="0.5"}' <<<"$m1" | awk '$2 > m {m = $2} END {print m * 1000}')
late99=$(grep '^mintgate_field_poll_lateness_seconds{.*quantile="0.99"}' <<<"$m1" | awk '$2 > m {m = $2} END {print m * 1000}')
latemax=$(grep '^mintgate_field_poll_lateness_seconds{.*quantile="1"}' <<<"$m1" | awk '$2 > m {m = $2} END {print m * 1000}')
per_req=$(( (POINTS + 124) / 125 ))
awk -v d="$DEVICES" -v p="$POINTS" -v hz="$HZ" -v t0="$t0" -v t1="$t1" \
    -v polls="$polls" -v per_req="$per_req" -v errors="$errors" -v skipped="$skipped" \
    -v gw=$((g1 - g0)) -v sim=$((s1 - s0)) -v tck="$HZ_TICKS" -v l50="$late50" -v l99="$late99" -v lmax="$latemax" 'BEGIN {
  secs = t1 - t0; reqs = polls / secs; pts = reqs * (p / per_req)
  gcpu = gw / tck / secs * 100; scpu = sim / tck / secs * 100
  printf "devices %d x %d points at %g Hz: %.0f requests/s, %.0f points/s (due: %.0f points/s), %d errors, %d polls skipped\n", d, p, hz, reqs, pts, d * p * hz, errors, skipped
  printf "mintgate CPU: %.1f %% of one core (%.1f us per request, %.0f ns per point)\n", gcpu, gcpu / 100 * 1e6 / reqs, gcpu / 100 * 1e9 / pts
  printf "simulators (pymodbus, one process) CPU: %.1f %% of one core\n", scpu
  printf "poll lateness since start, worst device: p50 %.2f ms, p99 %.2f ms, most %.2f ms\n", l50, l99, lmax
  printf "anchor: ThingsBoard gateway users report 100 %% CPU at 50-200 Hz of Modbus polling\n"
}'
