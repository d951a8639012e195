"""Per-token cost of the sampling stages at a vocabulary size, on this machine's threads.

    PYTHONPATH=src .venv/bin/python benchmarks/sampling/sample_ops.py V [B]

Prints milliseconds per call (mean of 30 after one warm-up) for: the draw (an
exponential race's V draws with Tensor.exponential_, against one uniform a row
through sampling.draw_from), a whole-row sort against a top-k of 256, and `sample`
for four settings as the engine's eager path builds its batch (uniforms included).
The logits are N(0, 3^2), flatter than a trained model's, so top-p's first 256
candidates may not hold the nucleus there (it then widens).
"""

import sys
import time

import torch

from fastdecode.sampling import SamplingBatch, SamplingParams, draw_from, sample


def ms(f, n=30) -> float:
    f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e3


def main() -> None:
    V = int(sys.argv[1])
    B = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(0)) * 3
    g = torch.Generator().manual_seed(0)
    noise = torch.empty(B, V)
    probs = torch.softmax(logits, -1)
    print(f"V={V} B={B} threads={torch.get_num_threads()}")
    print(f"race: exponential_ noise      {ms(lambda: noise.exponential_(1.0, generator=g)):7.3f} ms")
    print(f"draw_from with a uniform      {ms(lambda: draw_from(probs, torch.rand(B, generator=g))):7.3f} ms")
    print(f"sort of whole rows            {ms(lambda: torch.sort(logits, -1, descending=True)):7.3f} ms")
    print(f"top-256                       {ms(lambda: torch.topk(logits, 256, -1)):7.3f} ms")
    for kw in ({"temperature": 0.8}, {"temperature": 0.8, "top_p": 0.95}, {"temperature": 0.8, "top_k": 40},
               {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}):
        batch = SamplingBatch.from_params([SamplingParams(**kw)] * B, V, "cpu")
        print(f"sample {kw}: {ms(lambda: sample(logits, batch, torch.rand(B, generator=g))):7.3f} ms")


if __name__ == "__main__":
    main()
