"""Parses a /metrics page with the Prometheus project's own Python client
(prometheus_client), a parser no one here wrote: the Prometheus text format
0.0.4 or, with --openmetrics, OpenMetrics 1.0 (its parser is strict: a
missing # EOF, a counter sample without _total, a clashing or repeated
family, a histogram without +Inf all raise).

Usage: metrics_parse.py [--openmetrics] FILE
Prints one JSON object: {"families": {name: type}, "samples": {sample
name with labels: value}}; exits 1 with the parser's error.
"""

import json
import sys


def main():
    args = sys.argv[1:]
    om = "--openmetrics" in args
    path = [a for a in args if not a.startswith("--")][0]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if om:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families
    families = {}
    samples = {}
    try:
        for fam in text_string_to_metric_families(text):
            if fam.name in families:
                raise ValueError(f"family {fam.name} twice")
            families[fam.name] = fam.type
            for s in fam.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    except Exception as e:  # the parser's own error, said as it is
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"families": families, "samples": samples}))


if __name__ == "__main__":
    main()
