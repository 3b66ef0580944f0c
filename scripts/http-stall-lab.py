#!/usr/bin/env python3
"""Stalled HTTP connections from one source against the proxy and the
dashboard, and what another source sees meanwhile.

Starts `mintgate serve` on loopback with the HTTP proxy (which also serves
the dashboard) and the metrics endpoint (which serves it too). Then:

1. baseline: a client from 127.0.0.2 makes --samples requests (a new
   connection each) to the proxy (`/hc/coap://.../request`, through to the
   CoAP endpoint), the dashboard's JSON on the proxy listener and on the
   metrics listener; latency quantiles and failures are printed;
2. an attacker from 127.0.0.1 opens --stalled connections to each of the two
   listeners, sends half a request line on each and stalls, reopening any the
   server closes so that --stalled stay attempted throughout;
3. the same client measures again while the stall lasts.

Run once with the defaults and once with --no-source-cap
(proxy.max_connections_per_source = proxy.max_connections, i.e. no cap per
source, as before the cap existed) to see what the cap changes.

Everything is on loopback, bounded in count and time. Needs a built
binary (--bin, default target/release/mintgate, else target/debug/mintgate).
"""

import argparse
import os
import resource
import selectors
import socket
import subprocess
import sys
import tempfile
import multiprocessing as mp
import time


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port(kind):
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def read_to_close(s):
    """All that `s` receives until the peer closes."""
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            return data
        data += b


