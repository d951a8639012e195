"""Resident memory after a load and a 2-token generate (benchmarks/real_memory.md).

    FASTDECODE_CACHE=/tmp/empty-cache python benchmarks/cold_rss.py MODEL   # a first (cold) load
    python benchmarks/cold_rss.py MODEL                                     # a warm one

Prints the load time, VmRSS after the step and the peak (VmHWM), then the anonymous and
file-backed shares (smaps_rollup) and whether the GGUF file is still mapped.
"""

import sys
import time

import fastdecode


def status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


t = time.perf_counter()
llm = fastdecode.load(sys.argv[1], compiled=None)
load_s = time.perf_counter() - t
llm.generate(["Hello"], max_new_tokens=2, temperature=0)
print(f"load {load_s:.1f} s, RSS after a step {status('VmRSS:') / 1e6:.0f} MB, peak {status('VmHWM:') / 1e6:.0f} MB")
with open("/proc/self/smaps_rollup") as f:
    rollup = dict(line.split(":", 1) for line in f.read().splitlines()[1:])
print({k: rollup[k].strip() for k in ("Rss", "Anonymous", "Pss_File")})
with open("/proc/self/maps") as f:
    print("GGUF still mapped:", sys.argv[1] in f.read())
