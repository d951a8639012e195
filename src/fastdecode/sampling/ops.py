"""Everything that turns a batch of logits into next tokens, row by row.

Each row has its own settings, carried as tensors in a `SamplingBatch`, so
requests with different settings share one step and one compiled graph. The
functions are pure tensor code with no host syncs (but eager top-p, which reads
whether its candidates hold the nucleus); randomness comes in as precomputed
uniform draws, one per row and token, from each request's own generator.

Order of operations (as in Hugging Face and vLLM): penalties, logit bias, bans
(EOS before min_new_tokens, and tokens a row's grammar does not allow), temperature,
top-k, softmax, top-p, min-p, then the draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..kernels import kernels_loaded
from .params import GREEDY_BELOW, SamplingParams

# float32's largest and smallest normal values: settings are held within them (a temperature of
# 1e300 is inf in float32, and -inf / inf is NaN; a repetition penalty of 1e-300 is 0).
_F32 = torch.finfo(torch.float32)
# Penalized logits are held within +-this: over the smallest sampled temperature (GREEDY_BELOW)
# they stay finite, logit_bias included, so softmax never meets inf - inf.
_LOGIT_BOUND = _F32.max * GREEDY_BELOW / 2


@dataclass
class SamplingBatch:
    """The settings of B rows. Greedy rows have temperature 1 here (unused);
    top_k is V for rows without a limit.

    The `use_*` flags say which stages some row needs; eager code skips the
    others (each skipped stage is an identity for every row). Compiled code
    builds its batch with `full=True`, so one graph serves every combination.
    """

    greedy: Tensor  # [B] bool
    temperature: Tensor  # [B] float32
    top_k: Tensor  # [B] int64
    top_p: Tensor  # [B] float32
    min_p: Tensor  # [B] float32
    repetition: Tensor  # [B] float32
    frequency: Tensor  # [B] float32
    presence: Tensor  # [B] float32
    all_greedy: bool = False
    any_greedy: bool = True  # False: no row needs the argmax (eager batches of sampled rows)
    use_top_k: bool = True
    use_top_p: bool = True
    use_min_p: bool = True
    use_penalties: bool = True
    # The largest top_k among the rows that set one, known on the host; None (compiled
    # graphs): unknown, the masks sort whole rows. With it, eager masks look at the
    # rows' best candidates first (top_k_mask, top_p_mask).
    k_limit: Optional[int] = None

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], vocab_size: int, device: torch.device | str,
                    full: bool = False) -> "SamplingBatch":
        def t(values, dtype=torch.float32):
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            greedy=t([p.greedy for p in params], torch.bool),
            temperature=t([1.0 if p.greedy else min(p.temperature, _F32.max) for p in params]),
            top_k=t([vocab_size if p.top_k is None else min(p.top_k, vocab_size) for p in params], torch.long),
            top_p=t([p.top_p for p in params]), min_p=t([p.min_p for p in params]),
            repetition=t([min(max(p.repetition_penalty, _F32.tiny), _F32.max) for p in params]),
            frequency=t([p.frequency_penalty for p in params]), presence=t([p.presence_penalty for p in params]),
            all_greedy=not full and all(p.greedy for p in params),
            any_greedy=full or any(p.greedy for p in params),
            use_top_k=full or any(p.top_k is not None and not p.greedy for p in params),
            use_top_p=full or any(p.top_p < 1 and not p.greedy for p in params),
            use_min_p=full or any(p.min_p > 0 and not p.greedy for p in params),
            use_penalties=full or any(p.uses_penalties for p in params),
            k_limit=None if full else max((min(p.top_k, vocab_size) for p in params
                                           if p.top_k is not None and not p.greedy), default=vocab_size))


# -- masks, each written to match its definition; k, p: a number or [B] ---------

def _col(x, ref: Tensor) -> Tensor:
    return torch.as_tensor(x, dtype=ref.dtype if ref.is_floating_point() else None, device=ref.device).reshape(-1, 1)


def best_of(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """torch.topk(x, k, dim=-1) of rows x [B, V] (values descending, and their indices),
    found among the chunks that hold them: the k largest elements lie in the k chunks
    with the largest maxima (an element of another chunk is at most the k-th largest
    chunk maximum, which k elements reach). One pass over the row for the chunks' maxima,
    then topk over k chunks: 0.12-0.27 against 0.75-0.83 ms a row of 262,144 logits for
    k = 40-256 on two cores (torch.topk walks the whole row in one thread a row). The
    same values; among equal values the indices may be others of them. (CPU rows only:
    a GPU's topk has no such cost.)"""
    B, V = x.shape
    C = 64 if k <= 64 else 32  # chunk length
    n = V // C
    if n < 4 * k or x.device.type != "cpu":  # the chunks would hold most of the row
        return torch.topk(x, k, dim=-1)
    chunks = x[:, :n * C].reshape(B, n, C)
    chosen = torch.topk(chunks.amax(dim=-1), k, dim=-1, sorted=False).indices  # [B, k]
    ids = (chosen[:, :, None] * C + torch.arange(C, device=x.device)).view(B, k * C)
    values = chunks.gather(1, chosen[:, :, None].expand(B, k, C)).view(B, k * C)
    if n * C < V:  # the tail past the last whole chunk stays a candidate
        ids = torch.cat([ids, torch.arange(n * C, V, device=x.device).expand(B, V - n * C)], dim=1)
        values = torch.cat([values, x[:, n * C:]], dim=1)
    best, at = torch.topk(values, k, dim=-1)
    return best, ids.gather(1, at)


def top_k_mask(logits: Tensor, k, k_limit: Optional[int] = None) -> Tensor:
    """True where a token is NOT among the k largest logits of its row (ties with the k-th are kept).

    k_limit: the largest k of the rows that have one (host int; rows without a limit
    have k >= V); the k-th values then come from the best k_limit (`best_of`) rather than
    a sort of the whole row (Gemma 3's 262,144 logits: 0.1 against 18 ms on two cores)."""
    V = logits.shape[-1]
    k = torch.as_tensor(k, device=logits.device).clamp(1, V).reshape(-1, 1)
    if k_limit is None or k_limit >= V:
        kth = torch.sort(logits, dim=-1, descending=True).values.gather(-1, (k - 1).expand(logits.shape[0], 1))
        return logits < kth
    best = best_of(logits, max(k_limit, 1))[0]  # [B, k_limit], descending
    kth = best.gather(-1, (k.clamp(max=best.shape[-1]) - 1).expand(logits.shape[0], 1))
    return (logits < kth) & (k < V)  # rows without a limit keep everything


# Top-p looks for each row's nucleus among its best candidates first, widening to
# the whole row only where they hold less than p of the mass.
_NUCLEUS_CANDIDATES = (256, 4096)


def top_p_mask(probs: Tensor, p, k_limit: Optional[int] = None) -> Tensor:
    """True where a token is outside its row's nucleus: the smallest set of most
    likely tokens whose total probability reaches p. The most likely token is
    always kept, and rows with p >= 1 keep everything.

    k_limit (eager only: it reads the candidates' mass on the host): look among each
    row's best min(k_limit, 256), then 4,096 tokens before sorting whole rows. The
    running sums over the best m are those of the whole sorted row, so the mask is the
    same (up to which of equal probabilities the sort puts first, which no sort fixes)."""
    p = _col(p, probs)
    V = probs.shape[-1]
    if k_limit is not None:
        for m in sorted({min(k_limit, c) for c in _NUCLEUS_CANDIDATES}):
            if m >= V:
                break
            best, order = best_of(probs, m)  # descending
            mass_before = torch.cumsum(best, dim=-1) - best
            if bool(((mass_before[:, -1] + best[:, -1] >= p[:, 0]) | (p[:, 0] >= 1)).all()):
                drop_best = _nucleus_drop(best, mass_before, p)
                # Everything past the best m lies outside a p < 1 row's nucleus.
                return (p < 1).expand(probs.shape).scatter(-1, order, drop_best)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, _nucleus_drop(sorted_probs, mass_before, p))


