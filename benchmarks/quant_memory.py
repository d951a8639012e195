"""Resident memory after load and a 2-token generate: a model minus the tiny preset,
each in a fresh process.

    .venv/bin/python benchmarks/quant_memory.py > benchmarks/quant_memory.txt
    .venv/bin/python benchmarks/quant_memory.py FILE.gguf ... > benchmarks/real_memory.txt

Without files: the default model, weights=auto and float, no package. With files
(issue 23's target: at most 1.1x the file): each file as `load(path)` loads it, with
its package. The generate is there because memory-mapped weights become resident
only when a step reads them. Both processes import the same modules, build the same
kernels and run the same step, so the difference is the model. The KV cache is
allocated untouched (the native attention reads only the positions written), so
little of it is resident; `kv` is its full size.
"""

import json
import os
import subprocess
import sys

CHILD = """
import json, os, sys, fastdecode
kw = {} if sys.argv[3] == "default" else {"compiled": None}
llm = fastdecode.load(sys.argv[1], weights=sys.argv[2], **kw)
llm.generate(["Hello"], max_new_tokens=2, temperature=0)  # memory-mapped weights are resident once read
with open("/proc/self/status") as f:
    rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
print(json.dumps({"rss": rss, "weights": llm.weights_summary, "kv": llm.engine.cache_bytes}))
"""


def rss(model: str, weights: str, compiled: str = "none") -> dict:  # compiled: "none" or "default"
    out = subprocess.run([sys.executable, "-c", CHILD, model, weights, compiled], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from fastdecode.checkpoints import default_model_path

    tiny = rss("tiny", "auto")["rss"]
    if len(sys.argv) > 1:
        print(f"tiny preset process: {tiny / 1e6:.1f} MB RSS")
        for path in sys.argv[1:]:
            size = os.path.getsize(path)
            r = rss(path, "auto", "default")
            extra = r["rss"] - tiny
            print(f"{os.path.basename(path)} ({size / 1e6:.1f} MB): {r['rss'] / 1e6:.1f} MB RSS, {extra / 1e6:.1f} MB "
                  f"over tiny = {extra / size:.2f}x the file; KV {r['kv'] / 1e6:.0f} MB allocated ({r['weights']})",
                  flush=True)
        return
    size = os.path.getsize(default_model_path())
    print(f"GGUF file: {size / 1e6:.1f} MB; tiny preset process: {tiny / 1e6:.1f} MB RSS")
    for weights in ("auto", "float"):
        r = rss("smollm2-135m-instruct", weights)
        extra = r["rss"] - tiny
        print(f"weights={weights}: {r['rss'] / 1e6:.1f} MB RSS, {extra / 1e6:.1f} MB over tiny = "
              f"{extra / size:.2f}x the file ({r['weights']})")


if __name__ == "__main__":
    main()
