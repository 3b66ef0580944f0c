#!/usr/bin/env bash
# Issue 25's two performance targets, measured with `mintgate bench` in one
# run (a sibling of bench-vs-libcoap.sh, with the same fairness rules):
#
#   1. OSCORE GET /request, closed loop: at least 50 % of plain CoAP's
#      throughput on the same gateway (mintgate vs itself);
#   2. coap+tcp GET /request: mintgate >= 2x libcoap's coap-server-notls over
#      coap+tcp (RFC 8323) with the same load.
#
# Fairness: every round starts fresh servers, the order of the two runs
# alternates between rounds, and the verdict uses the median of the
# per-round ratios. For 1, both runs load the same `mintgate serve` (one
# config with an OSCORE context per client; `access` does not require
# OSCORE), with the same clients and window; each client has a context of
# its own, so each has its own replay window on the server. For 2, libcoap
# 4.3 serves coap+tcp on the port it serves coap on; /request is made by a
# PUT as in bench-vs-libcoap.sh. Per round and server the CPU time per
# request of the server (from /proc/PID/stat) and of the generator is
# printed, as there.
#
# Tunables (environment): ROUNDS (3), DURATION (5s), WARMUP (5s), CLIENTS x
# WINDOW (8 x 16), MG_ARGS (extra `mintgate serve` arguments), OUT (folder
# for the JSON results; default a temporary one), BIN (a mintgate built
# with the feature labs; default ${CARGO_TARGET_DIR:-target}/release/mintgate,
# built here).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-5s}
CLIENTS=${CLIENTS:-8}
WINDOW=${WINDOW:-16}
MG_ARGS=${MG_ARGS:-}
MG=127.0.0.1:5683
LC=127.0.0.1:5684

for tool in coap-server-notls coap-client-notls python3; do
    command -v "$tool" >/dev/null || { echo "$tool not found (libcoap3-bin, python3)" >&2; exit 1; }
done

if [ -z "${BIN:-}" ]; then
    cargo build --release -q -p mintgate-cli --features labs
    BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/mintgate
fi
case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

# OSCORE: one server context per client (Sender IDs 0x80 + i, the client's
# 0x10 + i), the client files in $OUT/oscore
FIX=$OUT/oscore
rm -rf "$FIX" && mkdir -p "$FIX/client"
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$FIX/secret.hex"
{
    printf '[coap]\nbind = ["%s"]\n[oscore]\nstate = "%s/state"\n' "$MG" "$FIX"
    for i in $(seq 0 $((CLIENTS - 1))); do
        printf '[[oscore.contexts]]\nname = "bench%d"\nmaster_secret_file = "%s/secret.hex"\nmaster_salt = "9e7ca92223786340"\nsender_id = "%02x"\nrecipient_id = "%02x"\n' \
            "$i" "$FIX" $((0x80 + i)) $((0x10 + i))
        printf 'name = "bench%d"\nmaster_secret_file = "../secret.hex"\nmaster_salt = "9e7ca92223786340"\nsender_id = "%02x"\nrecipient_id = "%02x"\n' \
            "$i" $((0x10 + i)) $((0x80 + i)) >"$FIX/client/ctx$i.toml"
    done
} >"$FIX/gw.toml"
CONTEXTS=$(ls "$FIX"/client/ctx*.toml | paste -sd,)

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

answers() { coap-client-notls -B 1 -m get "$1" 2>/dev/null | grep -q 'hello world'; }

