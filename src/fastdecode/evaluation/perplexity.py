"""Perplexity of a model on a text, measured the way llama.cpp's `llama-perplexity` is.

Method (the same for our engine and for llama.cpp, so the two numbers compare):

1. The text is tokenized once, without special tokens; when the tokenizer adds
   BOS (`tokenizer.add_bos`), BOS is prepended.
2. The token stream is cut into windows of `ctx` tokens, starting every
   `stride` tokens (default `stride = ctx`: back to back, as llama.cpp does). A
   tail shorter than a window is not used.
3. Each window is evaluated on its own, from an empty cache. When the tokenizer
   adds BOS, the window's first token is replaced by BOS (the model saw BOS at
   position 0 in training; that token is never scored).
4. In every window only the tokens after its first half are scored: position
   `j` (the token predicted from positions `0..j-1`) for `j > ctx // 2`, so each
   scored token has at least half a window of context. With overlapping windows
   (`stride < ctx`) a token already scored by the previous window is not scored
   again: positions `j >= ctx - stride` only. A window therefore scores
   `min(ctx - ctx // 2 - 1, stride)` tokens, the first window
   `ctx - ctx // 2 - 1` (255 at ctx=512, exactly llama.cpp's count).
5. The negative log-likelihood of each scored token is
   `-log_softmax(logits)[token]` computed in float64; perplexity is
   `exp(mean NLL)` over all scored tokens of all windows.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch

from ..engine.timing import now
from ..errors import FastDecodeError

DEFAULT_CTX = 512
MIN_CTX = 3  # the smallest window with a token after its first half to score
_ROWS_PER_REDUCTION = 1024  # bounds the float64 copy of the logits (rows x vocab)

Text = Union[str, Sequence[int]]
NllsFn = Callable[[list[int], int], torch.Tensor]  # window ids [T], score_from -> float64 NLLs [T - score_from]


@dataclass(frozen=True)
class Window:
    """One evaluation window: ids[start : start + ctx], scoring positions score_from..ctx-1."""

    start: int
    score_from: int


@dataclass(frozen=True)
class PerplexityResult:
    """What one engine measured on one text.

    ppl: exp(nll).
    nll: mean negative log-likelihood of the scored tokens, in nats.
    ppl_stderr: standard error of ppl (from the spread of the per-token NLLs, as llama.cpp reports it).
    tokens: how many tokens were scored.
    windows: how many windows were evaluated.
    ctx: window length in tokens.
    stride: tokens between the starts of consecutive windows.
    seconds: time spent evaluating and scoring the windows (not loading or tokenizing).
    window_nlls: mean NLL of each window, in order.
    engine: which implementation produced the logits.
    """

    ppl: float
    nll: float
    ppl_stderr: float
    tokens: int
    windows: int
    ctx: int
    stride: int
    seconds: float
    window_nlls: tuple[float, ...]
    engine: str = "fastdecode"


# -- the method ------------------------------------------------------------------------

def encode_text(tokenizer: Any, text: Text) -> list[int]:
    """Token ids of `text` (a str, or ids already) with BOS prepended when the tokenizer adds it."""
    if not isinstance(text, str):
        return [int(t) for t in text]
    ids = tokenizer.encode(text, add_special_tokens=False)
    if tokenizer.add_bos and tokenizer.bos_id is not None:
        ids = [tokenizer.bos_id, *ids]
    return ids


def check_ctx(ctx: Any, stride: Any, max_ctx: Optional[int]) -> int:
    """Validate ctx and stride; returns the stride (None means ctx)."""
    if (isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < MIN_CTX
            or (max_ctx is not None and ctx > max_ctx)):
        accepted = f"{MIN_CTX}..{max_ctx} for this model" if max_ctx is not None else f"an integer >= {MIN_CTX}"
        raise FastDecodeError(f"ctx={ctx!r} is out of range; accepted: {accepted}")
    if stride is None:
        return ctx
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= ctx:
        raise FastDecodeError(f"stride={stride!r} is out of range; accepted: 1..ctx ({ctx}) or none")
    return stride


def check_max_windows(max_windows: Any) -> None:
    """None (every window) or a positive count."""
    if max_windows is not None and (isinstance(max_windows, bool) or not isinstance(max_windows, int)
                                    or max_windows < 1):
        raise FastDecodeError(f"max_windows={max_windows!r} is out of range; accepted: an integer >= 1 or none")


def plan_windows(n_tokens: int, ctx: int, stride: int, max_windows: Optional[int] = None) -> list[Window]:
    """The windows of the method over `n_tokens` tokens (see the module docstring)."""
    if n_tokens < ctx:
        raise FastDecodeError(
            f"the text has {n_tokens} tokens, fewer than one window of ctx={ctx}; "
            f"use a longer text or a smaller ctx")
    check_max_windows(max_windows)
    count = (n_tokens - ctx) // stride + 1
    if max_windows is not None:
        count = min(count, max_windows)
    half = ctx // 2 + 1
    return [Window(k * stride, half if k == 0 else max(half, ctx - stride)) for k in range(count)]


def window_ids(ids: Sequence[int], window: Window, ctx: int, bos_id: Optional[int]) -> list[int]:
    """The ids a window evaluates: BOS (when given) replaces its first token."""
    out = list(ids[window.start:window.start + ctx])
    if bos_id is not None:
        out[0] = bos_id
    return out


def token_nlls(logits: torch.Tensor, ids: Sequence[int], score_from: int) -> torch.Tensor:
    """Float64 NLL of ids[score_from:], each predicted by the logits one position before it."""
    targets = torch.as_tensor(list(ids[score_from:]), dtype=torch.long)
    out = []
    for lo in range(0, len(targets), _ROWS_PER_REDUCTION):
        rows = logits[score_from - 1 + lo:score_from - 1 + lo + _ROWS_PER_REDUCTION]
        if rows.device.type == "mps":  # no float64 on MPS
            rows = rows.cpu()
        logp = torch.log_softmax(rows.to(torch.float64), dim=-1)
        tgt = targets[lo:lo + len(rows)].to(logp.device)
        out.append(-logp.gather(-1, tgt[:, None])[:, 0].cpu())
    return torch.cat(out)


def score_windows(ids: Sequence[int], windows: Sequence[Window], ctx: int, bos_id: Optional[int],
                  nlls_fn: NllsFn, *, engine: str, stride: int, device: torch.device = torch.device("cpu"),
                  on_window: Optional[Callable[[], None]] = None) -> PerplexityResult:
    """Evaluate every window with `nlls_fn` and reduce the NLLs (shared by both engines)."""
    t0 = now(device)
    per_window = []
    for w in windows:
        wids = window_ids(ids, w, ctx, bos_id)
        per_window.append(nlls_fn(wids, w.score_from))
        if on_window is not None:
            on_window()
    seconds = now(device) - t0
    return summarize(per_window, ctx=ctx, stride=stride, seconds=seconds, engine=engine)


def summarize(per_window: Sequence[torch.Tensor], *, ctx: int, stride: int, seconds: float,
              engine: str) -> PerplexityResult:
    nlls = torch.cat(list(per_window))
    n = len(nlls)
    mean = float(nlls.mean())
    # llama.cpp's uncertainty: the standard error of the mean NLL, carried through exp().
    var = float((nlls * nlls).mean()) - mean * mean
    stderr = math.sqrt(var / (n - 1)) * math.exp(mean) if n > 1 and var > 0 else 0.0
    return PerplexityResult(
        ppl=math.exp(mean), nll=mean, ppl_stderr=stderr, tokens=n, windows=len(per_window), ctx=ctx,
        stride=stride, seconds=seconds, window_nlls=tuple(float(w.mean()) for w in per_window), engine=engine)


# -- our engine ------------------------------------------------------------------------

def perplexity(llm: Any, text: Text, *, ctx: int = DEFAULT_CTX, stride: Optional[int] = None,
               max_windows: Optional[int] = None, kv_cache: bool = False,
               on_window: Optional[Callable[[], None]] = None) -> PerplexityResult:
    """Perplexity of `llm` on `text` (a str, or token ids with BOS already handled).

    Uses the cache-free reference forward `llm.model(tokens, None)`, one window
    at a time, in inference mode. ctx: window length (MIN_CTX..llm.max_seq_len);
    stride: tokens between window starts, 1..ctx, None for ctx (llama.cpp's
    non-overlapping windows); max_windows: evaluate only the first ones;
    kv_cache: instead, send each window to the engine as a request with prompt
    logprobs, so it is prefilled as generation prefills, through the engine's KV
    cache in the dtype load() gave it (`kv_dtype`; q8_0: quantized), and
    float32 logprobs;
    on_window: called after each window (progress display)."""
    stride = check_ctx(ctx, stride, llm.max_seq_len)
    ids = encode_text(llm.tokenizer, text)
    bad = next((t for t in ids if not 0 <= t < llm.args.vocab_size), None)
    if bad is not None:
        raise FastDecodeError(f"token id {bad} is outside the vocabulary [0, {llm.args.vocab_size})")
    windows = plan_windows(len(ids), ctx, stride, max_windows)
    bos = _window_bos(llm.tokenizer)
    device = llm.device

    if kv_cache:
        # Through the engine, as a request with prompt logprobs: prefilled in chunks through
        # its KV cache, in the dtype load() gave it, and never reusing a cached prefix.
        def nlls_fn(wids: list[int], score_from: int) -> torch.Tensor:
            (c,) = llm.generate([wids], max_new_tokens=1, temperature=0, prompt_logprobs=0)
            return torch.tensor([-c.prompt_logprobs[i].logprob for i in range(score_from, len(wids))],
                                dtype=torch.float64)
    else:
        def nlls_fn(wids: list[int], score_from: int) -> torch.Tensor:
            tokens = torch.tensor([wids], dtype=torch.long, device=device)
            return token_nlls(llm.model(tokens, None)[0], wids, score_from)

    with torch.inference_mode():
        return score_windows(ids, windows, ctx, bos, nlls_fn, engine="fastdecode", stride=stride,
                             device=device, on_window=on_window)


def _window_bos(tokenizer: Any) -> Optional[int]:
    return tokenizer.bos_id if tokenizer.add_bos else None


# -- llama.cpp on the same token ids ---------------------------------------------------------

def llama_cpp_problem() -> Optional[str]:
    """Why llama-cpp-python cannot run here, or None: not installed, or installed without a
    library it can load (its import then raises an OSError such as FileNotFoundError)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama_cpp is not installed (pip install llama-cpp-python)"
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:
        return f"llama_cpp is installed but does not load: {type(e).__name__}: {e}"
    return None


