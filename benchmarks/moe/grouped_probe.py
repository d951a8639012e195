# 8 experts' gate/up as 8 q4k_linear calls against one call on the 8 matrices concatenated, 24 such groups
# across the layers (past the caches):  FASTDECODE_CACHE=/tmp/fd-moe python benchmarks/moe/grouped_probe.py
import fastdecode, torch, time
llm = fastdecode.load('/work/models/qwen3moe-30b-a3b-8l-Q4_K_M.gguf', max_seq_len=512, max_batch_size=1)
m = llm.model
x = torch.randn(1, 2048)
layers = [l.feed_forward for l in m.layers]
names = layers[0].experts[0].w13.names
op = torch.ops.fastdecode.q4k_linear
# 16 groups of 8 experts across all layers: 128 x 1.77 MB = 226 MB per round (past the caches)
groups = [(l, list(range(g * 8, g * 8 + 8))) for l in layers for g in range(16)]
fused = []
for l, es in groups[:24]:
    fused.append([torch.cat([l.experts[e].w13.packed()[n] for e in es]) for n in names])
def sep():
    for l, es in groups[:24]:
        for e in es:
            op(x, *(l.experts[e].w13.packed()[n] for n in names))
def one():
    for f in fused:
        op(x, *f)
for f in (sep, one, sep, one):
    f(); t = time.perf_counter()
    for _ in range(5): f()
    dt = (time.perf_counter() - t) / 5
    print(f.__name__, "ms per 24 groups of 8", round(dt * 1e3, 2), "GB/s", round(24 * 8 * 1.77e6 / dt / 1e9, 1))
