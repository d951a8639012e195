"""Per-step decode times at batch 1 (64 tokens after a 32-token prompt): min / p10 / median.
On a contended machine the min step is the closest to the uncontended speed."""
import json, sys, time, statistics, os
which, path = sys.argv[1], sys.argv[2]
N = 64
prompt = list(range(1000, 1032))
def stats(ts):
    ts = sorted(ts)
    return dict(min_ms=ts[0] * 1e3, p10_ms=ts[len(ts) // 10] * 1e3, median_ms=statistics.median(ts) * 1e3)
if which == "llama.cpp":
    from llama_cpp import Llama
    lc = Llama(model_path=path, n_ctx=256, n_threads=2, n_threads_batch=2, verbose=False)
    lc.eval(prompt)
    ts = []
    for _ in range(N):
        tok = int(lc.scores[lc.n_tokens - 1].argmax())
        t0 = time.perf_counter(); lc.eval([tok]); ts.append(time.perf_counter() - t0)
else:
    import fastdecode
    from fastdecode.engine.request import GenerationConfig
    from fastdecode.sampling import SamplingParams
    llm = fastdecode.load(path)
    for rep in range(2):  # the first run warms up
        run = llm.start([prompt], SamplingParams(temperature=0), GenerationConfig(max_new_tokens=N, ignore_eos=True))
        ts, last = [], None
        for step in run:
            now = time.perf_counter()
            if last is not None:
                ts.append(now - last)
            last = now
print(json.dumps(dict(engine=which, file=os.path.basename(path), steps=len(ts), load=os.getloadavg()[0], **stats(ts))), flush=True)
