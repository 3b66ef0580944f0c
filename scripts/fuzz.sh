#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ and replays their committed corpora.
#
# usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#   SECONDS_PER_TARGET  libFuzzer -max_total_time for each target (default 30)
#   TARGET...           targets to run (default: all, from `cargo fuzz list`)
#
# MINTGATE_FUZZ_DEV=1 builds the targets in cargo's dev profile (no
# optimisation: about half the build time, fewer executions per second);
# the test suite's short smoke run uses it, long runs should not.
#
# Toolchain: nightly when installed (AddressSanitizer, the cargo-fuzz
# default); otherwise the default toolchain with `--sanitizer none` if that
# builds. When no fuzzing is possible at all, prints SKIPPED and exits 0,
# unless MINTGATE_REQUIRE_FUZZ is set (then exits 1). A source in
# fuzz/fuzz_targets/ that is not a target, or a target named that does not
# exist, always fails; a target without a committed corpus in
# fuzz/corpus/TARGET fails when MINTGATE_REQUIRE_FUZZ is set.
#
# New inputs libFuzzer discovers go to fuzz/work/TARGET (not committed); the
# seeds in fuzz/corpus/TARGET are only read. A crashing input is copied into
# fuzz/corpus/TARGET so that the replay (`-runs=0` over the committed corpus)
# keeps failing until the bug is fixed. Exits nonzero on any crash.

set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FUZZ_DIR="$ROOT/fuzz"
LOG_DIR="$FUZZ_DIR/work/logs"

SECS="${1:-30}"
if [ $# -gt 0 ]; then shift; fi
if ! [[ "$SECS" =~ ^[0-9]+$ ]] || [ "$SECS" -lt 1 ]; then
    echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]" >&2
    exit 2
fi

skip() {
    echo "fuzz: $*" >&2
    if [ -n "${MINTGATE_REQUIRE_FUZZ:-}" ]; then
        echo "fuzz: FAILED (MINTGATE_REQUIRE_FUZZ is set): $*"
        exit 1
    fi
    echo "fuzz: SKIPPED: $*"
    exit 0
}

command -v cargo >/dev/null 2>&1 || skip "cargo not found"

# --- cargo-fuzz --------------------------------------------------------------
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz (cargo install cargo-fuzz --locked)" >&2
    cargo install cargo-fuzz --locked >&2 || skip "cargo-fuzz is not installed and could not be installed"
fi

mkdir -p "$LOG_DIR"

# --- toolchain ---------------------------------------------------------------
TC=()        # e.g. (+nightly)
SAN=()       # e.g. (--sanitizer none)
if [ -n "${MINTGATE_FUZZ_DEV:-}" ]; then
    SAN+=(--dev)
fi
MODE=""
if command -v rustup >/dev/null 2>&1 && rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    TC=(+nightly)
    MODE="nightly, AddressSanitizer"
elif rustc --version 2>/dev/null | grep -q nightly; then
    MODE="default toolchain (nightly), AddressSanitizer"
else
    echo "fuzz: no nightly toolchain; trying the default toolchain with --sanitizer none" >&2
    if (cd "$ROOT" && cargo fuzz build --fuzz-dir "$FUZZ_DIR" "${SAN[@]}" --sanitizer none) >"$LOG_DIR/build-stable.log" 2>&1; then
        SAN+=(--sanitizer none)
        MODE="$(rustc --version 2>/dev/null | cut -d' ' -f1-2), no sanitizer"
    else
        tail -20 "$LOG_DIR/build-stable.log" >&2
        skip "no nightly toolchain and the fuzz targets do not build on $(rustc --version 2>/dev/null || echo 'the default toolchain') with --sanitizer none"
    fi
fi

fuzz() { (cd "$ROOT" && cargo "${TC[@]}" fuzz "$1" --fuzz-dir "$FUZZ_DIR" "${@:2}"); }

