# Sourced by scripts/bench-*.sh: the servers a bench script starts (their
# pids in PIDS, stopped on exit) and their CPU time.

PIDS=()
stop_servers() {
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    PIDS=()
}
trap stop_servers EXIT INT TERM

# cpu_ticks PID: "user system" CPU time of a process so far, in clock ticks.
cpu_ticks() { awk '{print $14, $15}' "/proc/$1/stat" 2>/dev/null || echo "0 0"; }