def request(port, path, src="127.0.0.2", timeout=5.0):
    """One HTTP/1.1 GET on a new connection from `src`; (status, seconds)
    or (error text, seconds)."""
    t0 = time.perf_counter()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.bind((src, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        data = read_to_close(s)
        line = data.split(b"\r\n", 1)[0].decode(errors="replace")
        parts = line.split()
        status = parts[1] if len(parts) > 1 else f"bad answer {line!r}"
        return status, time.perf_counter() - t0
    except OSError as e:
        return type(e).__name__, time.perf_counter() - t0
    finally:
        s.close()


def measure(targets, samples):
    out = {}
    for name, port, path in targets:
        lat, fails = [], {}
        for _ in range(samples):
            st, dt = request(port, path)
            if st == "200":
                lat.append(dt)
            else:
                fails[st] = fails.get(st, 0) + 1
        lat.sort()
        q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] * 1e3 if lat else float("nan")
        out[name] = (len(lat), fails, q(0.5), q(0.99), (lat[-1] * 1e3) if lat else float("nan"))
    return out


def show(title, res, samples):
    print(f"  {title}")
    for name, (ok, fails, p50, p99, mx) in res.items():
        f = ", ".join(f"{k}: {v}" for k, v in sorted(fails.items())) or "none"
        print(
            f"    {name:<22} ok {ok:>4}/{samples}  p50 {p50:7.2f} ms  p99 {p99:7.2f} ms"
            f"  max {mx:7.2f} ms  failures: {f}"
        )


class Staller:
    """Keeps `n` connections per port attempted from 127.0.0.1, each with
    half a request line sent; counts how many the server closed. Runs in a
    process of its own (so it does not share the measuring client's
    interpreter lock), reporting through shared counters."""

    def __init__(self, ports, n, deadline, shared, ready, stop, reopen):
        self.ports, self.n, self.deadline, self.reopen = ports, n, deadline, reopen
        self.sel = selectors.DefaultSelector()
        self.open = {p: 0 for p in ports}
        self.closed = {p: 0 for p in ports}
        self.errors = {p: 0 for p in ports}
        self.shared, self.ready, self.stopev = shared, ready, stop

    def publish(self):
        for i, p in enumerate(self.ports):
            self.shared[3 * i] = self.open[p]
            self.shared[3 * i + 1] = self.closed[p]
            self.shared[3 * i + 2] = self.errors[p]

    def connect(self, port):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind(("127.0.0.1", 0))
            s.connect_ex(("127.0.0.1", port))
            self.sel.register(s, selectors.EVENT_WRITE, (port, "connecting"))
            self.open[port] += 1
        except OSError:
            self.errors[port] += 1
            s.close()

    def run(self):
        for p in self.ports:
            for _ in range(self.n):
                self.connect(p)
        self.publish()
        self.ready.set()
        while not self.stopev.is_set() and time.monotonic() < self.deadline:
            for key, ev in self.sel.select(timeout=0.2):
                s = key.fileobj
                port, state = key.data
                if state == "connecting":
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        self.drop(s, port)
                        continue
                    try:
                        s.send(b"GET /hc/coap://127.0.0.1")
                    except OSError:
                        self.drop(s, port)
                        continue
                    self.sel.modify(s, selectors.EVENT_READ, (port, "stalled"))
                else:
                    try:
                        b = s.recv(4096)
                    except OSError:
                        b = b""
                    if not b:
                        self.drop(s, port)
            # reopen what the server closed, a bounded number per round
            for p in self.ports if self.reopen else []:
                for _ in range(min(500, self.n - self.open[p])):
                    self.connect(p)
            self.publish()
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()

    def drop(self, s, port):
        self.sel.unregister(s)
        s.close()
        self.open[port] -= 1
        self.closed[port] += 1


def stall(ports, n, deadline, shared, ready, stop, reopen):
    Staller(ports, n, deadline, shared, ready, stop, reopen).run()


def metrics(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    s.bind(("127.0.0.2", 0))
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = read_to_close(s)
    s.close()
    return [
        l
        for l in data.decode(errors="replace").splitlines()
        if l.startswith("mintgate_proxy_connections")
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=None)
    ap.add_argument("--stalled", type=int, default=5000, help="per listener")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--hold", type=float, default=3.0, help="seconds of stall before measuring")
    ap.add_argument("--no-source-cap", action="store_true")
    ap.add_argument(
        "--reopen",
        action="store_true",
        help="reopen every connection the server closes (a connect flood on top of the stall)",
    )
    a = ap.parse_args()
    if not (1 <= a.stalled <= 20000 and 1 <= a.samples <= 5000):
        sys.exit("--stalled 1..=20000, --samples 1..=5000")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binary = a.bin or next(
        (p for p in (f"{root}/target/release/mintgate", f"{root}/target/debug/mintgate") if os.path.exists(p)),
        None,
    )
    if not binary:
        sys.exit("no mintgate binary: cargo build -p mintgate-cli, or --bin")
    nofile = raise_nofile()
    need = 2 * a.stalled + 200
    if nofile < need:
        sys.exit(f"the descriptor limit is {nofile}, {need} needed (ulimit -Hn)")
    coap, http, mport = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
    d = tempfile.mkdtemp(prefix="mintgate-stall-")
    cfg = os.path.join(d, "gw.toml")
    extra = "max_connections_per_source = 1024\n" if a.no_source_cap else ""
    with open(cfg, "w") as f:
        f.write(
            f'[coap]\nbind = ["127.0.0.1:{coap}"]\n'
            f'[proxy]\nhttp = "127.0.0.1:{http}"\nheader_timeout_ms = 60000\n{extra}'
            f'[metrics]\nbind = "127.0.0.1:{mport}"\n'
        )
    log = open(os.path.join(d, "serve.log"), "w")
    gw = subprocess.Popen([binary, "serve", "-c", cfg], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        while request(http, "/api/state", timeout=1)[0] != "200" or request(mport, "/api/state", timeout=1)[0] != "200":
            if time.monotonic() - t0 > 30 or gw.poll() is not None:
                sys.exit(f"the gateway did not start; see {d}/serve.log")
            time.sleep(0.2)
        targets = [
            ("proxy /hc/ -> CoAP", http, f"/hc/coap://127.0.0.1:{coap}/request"),
            ("dashboard (proxy)", http, "/api/state"),
            ("dashboard (metrics)", mport, "/api/state"),
        ]
        print(
            f"mintgate {binary}; {'(reopening) ' if a.reopen else ''}{a.stalled} stalled connections from 127.0.0.1 to each of "
            f"tcp {http} (proxy + dashboard) and tcp {mport} (metrics + dashboard); "
            f"client from 127.0.0.2, {a.samples} requests per target, a new connection each; "
            f"proxy.max_connections = 1024, max_connections_per_source = "
            f"{1024 if a.no_source_cap else 64}, header_timeout_ms = 60000; descriptor limit {nofile}"
        )
        show("no stall", measure(targets, a.samples), a.samples)
        ports = [http, mport]
        shared = mp.Array("q", 3 * len(ports))
        ready, stop = mp.Event(), mp.Event()
        proc = mp.Process(
            target=stall, args=(ports, a.stalled, time.monotonic() + 300, shared, ready, stop, a.reopen), daemon=True
        )
        proc.start()
        ready.wait(60)
        time.sleep(a.hold)
        res = measure(targets, a.samples)
        c = list(shared)
        held = {p: c[3 * i] for i, p in enumerate(ports)}
        closed = {p: c[3 * i + 1] for i, p in enumerate(ports)}
        show(f"during the stall (attacker's connections open or connecting: {held}; "
             f"closed by the server so far: {closed})", res, a.samples)
        print("  proxy listener's counters (/metrics):")
        try:
            for l in metrics(mport):
                print("   ", l)
        except OSError as e:
            print(f"    /metrics unreachable: {type(e).__name__}")
        stop.set()
        proc.join(15)
        if proc.is_alive():
            proc.kill()
    finally:
        gw.terminate()
        try:
            gw.wait(10)
        except subprocess.TimeoutExpired:
            gw.kill()
        log.close()


if __name__ == "__main__":
    main()
