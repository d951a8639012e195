"""The server load of `serve_load.py` (prompts of 40-200 random words, 64 greedy tokens, EOS
ignored) through `LLM.generate` instead of HTTP, with the engine's decode and prefill calls
timed: 6 requests one at a time (N = 1), then 32 at once with 16 slots (N = 16).

    python benchmarks/serve/engine_like_serve.py

Prints tokens/s for both and where the engine's time went (benchmarks/serve/README.md).
"""

import random
import time

import fastdecode

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches "
         "near an old river bank full of bright stones and tall green reeds").split()


class Timed:
    """The runner's decode and prefill calls, timed (wrapped for this measurement only)."""

    def __init__(self, runner):
        self.reset()
        decode, prefill = runner.decode, runner.prefill

        def timed_decode(reqs, drafts):
            t = time.perf_counter()
            out = decode(reqs, drafts)
            self.spent["decode"] += time.perf_counter() - t
            self.spent["nd"] += 1
            self.spent["rows"] += len(reqs)
            return out

        def timed_prefill(reqs, n):
            t = time.perf_counter()
            out = prefill(reqs, n)
            self.spent["prefill"] += time.perf_counter() - t
            self.spent["np"] += 1
            self.spent["ptok"] += n * len(reqs)
            return out

        runner.decode, runner.prefill = timed_decode, timed_prefill

    def reset(self) -> None:
        self.spent = {"decode": 0.0, "prefill": 0.0, "nd": 0, "np": 0, "rows": 0, "ptok": 0}


def main() -> None:
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 200))) for _ in range(32)]
    llm = fastdecode.load(max_batch_size=16)
    timed = Timed(llm.engine.runner)
    gen = dict(max_new_tokens=64, temperature=0, ignore_eos=True)
    llm.generate(prompts[:2], **{**gen, "max_new_tokens": 8})  # warm-up

    timed.reset()
    t = time.perf_counter()
    n1 = sum(len(llm.generate([p], **gen)[0].token_ids) for p in prompts[:6])
    w1 = time.perf_counter() - t
    one = dict(timed.spent)

    timed.reset()
    t = time.perf_counter()
    n16 = sum(len(c.token_ids) for c in llm.generate(prompts, **gen))
    w16 = time.perf_counter() - t
    print(f"N=1: {n1 / w1:.1f} tok/s wall {w1:.2f}s {one}")
    print(f"N=16: {n16 / w16:.1f} tok/s wall {w16:.2f}s {timed.spent}  ratio {n16 / w16 / (n1 / w1):.2f}")


if __name__ == "__main__":
    main()
