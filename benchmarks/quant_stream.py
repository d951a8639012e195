"""Stream the default model's 120 packed layer matrices and its Q8_0 head at batch 1.

    .venv/bin/python benchmarks/quant_stream.py

The matrices (66 MB) do not fit in L3, so this measures how fast the q4/q8
kernels pull weights from DRAM on 1 and 2 threads, apart from the rest of a step.
"""
import torch, time, fastdecode
from fastdecode.quant.linear import QuantLinear
llm = fastdecode.load(max_seq_len=256)
mods = [m for m in llm.model.modules() if isinstance(m, QuantLinear)]
xs = {m.k: torch.randn(1, m.k) for m in mods}
nbytes = sum(sum(t.numel()*t.element_size() for t in m.packed().values()) for m in mods)
head = llm.model.tok_embeddings
with torch.inference_mode():
    for th in (1,2):
        torch.set_num_threads(th)
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(20):
                for m in mods: m(xs[m.k])
            dt = (time.perf_counter()-t)/20
        t = time.perf_counter()
        for _ in range(20): head.as_linear(xs[576])
        dh = (time.perf_counter()-t)/20
        print(f'threads={th}: 120 layer matmuls {dt*1e3:.2f} ms ({nbytes/dt/1e9:.1f} GB/s), head {dh*1e3:.2f} ms')
