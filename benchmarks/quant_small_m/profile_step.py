"""Per-T step times of the default model (eager, batch 1, logits at all T) and
their split: quantized linears by kind, attention kernel, the rest."""
import os, sys, time, json, collections
os.environ.setdefault("FASTDECODE_NO_PACKAGE", "1")
import torch
import fastdecode
from fastdecode.quant.linear import QuantLinear, QuantEmbedding

torch.manual_seed(0)
llm = fastdecode.load(compiled=None)
runner = llm.engine.runner
model = runner.model
Ts = [int(t) for t in (sys.argv[1].split(",") if len(sys.argv) > 1 else "1,2,3,5,8".split(","))]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
split = os.environ.get("SPLIT", "1") == "1"

timers = collections.defaultdict(float)
def wrap(mod, kind, meth="forward"):
    f = getattr(mod, meth)
    def g(*a, **k):
        t = time.perf_counter(); y = f(*a, **k); timers[kind] += time.perf_counter() - t; return y
    setattr(mod, meth, g)

if split:
    for name, m in model.named_modules():
        if isinstance(m, QuantLinear):
            kind = "qkv" if name.endswith("wqkv") else "o" if name.endswith("wo") else "mlp"
            wrap(m, kind)
        if isinstance(m, QuantEmbedding):
            wrap(m, "head", "as_linear")
    att = torch.ops.fastdecode.attention
    class A:  # wrap the op via attribute patch
        pass
    orig = torch.ops.fastdecode.attention
    import fastdecode.model.transformer as fm
    class Ops:
        def __getattr__(self, n):
            o = getattr(torch.ops.fastdecode, n)
            if n != "attention": return o
            def g(*a, **k):
                t = time.perf_counter(); y = o(*a, **k); timers["attn"] += time.perf_counter() - t; return y
            return g
    class Torch:
        def __getattr__(self, n):
            if n == "ops":
                class O:
                    fastdecode = Ops()
                    def __getattr__(s, n2): return getattr(torch.ops, n2)
                return O()
            return getattr(torch, n)
    fm.torch = Torch()

print("isa", fastdecode.kernels.active_isa(), "types", {type(m).__name__ for m in model.modules() if isinstance(m,(QuantLinear,QuantEmbedding))})
for name, m in model.named_modules():
    if isinstance(m, (QuantLinear, QuantEmbedding)) and ("layers.0." in name or isinstance(m, QuantEmbedding)):
        print(name, m.extra_repr())

slot = 0
class R: pass
req = R(); req.slot = 0
res = {}
for T in Ts:
    toks = [[int(x) for x in torch.randint(100, 20000, (T,))]]
    pos = [list(range(40, 40 + T))]
    for _ in range(10): runner._step(toks, pos, [req], last_only=False)
    timers.clear()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); runner._step(toks, pos, [req], last_only=False); ts.append(time.perf_counter() - t)
    ts.sort()
    med = ts[len(ts)//2] * 1e3
    tot = sum(ts) / reps * 1e3
    parts = {k: v / reps * 1e3 for k, v in timers.items()}
    parts["rest"] = tot - sum(parts.values())
    res[T] = dict(median_ms=med, mean_ms=tot, parts=parts)
    print(f"T={T}: median {med:.3f} ms mean {tot:.3f}  " + " ".join(f"{k}={v:.3f}" for k, v in parts.items()), flush=True)
print(json.dumps(res))
