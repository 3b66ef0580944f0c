#!/usr/bin/env bash
# mintgate vs libcoap (coap-server-notls) on this machine: the performance
# targets of issue 2, measured in one run with `mintgate bench --compare`.
#
#   1. NON GET /request, closed loop, saturating: mintgate >= 2.5x libcoap req/s
#   2. CON GET /request, 100 clients x 1 outstanding: mintgate >= 2x libcoap req/s
#   3. NON GET /request, open loop at the same offered load below both
#      servers' capacity: mintgate's p99 <= libcoap's
#
# Both servers serve "hello world" at /request (libcoap: created with a PUT,
# `-d 10` allows dynamic resources). libcoap runs first in each comparison,
# so the printed ratios are mintgate / libcoap. When `mintgate serve` is not
# available (or does not answer), only libcoap is measured.
#
# Tunables (environment): DURATION (10s), WARMUP (2s), PAUSE (3s),
# NON_CLIENTS x NON_WINDOW (8 x 16), OPEN_CLIENTS x OPEN_RATE (1000 x 10/s).
# Why 8 x 16: libcoap is single-threaded and reaches its plateau (~80-95k
# req/s here) from about 16 requests outstanding in total; 1 x 1 is
# latency-bound (~26k), 8 x 16 = 128 outstanding keeps any server busy
# without overflowing the default socket buffers (8 x 32 and more start to
# lose datagrams), and 8 source ports let a multi-threaded server spread them.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
PAUSE=${PAUSE:-3s}
NON_CLIENTS=${NON_CLIENTS:-8}
NON_WINDOW=${NON_WINDOW:-16}
OPEN_CLIENTS=${OPEN_CLIENTS:-1000}
OPEN_RATE=${OPEN_RATE:-10}
MG=127.0.0.1:5683
LC=127.0.0.1:5684

for tool in coap-server-notls coap-client-notls; do
    command -v "$tool" >/dev/null || {
        echo "$tool not found: install libcoap3-bin" >&2
        exit 1
    }
done

cargo build --release -p mintgate-cli
BIN=$PWD/target/release/mintgate
LOGDIR=$(mktemp -d)

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$LOGDIR"
}
trap cleanup EXIT INT TERM

# answers ADDR: true when GET /request at ADDR returns "hello world".
answers() {
    coap-client-notls -B 1 -m get "coap://$1/request" 2>/dev/null | grep -q 'hello world'
}

for addr in $LC $MG; do
    if answers "$addr"; then
        echo "something already serves coap://$addr/request: stop it first" >&2
        exit 1
    fi
done

coap-server-notls -A 127.0.0.1 -p 5684 -d 10 >"$LOGDIR/libcoap.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 40); do
    coap-client-notls -B 1 -m put -e 'hello world' "coap://$LC/request" >/dev/null 2>&1 || true
    answers "$LC" && break
    sleep 0.25
done
answers "$LC" || {
    echo "libcoap does not serve coap://$LC/request; its log:" >&2
    cat "$LOGDIR/libcoap.log" >&2
    exit 1
}

"$BIN" serve --coap "$MG" --log warn >"$LOGDIR/mintgate.log" 2>&1 &
MG_PID=$!
PIDS+=("$MG_PID")
HAVE_MG=0
for _ in $(seq 40); do
    kill -0 "$MG_PID" 2>/dev/null || break
    if answers "$MG"; then
        HAVE_MG=1
        break
    fi
    sleep 0.25
done

SERVERS=(--compare "libcoap=coap://$LC/request")
if [ "$HAVE_MG" = 1 ]; then
    SERVERS+=(--compare "mintgate=coap://$MG/request")
else
    echo "note: \`mintgate serve\` is not available or does not answer; measuring libcoap only" >&2
    sed 's/^/  mintgate: /' "$LOGDIR/mintgate.log" | head -5 >&2
fi

SUMMARY=()
# compare TITLE TARGET-KIND(rps|p99) THRESHOLD BENCH-ARGS...
compare() {
    local title=$1 kind=$2 want=$3
    shift 3
    echo
    echo "=== $title"
    local out
    out=$("$BIN" bench "${SERVERS[@]}" --pause "$PAUSE" --duration "$DURATION" \
        --warmup "$WARMUP" "$@") || true
    echo "$out"
    [ "$HAVE_MG" = 1 ] || return 0
    # Table columns: server req/s ratio ... p99-ratio gen.
    local line got verdict
    line=$(echo "$out" | awk '$1 == "mintgate" && $3 ~ /x$/')
    if [ "$kind" = rps ]; then
        got=$(echo "$line" | awk '{ sub(/x$/, "", $3); print $3 }')
        verdict=$(awk -v g="${got:-0}" -v w="$want" 'BEGIN { print (g >= w) ? "PASS" : "FAIL" }')
        SUMMARY+=("$verdict  $title: mintgate/libcoap req/s = ${got:-?}x (target >= ${want}x)")
    else
        got=$(echo "$line" | awk '{ x = $(NF-1); sub(/x$/, "", x); print x }')
        verdict=$(awk -v g="${got:-99}" -v w="$want" 'BEGIN { print (g <= w) ? "PASS" : "FAIL" }')
        SUMMARY+=("$verdict  $title: mintgate/libcoap p99 = ${got:-?}x (target <= ${want}x)")
    fi
}

compare "NON GET /request, closed loop ${NON_CLIENTS} clients x ${NON_WINDOW} outstanding" \
    rps 2.5 --non --clients "$NON_CLIENTS" --window "$NON_WINDOW"
compare "CON GET /request, closed loop 100 clients x 1 outstanding" \
    rps 2.0 --con --clients 100 --window 1
compare "NON GET /request, open loop ${OPEN_CLIENTS} clients x ${OPEN_RATE}/s (same offered load)" \
    p99 1.0 --non --clients "$OPEN_CLIENTS" --rate "$OPEN_RATE"

echo
if [ "$HAVE_MG" = 1 ]; then
    echo "=== targets"
    printf '%s\n' "${SUMMARY[@]}"
else
    echo "(libcoap only: start this script again once \`mintgate serve\` exists)"
fi
