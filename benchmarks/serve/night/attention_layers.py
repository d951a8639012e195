"""The attention op over 30 layers' own float16 (or q8_0) KV caches, as a decode step of the default
model's shape reads them: 9 query heads, 3 KV heads, head_dim 64, 16 slots of 2048 positions.
Each layer's cache is a separate tensor, so the reads come from DRAM as in the engine, not
from cache as a one-layer loop would have them (one layer, 16 rows at 250 positions: 88 us;
30 layers: 6.5 ms a step before 123326f).

    python benchmarks/serve/night/attention_layers.py TAG [1b]
    KV=q8 ...          # q8_0 caches
    ATEN_CPU_CAPABILITY=avx2 ISA=avx2 ...   # the AVX2 kernels

`1b`: Llama-3.2-1B's attention instead (32 query heads, 8 KV heads, head_dim 64), 16 layers, 8
slots of 1024 positions. Prints, per batch x context, the min / median of 7 timings of 10 steps, in ms a step.
Run two trees alternately with PYTHONPATH=TREE/src.
"""
import torch, time, sys, statistics
from fastdecode import kernels
kernels.load_kernels()
torch.set_num_threads(2)
ONE_B = sys.argv[2:] == ["1b"]
H, Hkv, D, S, slots, L = (32, 8, 64, 1024, 8, 16) if ONE_B else (9, 3, 64, 2048, 16, 30)
import os
if os.environ.get("ISA"): kernels.set_isa(os.environ["ISA"])
if os.environ.get("KV") == "q8":
    from fastdecode.model.kv_cache import quantize_q8_0
    ks = [quantize_q8_0(torch.randn(slots, Hkv, S, D)) for _ in range(L)]; vs = [quantize_q8_0(torch.randn(slots, Hkv, S, D)) for _ in range(L)]
else:
    ks = [torch.randn(slots, Hkv, S, D).half() for _ in range(L)]; vs = [torch.randn(slots, Hkv, S, D).half() for _ in range(L)]
out = []
for B, ctx in [(8, 200), (8, 500), (1, 500)] if ONE_B else [(16, 70), (16, 200), (16, 300), (1, 300)]:
    q = torch.randn(B, 1, H, D)
    pos = torch.full((B, 1), ctx - 1, dtype=torch.long)
    rows = torch.arange(B)
    def f():
        for k, v in zip(ks, vs): torch.ops.fastdecode.attention(q, k, v, pos, rows, 0, 0.125)
    for _ in range(5): f()
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(10): f()
        ts.append((time.perf_counter() - t) / 10 * 1e3)
    out.append(f"{B}x{ctx} {min(ts):.2f}/{statistics.median(ts):.2f}")
print(sys.argv[1], " | ".join(out), f"ms (min/median) a step of {L} layers")