# start_mintgate ARGS...: a fresh gateway (pid last in PIDS)
start_mintgate() {
    if answers "coap://$MG/request"; then echo "something already serves coap://$MG/request: stop it first" >&2; exit 1; fi
    rm -rf "$FIX/state" "$FIX"/client/*.seq
    # shellcheck disable=SC2086
    "$BIN" serve --log warn "$@" $MG_ARGS >"$OUT/mintgate.log" 2>&1 &
    PIDS+=($!)
}
start_libcoap() {
    if answers "coap+tcp://$LC/request"; then echo "something already serves coap+tcp://$LC/request: stop it first" >&2; exit 1; fi
    coap-server-notls -A 127.0.0.1 -p "${LC#*:}" -d 10 >"$OUT/libcoap.log" 2>&1 &
    PIDS+=($!)
}
wait_up() {
    for _ in $(seq 40); do
        local ok=1
        for u in "$@"; do
            case $u in *"$LC"*) coap-client-notls -B 1 -m put -e 'hello world' "$u" >/dev/null 2>&1 || true ;; esac
            answers "$u" || ok=0
        done
        [ $ok = 1 ] && return 0
        sleep 0.25
    done
    echo "servers did not come up; logs:" >&2
    cat "$OUT"/*.log >&2
    exit 1
}

# one CASE ROUND WHO PID BENCH-ARGS...
one() {
    local case=$1 r=$2 who=$3 pid=$4
    shift 4
    cpu_ticks "$pid" >"$OUT/$case-$r-$who.cpu"
    "$BIN" bench --duration "$DURATION" --warmup "$WARMUP" --json --clients "$CLIENTS" --window "$WINDOW" "$@" \
        >"$OUT/$case-$r-$who.json" 2>"$OUT/$case-$r-$who.err" || true
    cpu_ticks "$pid" >>"$OUT/$case-$r-$who.cpu"
    sleep 1
}

echo "OSCORE and coap+tcp: $ROUNDS rounds per case, ${DURATION} each (+${WARMUP} warm-up), $CLIENTS clients x $WINDOW; results in $OUT" >&2
for r in $(seq "$ROUNDS"); do
    # 1. the same gateway, plain then OSCORE or the other way round; the
    # base of the ratio ("libcoap" column below) is plain CoAP
    start_mintgate -c "$FIX/gw.toml"
    wait_up "coap://$MG/request"
    pid=${PIDS[0]}
    # the alternation of step 2 below, with other servers and arguments
    order=(plain oscore)
    [ $((r % 2)) -eq 0 ] && order=(oscore plain)
    for s in "${order[@]}"; do
        if [ "$s" = plain ]; then
            one oscore "$r" base "$pid" "coap://$MG/request"
        else
            one oscore "$r" mintgate "$pid" --oscore "$CONTEXTS" "coap://$MG/request"
        fi
    done
    stop_servers
    # 2. coap+tcp: libcoap and mintgate, fresh, alternating
    start_libcoap
    start_mintgate --coap "$MG" --coap-tcp "$MG"
    wait_up "coap+tcp://$LC/request" "coap://$MG/request"
    order=(libcoap mintgate)
    [ $((r % 2)) -eq 0 ] && order=(mintgate libcoap)
    for s in "${order[@]}"; do
        if [ "$s" = libcoap ]; then
            one tcp "$r" base "${PIDS[0]}" "coap+tcp://$LC/request"
        else
            one tcp "$r" mintgate "${PIDS[1]}" "coap+tcp://$MG/request"
        fi
    done
    stop_servers
    printf '  round %d done\n' "$r" >&2
done

python3 - "$OUT" "$ROUNDS" "$WARMUP" "$(getconf CLK_TCK)" <<'PY'
import statistics, sys
sys.path.insert(0, "scripts")
from bench_common import Run
run = Run(sys.argv[1], sys.argv[3], sys.argv[4])
rounds = int(sys.argv[2])
load, cpu_per_request = run.load, run.cpu_per_request
cases = [
    ("oscore", "OSCORE GET /request vs plain CoAP, same gateway, closed loop", "plain", "oscore", 0.5),
    ("tcp", "coap+tcp GET /request, closed loop: mintgate vs libcoap", "libcoap", "mintgate", 2.0),
]
verdicts = []
# Like bench-vs-libcoap.sh's table, with other columns (errors where that
# one has the p99 ratio) and two servers named per case.
for case, title, base, name, want in cases:
    print(f"\n=== {title}")
    print(f"{'round':>5} {base + ' req/s':>14} {name + ' req/s':>15} {'ratio':>7} {base + ' p99':>12} {name + ' p99':>13} {'errors b/' + name[0]:>10} {'lost %':>7}")
    ratios = []
    for r in range(1, rounds + 1):
        b, g = load(case, r, "base"), load(case, r, "mintgate")
        if not b or not g or not b["received"] or not g["received"]:
            print(f"{r:>5}  (no result)")
            continue
        rr = g["requests_per_sec"] / b["requests_per_sec"]
        ratios.append(rr)
        print(f"{r:>5} {b['requests_per_sec']:>14.0f} {g['requests_per_sec']:>15.0f} {rr:>6.2f}x "
              f"{b['latency_us']['p99']/1000:>10.2f}ms {g['latency_us']['p99']/1000:>11.2f}ms "
              f"{b['errors']:>5}/{g['errors']:<4} {100*b['loss_ratio']:>3.2f}/{100*g['loss_ratio']:.2f}")
    for r in range(1, rounds + 1):
        for s, label in (("base", base), ("mintgate", name)):
            res = load(case, r, s)
            c = res and res["received"] and cpu_per_request(case, r, s, res)
            if c:
                print(f"  round {r} {label:>8}: CPU per request: server user {c[0]:.2f} us, "
                      f"system {c[1]:.2f} us; generator {c[2]:.2f} us")
    if not ratios:
        verdicts.append(f"FAIL  {title}: no result")
        continue
    med = statistics.median(ratios)
    verdicts.append(f"{'PASS' if med >= want else 'FAIL'}  {title}: median {name}/{base} req/s = {med:.2f}x "
                    f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)}; target >= {want}x)")
print("\n=== targets")
print("\n".join(verdicts))
PY
