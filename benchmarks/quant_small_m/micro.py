"""q4/q8 linear microbenchmark at the default model's shapes; ms per call (median of reps)."""
import sys, time, json, torch
import fastdecode
from fastdecode.kernels import load_kernels, set_isa
assert load_kernels()
isa = sys.argv[1] if len(sys.argv) > 1 else None
set_isa(isa)
torch.manual_seed(0)
import os
COPIES = int(os.environ.get("COPIES", "1"))  # >1: rotate through that many weight copies (cold, as in the model)
shapes = [("q4", 960, 576), ("q4", 576, 576), ("q4", 3072, 576), ("q4", 576, 1536), ("q8", 49152, 576)]
Ms = [1, 2, 4, 5, 8, 32]
out = {}
for kind, N, K in shapes:
    nb = K // 32
    copies = min(COPIES, 4) if kind == "q8" else COPIES
    if kind == "q4":
        ws = [(torch.randint(0, 256, (N, K // 2), dtype=torch.uint8), (torch.rand(N, nb) * 0.01).half(),
               (torch.rand(N, nb) * -0.05).half()) for _ in range(copies)]
        it = [0]
        def f(x):
            it[0] = (it[0] + 1) % copies
            w, s, mn = ws[it[0]]
            return torch.ops.fastdecode.q4_linear(x, w, s, mn)
    else:
        ws = [(torch.randint(-127, 128, (N, K), dtype=torch.int8), (torch.rand(N, nb) * 0.01).half())
              for _ in range(copies)]
        it = [0]
        def f(x):
            it[0] = (it[0] + 1) % copies
            w, s = ws[it[0]]
            return torch.ops.fastdecode.q8_linear(x, w, s)
    row = {}
    for M in Ms:
        x = torch.randn(M, K)
        for _ in range(5): f(x)
        reps = max(20 * copies if copies > 1 else 20, int(2e7 / (N * K * max(M, 4))))
        ts = []
        for _ in range(reps):
            t = time.perf_counter(); f(x); ts.append(time.perf_counter() - t)
        ts.sort()
        row[M] = ts[len(ts) // 2] * 1e3
    out[f"{kind} {N}x{K}"] = row
    print(f"{kind} N={N} K={K}: " + "  ".join(f"M={M} {v*1e3:.0f}us" for M, v in row.items()), flush=True)
print(json.dumps(out))
