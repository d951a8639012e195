"""The `generate` compile strategy: K decode steps per compiled call.

One graph holds K model steps and everything between them: per-row sampling
from a `SamplingBatch` built with every stage on (so requests with any
settings share the graph), randomness passed in as uniform draws taken
from each request's generator in the order the single-step path draws it,
the penalties' statistics, and the EOS ban before min_new_tokens. The engine
checks EOS, stop strings and lengths on the host after the call, and drops a
row's tokens after it finished; new requests join between calls.

A row's positions are clamped to the cache's last slot: after a row has
finished inside a chunk, the steps left write only into its own slot, which
no one reads until a new request has overwritten it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..sampling import SamplingBatch, SamplingParams, sample
from ..sampling.slots import SlotSampling
from .compiled import CompiledSteps, own_code, require_cache
from .steps import Steps

DEFAULT_CHUNK = 8


class ChunkDecoder:
    """chunk(token, pos, rows, uniform, batch, counts, seen, bias, eos, n_gen, min_new) ->
    tokens [K, B]: K decode steps for all rows in one call. Tensors in, tensors out:
    the engine's runner builds the inputs from its requests and applies the
    tokens. The engine uses it while some row has >= K tokens to go."""

    def __init__(self, steps: CompiledSteps, k: int = DEFAULT_CHUNK):
        self.steps, self.k = steps, k
        model = steps.model

        # The K model steps are inlined, but each of their blocks is a nested
        # compile region (model.TransformerBlock): the graph compiles one block
        # and calls it K * n_layers times, so compile time barely grows with K.
        def chunk_fn(token: Tensor, pos: Tensor, rows: Tensor, uniform: Tensor, greedy: Tensor, temperature: Tensor,
                     top_k: Tensor, top_p: Tensor, min_p: Tensor, repetition: Tensor, frequency: Tensor,
                     presence: Tensor, counts: Tensor, seen: Tensor, bias: Tensor, eos: Tensor, n_gen: Tensor,
                     min_new: Tensor):
            # token, pos, rows, n_gen, min_new: [B]; uniform: [K, B]; counts, seen: [slots, V]
            # (updated in place); bias, eos: [B, V].
            batch = SamplingBatch(greedy, temperature, top_k, top_p, min_p, repetition, frequency, presence)
            last = model.kv_cache.seq_len - 1  # static: the engine's cache
            out = []
            for i in range(k):
                p = (pos + i).clamp(max=last)[:, None]
                logits = model(token[:, None], p, rows=rows, last_only=True)[:, -1]  # [B, V]
                banned = eos & (n_gen + i < min_new)[:, None]
                token = sample(logits, batch, uniform[i], counts[rows], seen[rows], bias, banned)
                counts.index_put_((rows, token), torch.ones_like(token, dtype=counts.dtype), accumulate=True)
                seen.index_put_((rows, token), torch.ones_like(token, dtype=torch.bool))
                out.append(token)
            return torch.stack(out)  # [K, B]

        self._chunk = torch.compile(own_code(chunk_fn), **steps.compile_kwargs)

    def __call__(self, token: Tensor, pos: Tensor, rows: Tensor, uniform: Tensor, batch: SamplingBatch,
                 counts: Tensor, seen: Tensor, bias: Tensor, eos: Tensor, n_gen: Tensor, min_new: Tensor) -> Tensor:
        """token: each row's newest token, fed at pos; rows: their cache slots; uniform [K, B]:
        U[0, 1) draws (any values on greedy rows); batch: their settings (SamplingBatch with
        every stage on); counts, seen [slots, V]: penalty statistics, updated in place; bias,
        eos [B, V]; n_gen: tokens each row has, min_new: its min_new_tokens."""
        b = batch
        args = (token, pos, rows, uniform, b.greedy, b.temperature, b.top_k, b.top_p, b.min_p, b.repetition,
                b.frequency, b.presence, counts, seen, bias, eos, n_gen, min_new)
        # Dims marked dynamic: B everywhere, and K's neighbours never change.
        dyn = {i: (0,) for i in (0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 14, 15, 16, 17)}
        dyn[3] = (1,)
        with torch.inference_mode():
            return self.steps.call(self._chunk, *args, dynamic=dyn)

    def warmup(self) -> None:
        """Compile the chunk graph (it serves every batch size and setting) on slot 0,
        a greedy row, with sampling state of its own (the engine's is not touched)."""
        model = self.steps.model
        cache = require_cache(model)
        V, dev = model.args.vocab_size, model.device
        sampling = SlotSampling(cache.batch_size, V, dev)
        sampling.assign(0, SamplingParams(temperature=0), [0], frozenset())
        with torch.inference_mode():
            def t(values):
                return torch.tensor(values, dtype=torch.long, device=dev)

            rows = t([0])
            self(t([0]), t([1]), rows, torch.full((self.k, 1), 0.5, device=dev), sampling.batch([0], full=True),
                 sampling.counts, sampling.seen, sampling.bias[rows], sampling.eos[rows], t([1]), t([0]))


def make_generate_steps(model: torch.nn.Module, k: int = DEFAULT_CHUNK, **kwargs) -> Steps:
    steps = CompiledSteps(model, **kwargs)
    chunk = ChunkDecoder(steps, k)
    steps.extra_warmups.append(chunk.warmup)
    return Steps(step=steps.step, warmup=steps.warmup, chunk=chunk)
