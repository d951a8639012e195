"""torch.profiler table of eager batch-1 decode steps on the default model's shapes.

    .venv/bin/python benchmarks/compile_profile.py [--gemv]  > benchmarks/compile_profile.txt
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

import fastdecode
from fastdecode.quant.transform import set_gemv

llm = fastdecode.load("random-smollm2-135m", max_batch_size=1)
if "--gemv" in sys.argv:
    set_gemv(llm.model, True)
prompt = [[7 + i for i in range(16)]]
llm.generate(prompt, max_new_tokens=4, temperature=0, ignore_eos=True)  # warm-up
with profile(activities=[ProfilerActivity.CPU]) as prof:
    llm.generate(prompt, max_new_tokens=16, temperature=0, ignore_eos=True)
print(f"gemv={'--gemv' in sys.argv}; 1 prefill (16 tokens) + 15 decode steps, batch 1, fp32")
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
