"""GEMV chain of the default model's linears (30 layers + tied head, fp32, distinct
weights so nothing stays in cache): stock F.linear vs the native kernel.

    .venv/bin/python benchmarks/compile_gemv.py [threads]
"""
import time, sys, torch, torch.nn.functional as F
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
from fastdecode.kernels import load_kernels
load_kernels()
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
layers = [[torch.randn(N, K) for N, K in shapes] for _ in range(30)]
head = torch.randn(49152, 576)
nbytes = sum(w.numel()*4 for l in layers for w in l) + head.numel()*4
def chain(lin, M):
    xs = {K: torch.randn(M, K) for K in (576, 1536)}
    def run():
        for l in layers:
            for w in l: lin(xs[w.shape[1]], w)
        lin(xs[576], head)
    return run
def bench(fn, n=15):
    for _ in range(3): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    ts.sort(); return ts[len(ts)//2]
for M in (1, 4):
    for name, lin in (("F.linear", F.linear), ("gemv", torch.ops.fastdecode.gemv)):
        t = bench(chain(lin, M))
        print(f"threads={torch.get_num_threads()} M={M} {name:8s} {t*1e3:.1f} ms/token-of-linears  {nbytes/t/1e9:.1f} GB/s  (ceiling {1/t:.0f} tok/s)")
