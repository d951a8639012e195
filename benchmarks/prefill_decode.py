"""Prefill of a 128-token prompt (best of 3) and per-step decode times at batch 1 (64 tokens after a
32-token prompt: min / p10 / median), through fastdecode's engine or llama.cpp (llama-cpp-python),
2 threads each. On a contended machine the min is the closest to the uncontended speed.

    python benchmarks/prefill_decode.py fastdecode|llama.cpp FILE.gguf
"""
import json
import os
import statistics
import sys
import time

which, path = sys.argv[1], sys.argv[2]
N, PREFILL = 64, list(range(2000, 2128))
prompt = list(range(1000, 1032))


def stats(ts):
    ts = sorted(ts)
    return dict(min_ms=ts[0] * 1e3, p10_ms=ts[len(ts) // 10] * 1e3, median_ms=statistics.median(ts) * 1e3)


t_load = time.perf_counter()
if which == "llama.cpp":
    from llama_cpp import Llama

    lc = Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=2, n_threads_batch=2, verbose=False)
    load_s = time.perf_counter() - t_load
    fills = []
    for _ in range(3):
        lc.reset()
        t0 = time.perf_counter()
        lc.eval(PREFILL)
        fills.append(time.perf_counter() - t0)
    lc.reset()
    lc.eval(prompt)
    ts = []
    for _ in range(N):
        tok = int(lc.scores[lc.n_tokens - 1].argmax())
        t0 = time.perf_counter()
        lc.eval([tok])
        ts.append(time.perf_counter() - t0)
else:
    import fastdecode
    from fastdecode.engine.request import GenerationConfig
    from fastdecode.sampling import SamplingParams

    llm = fastdecode.load(path, max_seq_len=512, max_batch_size=1, prefix_cache=False)  # every prefill computed
    load_s = time.perf_counter() - t_load
    fills = []
    for _ in range(3):  # one new token: the prefill and a first step
        t0 = time.perf_counter()
        llm.generate([PREFILL], max_new_tokens=1, temperature=0)
        fills.append(time.perf_counter() - t0)
    for rep in range(2):  # the first run warms up
        run = llm.start([prompt], SamplingParams(temperature=0), GenerationConfig(max_new_tokens=N, ignore_eos=True))
        ts, last = [], None
        for step in run:
            now = time.perf_counter()
            if last is not None:
                ts.append(now - last)
            last = now
print(json.dumps(dict(engine=which, file=os.path.basename(path), load_s=round(load_s, 1),
                      prefill128_ms=round(min(fills) * 1e3, 1), steps=len(ts), load=os.getloadavg()[0],
                      **{k: round(v, 2) for k, v in stats(ts).items()})), flush=True)