def llama_cpp_available() -> bool:
    return llama_cpp_problem() is None


# kv_dtype names -> ggml type ids (ggml.h's enum ggml_type), for llama.cpp's type_k / type_v
GGML_KV_TYPES = {"float32": 0, "float16": 1, "q8_0": 8, "bfloat16": 30}


def llama_cpp_perplexity(model_path: str, tokenizer: Any, text: Text, *, ctx: int = DEFAULT_CTX,
                         stride: Optional[int] = None, max_windows: Optional[int] = None,
                         n_threads: Optional[int] = None, kv_dtype: Optional[str] = None,
                         on_window: Optional[Callable[[], None]] = None) -> PerplexityResult:
    """The same measurement with llama.cpp's logits (llama-cpp-python) for the GGUF file
    `model_path`. The text is tokenized with `tokenizer` (ours), so both engines score
    identical ids in identical windows; only the forward pass differs.

    kv_dtype: None keeps llama-cpp-python's KV cache defaults; "float32", "float16",
    "bfloat16" or "q8_0" stores K and V in that type (type_k/type_v), with flash
    attention on, which llama.cpp needs for a quantized V cache."""
    if kv_dtype is not None and kv_dtype not in GGML_KV_TYPES:
        raise FastDecodeError(f"unknown kv_dtype {kv_dtype!r} for llama.cpp; accepted: "
                              f"{', '.join(GGML_KV_TYPES)} or none")
    problem = llama_cpp_problem()
    if problem:
        raise FastDecodeError(problem)
    import llama_cpp
    if not str(model_path).endswith(".gguf"):
        raise FastDecodeError(f"llama.cpp needs a .gguf model file, not {str(model_path)!r}")
    ids = encode_text(tokenizer, text)
    stride = check_ctx(ctx, stride, None)  # the caller knows the model's limit; llama.cpp has no cheaper check
    windows = plan_windows(len(ids), ctx, stride, max_windows)
    # a window is one batch; n_threads (None: llama-cpp-python's defaults) covers batch evaluation too
    cache_types: dict[str, Any] = {}
    if kv_dtype is not None:
        cache_types = {"type_k": GGML_KV_TYPES[kv_dtype], "type_v": GGML_KV_TYPES[kv_dtype], "flash_attn": True}
    model = llama_cpp.Llama(model_path=str(model_path), n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, logits_all=True,
                            n_threads=n_threads, n_threads_batch=n_threads, verbose=False, **cache_types)
    try:
        n_vocab = model.n_vocab()
        bad = next((t for t in ids if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise FastDecodeError(f"token id {bad} is outside llama.cpp's vocabulary ({n_vocab} ids) "
                                  f"of {model_path}")

        def nlls_fn(wids: list[int], score_from: int) -> torch.Tensor:
            model.reset()  # n_tokens = 0: eval() drops the old KV entries and starts at position 0
            model.eval(wids)
            # a view of llama-cpp-python's buffer: reduced before the next eval() overwrites it
            return token_nlls(torch.from_numpy(model.scores[:len(wids)]), wids, score_from)

        return score_windows(ids, windows, ctx, _window_bos(tokenizer), nlls_fn, engine="llama.cpp",
                             stride=stride, on_window=on_window)
    finally:
        model.close()  # frees the context and weights now, not at garbage collection
