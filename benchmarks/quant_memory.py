"""Resident memory after load: the default model minus the tiny preset, each in a fresh process.

    .venv/bin/python benchmarks/quant_memory.py > benchmarks/quant_memory.txt

The issue's target: at most 1.3x the GGUF file's size. Both processes import
the same modules and build the same kernels, so the difference is the model.
"""

import json
import os
import subprocess
import sys

CHILD = """
import json, os, sys, fastdecode
llm = fastdecode.load(sys.argv[1], weights=sys.argv[2], compiled=None)
with open("/proc/self/status") as f:
    rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
print(json.dumps({"rss": rss, "weights": llm.weights_summary}))
"""


def rss(model: str, weights: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, model, weights], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from fastdecode.checkpoints import default_model_path

    size = os.path.getsize(default_model_path())
    tiny = rss("tiny", "auto")["rss"]
    print(f"GGUF file: {size / 1e6:.1f} MB; tiny preset process: {tiny / 1e6:.1f} MB RSS")
    for weights in ("auto", "float"):
        r = rss("smollm2-135m-instruct", weights)
        extra = r["rss"] - tiny
        print(f"weights={weights}: {r['rss'] / 1e6:.1f} MB RSS, {extra / 1e6:.1f} MB over tiny = "
              f"{extra / size:.2f}x the file ({r['weights']})")


if __name__ == "__main__":
    main()
