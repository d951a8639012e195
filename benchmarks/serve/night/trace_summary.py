"""Summary of a traced_serve.py log: steps by kind (decode only, decode + a prefill chunk, prefill
only), their count, total and mean time; the idle time between steps; decode rows per step.

    python benchmarks/serve/night/trace_summary.py steps.json
"""

import collections
import json
import sys

log = [s for s in json.load(open(sys.argv[1])) if len(s) == 5][1:]  # [t0, decode rows, prefill rows, chunk, t1]; the first: run.sh's warm-up
kinds: dict[str, list[float]] = collections.defaultdict(list)
for t0, decode, prefill, _, t1 in log:
    kinds[("decode" if decode else "") + (" + prefill" if prefill else "")].append(t1 - t0)
for kind, times in kinds.items():
    print(f"{kind:>18}: {len(times):4d} steps, {sum(times):7.3f} s, {1e3 * sum(times) / len(times):6.1f} ms a step")
gaps = [log[i + 1][0] - log[i][4] for i in range(len(log) - 1)]
print(f"span {log[-1][4] - log[0][0]:.2f} s, between steps {sum(gaps):.3f} s (largest {max(gaps):.3f} s)")
print("decode rows: steps", sorted(collections.Counter(s[1] for s in log).items(), reverse=True))
