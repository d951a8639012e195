"""`fastdecode perplexity [--config FILE] [key=value ...]`: a model's perplexity on a text.

The measurement itself (windows, scoring, llama.cpp on the same ids) lives in
`evaluation/perplexity.py`; this file reads settings and the text, and reports.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Optional

from ..errors import FastDecodeError
from ..evaluation.perplexity import (DEFAULT_CTX, MIN_CTX, PerplexityResult, check_ctx, check_max_windows,
                                     encode_text, llama_cpp_available, llama_cpp_perplexity, llama_cpp_problem,
                                     perplexity, plan_windows)
from .command import run_command
from .keys import ModelKeys, decode_utf8, read_user_file
from .progress import progress

DEFAULT_TEXT_NAME = "Alice's Adventures in Wonderland, chapters I-II"

USAGE = f"""usage: fastdecode perplexity [--config FILE] [--json] [key=value ...]

Measure the model's perplexity on a UTF-8 text file, the way llama.cpp's
llama-perplexity does: the tokens are cut into windows of ctx tokens and only
the second half of each window is scored, so every scored token has at least
ctx/2 tokens of context. Lower is better; compare numbers only for the same
text, ctx and tokenizer. With llama.cpp installed (llama-cpp-python) and a
.gguf model, llama.cpp scores the same token ids in the same windows.

The built-in text, used by default, is {DEFAULT_TEXT_NAME} (Lewis Carroll, 1865).

keys (defaults shown):
"""


@dataclass
class PerplexitySettings(ModelKeys):
    text: Optional[str] = field(default=None, metadata={
        "help": f"UTF-8 text file to score; none is the built-in text, {DEFAULT_TEXT_NAME}"})
    ctx: int = field(default=DEFAULT_CTX, metadata={
        "help": f"window length in tokens ({MIN_CTX} up to the model's context length)"})
    stride: Optional[int] = field(default=None, metadata={
        "help": "tokens between window starts, 1..ctx; none is ctx (back-to-back windows, as llama.cpp)"})
    max_windows: Optional[int] = field(default=None, metadata={
        "help": "evaluate only the first N windows; none evaluates all"})
    llama_cpp: Optional[bool] = field(default=None, metadata={
        "help": "also score with llama.cpp (llama-cpp-python) on the same .gguf file and token ids; "
                "none does so when it is installed and the model is a .gguf file"})
    kv_dtype: Optional[str] = field(default=None, metadata={
        "help": "none scores with the cache-free forward (K/V as computed); auto, float32, float16, bfloat16 or "
                "q8_0, as load(kv_dtype=...), prefills each window through a KV cache of that dtype, as "
                "generation does, and llama.cpp (with flash attention) stores its K/V cache in the same type"})
    json: bool = field(default=False, metadata={"help": "print one JSON object instead of one line per engine"})

    def __post_init__(self) -> None:
        # what needs no model; ctx's upper bound and the text's length are checked once it is loaded
        check_ctx(self.ctx, self.stride, None)
        check_max_windows(self.max_windows)


def read_text(path: Optional[str]) -> str:
    """The text to score: the file at `path` (strict UTF-8) or the built-in one."""
    if path is None:
        return (resources.files("fastdecode") / "data" / "perplexity.txt").read_text(encoding="utf-8")
    text = decode_utf8(read_user_file(path, "text"), path, "text")
    text = text.removeprefix("\ufeff")  # a byte order mark is not part of the text
    if not text.strip():
        raise FastDecodeError(f"text {path!r} is empty")
    return text


def format_line(r: PerplexityResult, reference: Optional[PerplexityResult] = None) -> str:
    rate = r.tokens / r.seconds if r.seconds > 0 else float("inf")
    line = (f"{r.engine:<10}  ppl {r.ppl:.4f} +/- {r.ppl_stderr:.4f}  tokens scored {r.tokens} "
            f"in {r.windows} windows  time {r.seconds:.2f} s ({rate:.0f} tokens/s)")
    if reference is not None:
        line += f"  ({(r.ppl / reference.ppl - 1) * 100:+.2f}% vs {reference.engine})"
    return line


def _wants_llama_cpp(s: PerplexitySettings, source: str) -> bool:
    is_gguf = source.endswith(".gguf")
    if s.llama_cpp is None:
        return is_gguf and llama_cpp_available()
    if s.llama_cpp and not is_gguf:
        raise FastDecodeError(f"llama_cpp=true needs a .gguf model; {source!r} is not one")
    if s.llama_cpp and (problem := llama_cpp_problem()):
        raise FastDecodeError(f"llama_cpp=true but {problem}")
    return s.llama_cpp


def run(s: PerplexitySettings) -> int:
    from ..api.build import load

    text = read_text(s.text)  # bad files fail before the model loads
    with progress(f"loading {s.model or 'the default model'}"):
        # The cache-free forward scores windows: no package needed.
        llm = load(s.model, device=s.device, dtype=s.dtype, weights=s.weights, compiled=None,
                   **({} if s.kv_dtype is None else {"kv_dtype": s.kv_dtype}))  # load() checks the value
    use_llama_cpp = _wants_llama_cpp(s, llm.source)
    ids = encode_text(llm.tokenizer, text)  # one tokenization: both engines score these ids
    # ctx against the model's limit and the text's length, before any window runs
    kv = None if s.kv_dtype is None else llm.model.kv_dtype_name  # "auto" resolved by load()
    n_windows = len(plan_windows(len(ids), s.ctx, check_ctx(s.ctx, s.stride, llm.max_seq_len),
                                 s.max_windows))
    results = []
    with progress("fastdecode: scoring windows", total=n_windows) as bar:
        results.append(perplexity(llm, ids, ctx=s.ctx, stride=s.stride, max_windows=s.max_windows,
                                  kv_cache=kv is not None, on_window=bar.update))
    if use_llama_cpp:
        with progress("llama.cpp: scoring windows", total=n_windows) as bar:
            results.append(llama_cpp_perplexity(llm.source, llm.tokenizer, ids, ctx=s.ctx, stride=s.stride,
                                                max_windows=s.max_windows, kv_dtype=kv, on_window=bar.update))
    weights = llm.weights_summary  # what load() made of the checkpoint's tensor types
    if s.json:
        report = {"model": llm.source, "weights": weights, "kv_dtype": kv,  # null: the cache-free forward
                  "text": s.text,  # text null: the built-in one
                  "text_tokens": len(ids), "results": [asdict(r) for r in results]}
        print(json.dumps(report))
    else:
        print(f"model {llm.source} (weights: {weights}), text {s.text or DEFAULT_TEXT_NAME}: {len(ids)} tokens, "
              f"ctx {s.ctx}, KV {kv or 'none (cache-free forward)'}", file=sys.stderr)
        for r in results:
            print(format_line(r, results[0] if r is not results[0] else None))
    return 0


def main(argv: list[str]) -> int:
    """Run by `fastdecode perplexity`; --json as the other commands spell it, same as json=true."""
    return run_command(argv, PerplexitySettings, USAGE, run, flags={"--json": "json=true"})
