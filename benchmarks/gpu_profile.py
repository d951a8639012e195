#!/usr/bin/env python3
"""Where a compiled decode step's time goes on CUDA, at two cache capacities.

    python benchmarks/gpu_profile.py MODEL.gguf [MAX_SEQ_LEN ...]

For each max_seq_len (none: load()'s default), loads MODEL on CUDA in bfloat16 with
compile=decode, decodes 64 tokens after a 32-token prompt three times and reports
ms per step (median), then profiles 16 steps and prints the CUDA kernels that took
the most time, with their count per step. The portable attention spans the whole
cache buffer under a mask, so the capacity is what separates the two runs.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import fastdecode


def decode_ms(llm, prompt: list[int], n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = llm.generate([prompt], max_new_tokens=n, min_new_tokens=n, temperature=0)[0]
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return (dt - out.time_to_first_token_s) / (n - 1) * 1e3


def main(path: str, capacities: list[str]) -> None:
    prompt = list(range(100, 132))
    for cap in capacities or ["none"]:
        max_seq_len = None if cap == "none" else int(cap)
        llm = fastdecode.load(path, device="cuda", dtype="bfloat16", compile="decode", compiled=None,
                              max_seq_len=max_seq_len, max_batch_size=8)
        decode_ms(llm, prompt, 8)  # compiles
        ms = statistics.median(decode_ms(llm, prompt, 64) for _ in range(3))
        print(f"max_seq_len={llm.max_seq_len}: {ms:.2f} ms/step", flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            llm.generate([prompt], max_new_tokens=17, min_new_tokens=17, temperature=0)
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        events.sort(key=lambda e: e.self_device_time_total, reverse=True)
        total = sum(e.self_device_time_total for e in events) or 1
        print(f"  CUDA time over 16 steps and the prefill: {total / 1e3:.1f} ms, "
              f"{sum(e.count for e in events)} kernels")
        for e in events[:12]:
            print(f"  {e.self_device_time_total / total:6.1%} {e.count / 17:6.1f}/step  {e.key[:100]}")
        del llm
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__.split("\n\n")[1].strip())
    main(sys.argv[1], sys.argv[2:])
