# A/B of the grouped expert matmuls (model/moe.py _grouped) against one call per expert, in one process:
#     FASTDECODE_CACHE=/tmp/fd-moe python benchmarks/moe/grouped_ab.py
import fastdecode, torch, time, statistics
from fastdecode.model import moe
from fastdecode.engine.request import GenerationConfig
from fastdecode.sampling import SamplingParams
llm = fastdecode.load('/work/models/qwen3moe-30b-a3b-8l-Q4_K_M.gguf', max_seq_len=512, max_batch_size=1, prefix_cache=False)
orig = moe._grouped
def decode():
    run = llm.start([list(range(1000, 1032))], SamplingParams(temperature=0), GenerationConfig(max_new_tokens=64, ignore_eos=True))
    ts, last = [], None
    for step in run:
        now = time.perf_counter()
        if last is not None: ts.append(now - last)
        last = now
    return statistics.median(ts) * 1e3, min(ts) * 1e3
decode()
for r in range(3):
    for name, f in (("grouped", orig), ("separate", lambda *a: None)):
        moe._grouped = f
        print(name, "median %.2f min %.2f" % decode())
