"""Shared by the reports of scripts/bench-*.sh: one run folder's results.

Each case, round and server left OUT/CASE-ROUND-SERVER.json (`mintgate
bench --json`) and OUT/CASE-ROUND-SERVER.cpu (the server's user and system
clock ticks before and after, one line each).
"""
import json
import re


class Run:
    def __init__(self, out, warmup, clk_tck):
        self.out = out
        m = re.fullmatch(r"([0-9.]+)(ms|s)", warmup)
        self.warmup = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1) if m else 0.0
        self.tick = 1.0 / int(clk_tck)

    def load(self, case, r, s):
        try:
            with open(f"{self.out}/{case}-{r}-{s}.json") as f:
                return json.load(f)
        except Exception:
            return None

    def cpu_per_request(self, case, r, s, res):
        """The server's user and system CPU and the generator's CPU per
        request, us. The CPU times cover the warm-up too, so the requests
        are estimated as the measured rate over warm-up plus measured time."""
        try:
            with open(f"{self.out}/{case}-{r}-{s}.cpu") as f:
                a, b = f.read().split("\n")[:2]
            (u0, s0), (u1, s1) = map(int, a.split()), map(int, b.split())
        except Exception:
            return None
        n = res["requests_per_sec"] * (res["duration_s"] + self.warmup)
        if n <= 0:
            return None
        us = 1e6 / n
        return ((u1 - u0) * self.tick * us, (s1 - s0) * self.tick * us, res["generator_cpu_s"] * us)