mapfile -t LISTED < <(cargo fuzz list --fuzz-dir "$FUZZ_DIR")
if [ $# -gt 0 ]; then
    TARGETS=("$@")
else
    TARGETS=("${LISTED[@]}")
fi
[ ${#TARGETS[@]} -gt 0 ] || skip "no fuzz targets found in $FUZZ_DIR"

# Every source in fuzz_targets/ must be a target (a [[bin]] in
# fuzz/Cargo.toml), and every target named must exist: a parser whose
# target silently drops out of the list would no longer be fuzzed.
missing=()
for f in "$FUZZ_DIR"/fuzz_targets/*.rs; do
    n="$(basename "$f" .rs)"
    printf '%s\n' "${LISTED[@]}" | grep -qx "$n" || missing+=("$n (no [[bin]] in fuzz/Cargo.toml)")
done
for t in "${TARGETS[@]}"; do
    printf '%s\n' "${LISTED[@]}" | grep -qx "$t" || missing+=("$t (no such target)")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "fuzz: FAILED: missing fuzz targets: ${missing[*]}"
    exit 1
fi
# Every target keeps a committed corpus that the replay below runs.
nocorpus=()
for t in "${TARGETS[@]}"; do
    [ -n "$(find "$FUZZ_DIR/corpus/$t" -type f 2>/dev/null | head -1)" ] || nocorpus+=("$t")
done
if [ ${#nocorpus[@]} -gt 0 ]; then
    if [ -n "${MINTGATE_REQUIRE_FUZZ:-}" ]; then
        echo "fuzz: FAILED (MINTGATE_REQUIRE_FUZZ is set): no committed corpus in fuzz/corpus/ for: ${nocorpus[*]}"
        exit 1
    fi
    echo "fuzz: warning: no committed corpus for: ${nocorpus[*]}" >&2
fi

[ -n "${MINTGATE_FUZZ_DEV:-}" ] && MODE="$MODE, dev profile"
echo "fuzz: $MODE; ${SECS}s per target; targets: ${TARGETS[*]}" >&2
if ! fuzz build "${SAN[@]}" >"$LOG_DIR/build.log" 2>&1; then
    tail -30 "$LOG_DIR/build.log" >&2
    echo "fuzz: FAILED: the fuzz targets do not build (see $LOG_DIR/build.log)"
    exit 1
fi

# Last value of a libFuzzer `stat::NAME: VALUE` line, or of `Done N runs`.
stat() { grep -a "stat::$1:" "$2" | tail -1 | awk '{print $2}'; }

FAILED=0
SUMMARY=()
for t in "${TARGETS[@]}"; do
    corpus="$FUZZ_DIR/corpus/$t"
    work="$FUZZ_DIR/work/$t"
    artifacts="$FUZZ_DIR/artifacts/$t"
    log="$LOG_DIR/$t.log"
    replay_log="$LOG_DIR/$t.replay.log"
    mkdir -p "$corpus" "$work" "$artifacts"
    marker="$(mktemp)"

    echo "fuzz: running $t for ${SECS}s (log: $log)" >&2
    start=$(date +%s)
    fuzz run "${SAN[@]}" "$t" "$work" "$corpus" -- \
        -max_total_time="$SECS" -print_final_stats=1 >"$log" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    execs=$(stat number_of_executed_units "$log")
    rate=$(stat average_exec_per_sec "$log")
    result="ok"
    if [ $rc -ne 0 ]; then
        FAILED=1
        result="CRASH (exit $rc)"
        found=0
        while IFS= read -r -d '' a; do
            found=1
            name="$(basename "$a")"
            cp "$a" "$corpus/$name"
            echo "fuzz: $t: crashing input kept as fuzz/corpus/$t/$name" >&2
            echo "fuzz: $t: input (hex): $(od -An -v -tx1 "$a" | tr -d ' \n' | cut -c1-512)" >&2
        done < <(find "$artifacts" -type f -newer "$marker" -print0)
        grep -a -m1 -A1 "panicked at" "$log" | sed "s/^/fuzz: $t: /" >&2
        if [ $found -eq 0 ]; then
            # e.g. a crasher already in the committed corpus, or a build error
            grep -a -m3 -E "panicked at|ERROR|error" "$log" | sed "s/^/fuzz: $t: /" >&2
        fi
    fi
    rm -f "$marker"

    # Replay the committed corpus: every seed and every kept crasher.
    seeds=$(find "$corpus" -type f | wc -l)
    fuzz run "${SAN[@]}" "$t" "$corpus" -- -runs=0 >"$replay_log" 2>&1
    if [ $? -eq 0 ]; then
        replay="replay ok ($seeds inputs)"
    else
        FAILED=1
        replay="replay FAILED ($seeds inputs, see $replay_log)"
        grep -a -m1 -A1 "panicked at" "$replay_log" | sed "s/^/fuzz: $t: replay: /" >&2
    fi
    SUMMARY+=("fuzz: $t: $result; ${took}s, ${execs:-?} execs, ${rate:-?} execs/s; $replay")
done

printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