def _nucleus_drop(sorted_probs: Tensor, mass_before: Tensor, p: Tensor) -> Tensor:
    """Of probabilities sorted in descending order, those past the nucleus of p [B, 1]."""
    # A mask, not an in-place write, keeps compiled graphs free of a size-1 specialization.
    first = torch.arange(sorted_probs.shape[-1], device=sorted_probs.device) == 0
    return (mass_before >= p) & ~first & (p < 1)  # rounding must not drop a p=1 row's tail


def min_p_mask(probs: Tensor, min_p) -> Tensor:
    """True where a token's probability is below min_p times its row's largest."""
    return probs < _col(min_p, probs) * probs.amax(dim=-1, keepdim=True)


# -- penalties ------------------------------------------------------------------------------

def apply_penalties(logits: Tensor, batch: SamplingBatch, counts: Tensor, seen: Tensor) -> Tensor:
    """counts: [B, V] occurrences in the output so far; seen: [B, V] tokens in
    prompt or output. A row with neutral settings is left exactly as it was."""
    r = batch.repetition[:, None]
    # A penalty far from 1 (1e-40: 30 / 1e-40) would make a finite logit infinite, and NaN
    # after the temperature: it stays within _LOGIT_BOUND.
    penalized = torch.where(logits > 0, logits / r, logits * r).clamp(-_LOGIT_BOUND, _LOGIT_BOUND)
    logits = torch.where(seen, penalized, logits)
    return (logits - batch.frequency[:, None] * counts
            - batch.presence[:, None] * (counts > 0).to(logits.dtype))


# -- the draw ------------------------------------------------------------------------------

def draw_from(weights: Tensor, u: Tensor) -> Tensor:
    """One index per row of weights [B, V] (>= 0, any positive total), index i with
    probability w_i / sum(w), given u [B] uniform in [0, 1): the first i whose running
    sum exceeds u x the total. One uniform a row, where an exponential race
    (argmax w / E) needs V draws: 0.25 against 4.5-4.8 ms a row of Gemma 3's 262,144 tokens
    on two cores, with Tensor.exponential_. A weight too small to move the float32
    running sum (below ~1e-7 of the total) is never drawn."""
    c = torch.cumsum(weights, dim=-1)  # non-decreasing (CPU accumulates in float64)
    total = c[:, -1:]
    # Strictly below the total, so that the search stops at a token of positive weight.
    target = torch.minimum(u[:, None].to(c.dtype) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(c, target, right=True)[:, 0].clamp_(max=weights.shape[-1] - 1)


def first_max(x: Tensor) -> Tensor:
    """[B, V] -> [B] int64: each row's index of its first largest value, as argmax(-1) (a NaN
    counting as largest). On CPU with the kernels loaded, their vectorized op (torch 2.13, V =
    49152: 8-9 against torch.max's 54 us a row, 63 against 484-532 us for 16 rows, 2% of a 16-row
    decode step of the default model; benchmarks/batch_tiles/step_overheads.py); elsewhere
    torch.max's reduction, 2.6-3.1x faster than argmax's."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.shape[-1] and kernels_loaded():
        return torch.ops.fastdecode.first_max(x)
    return x.max(dim=-1).indices


def logits_to_probs(logits: Tensor, batch: SamplingBatch) -> Tensor:
    """[B, V] logits (penalties applied) -> [B, V] filtered, normalized probabilities."""
    logits = logits.float() / batch.temperature[:, None]
    if batch.use_top_k:
        logits = logits.masked_fill(top_k_mask(logits, batch.top_k, batch.k_limit), -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if batch.use_top_p:
        probs = probs.masked_fill(top_p_mask(probs, batch.top_p, batch.k_limit), 0.0)
    if batch.use_min_p:
        probs = probs.masked_fill(min_p_mask(probs, batch.min_p), 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def adjust(logits: Tensor, batch: SamplingBatch, counts: Optional[Tensor] = None, seen: Optional[Tensor] = None,
           bias: Optional[Tensor] = None, banned: Optional[Tensor] = None,
           allowed: Optional[Tensor] = None) -> Tensor:
    """The logits a row is sampled from, before temperature: [B, V] float32.
    counts/seen: penalty state (None skips penalties); bias: [B, V] added to the
    logits; banned: [B, V] bool, tokens that may not be picked now (EOS before
    min_new_tokens); allowed: [B, V] bool, the tokens each row's grammar allows
    (all True on rows without one)."""
    logits = logits.float()
    if counts is not None and batch.use_penalties:
        logits = apply_penalties(logits, batch, counts, seen)
    if bias is not None:
        logits = logits + bias
    if banned is not None:
        logits = logits.masked_fill(banned, -math.inf)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, -math.inf)
    return logits


def sample(logits: Tensor, batch: SamplingBatch, uniform: Optional[Tensor] = None,
           counts: Optional[Tensor] = None, seen: Optional[Tensor] = None,
           bias: Optional[Tensor] = None, banned: Optional[Tensor] = None,
           allowed: Optional[Tensor] = None) -> Tensor:
    """Pick one token per row. logits: [B, V]; uniform: [B] draws in [0, 1) (any
    values on greedy rows; may be None when all rows are greedy); the other
    arguments as `adjust`'s. Returns [B] int64."""
    logits = adjust(logits, batch, counts, seen, bias, banned, allowed)
    if batch.all_greedy:
        return first_max(logits)
    return greedy_or_drawn(logits, batch, draw_from(logits_to_probs(logits, batch), uniform))


def greedy_or_drawn(logits: Tensor, batch: SamplingBatch, drawn: Tensor) -> Tensor:
    """drawn [B], with the greedy rows' argmax of logits [B, V] in their place (no argmax
    at all when no row of the batch is greedy)."""
    return torch.where(batch.greedy, first_max(logits), drawn) if batch.any_greedy else drawn


def token_logprobs(logits: Tensor, tokens: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """The raw model distribution's log-probabilities: of `tokens` [B], and the
    n most likely per row. Returns ([B], [B, n] values, [B, n] ids)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logp, n, dim=-1)
    return logp.gather(-1, tokens[:, None])[:, 0], top.values, top.indices
