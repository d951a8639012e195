"""Constrained decoding in the engine: decode speed against unconstrained, mask time per
token, compile time, and coverage of a 60-schema set.

    PYTHONPATH=src python benchmarks/structured/bench.py [--model NAME] [--out FILE.json]
        [--tokens 128] [--repeats 3] [--skip-speed] [--skip-coverage]

Speed: decode tokens/s per request from its streamed outputs ((tokens - 1) / (last
output time - first output time)), greedy, at batch 1 and at batch 8 with half the
rows constrained, each against an all-unconstrained run of the same shape, in the
same process (median of --repeats). The constrained rows follow a schema (an array
of at least 40 objects) that keeps them going for --tokens tokens, like the
unconstrained rows (ignore_eos). The batch-8 run is also timed with the masks filled
inline instead of in the worker thread.
Compile: Constraint validation + llguidance compile for the model's tokenizer, for
new 20-property schemas (first use) and a repeated one (cached).
Coverage: each schema of schemas.coverage_set() is compiled, then asked for (greedy, a
short chat prompt; the constraint alone carries the schema) and the output checked with
jsonschema. Progress is printed per batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schemas import coverage_set, twenty_properties  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode import FastDecodeError  # noqa: E402
from fastdecode.engine import GenerationConfig  # noqa: E402
from fastdecode.sampling import SamplingParams  # noqa: E402
from fastdecode.structured import CACHE, Constraint, vocab_for  # noqa: E402

ITEM = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                         "city": {"type": "string", "maxLength": 24}},
        "required": ["name", "age", "city"], "additionalProperties": False}
LONG = {"type": "array", "items": ITEM, "minItems": 40}
TOPICS = ["people in a novel", "scientists", "football players", "painters", "chefs", "pilots", "poets",
          "astronauts"]


def chat(llm, text: str) -> list[int]:
    return llm.chat_prompt([{"role": "user", "content": text}])


def run_batch(llm, n: int, constrained: set, tokens: int) -> list[dict]:
    """n concurrent requests (rows in `constrained` follow LONG); per-request decode tokens/s."""
    eng = llm.engine
    stamps: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    for i in range(n):
        prompt = chat(llm, f"List {TOPICS[i % len(TOPICS)]} as JSON objects with name, age and city.")
        c = Constraint.json_schema(LONG) if i in constrained else None
        eng.submit(prompt, SamplingParams(temperature=0, constraint=c),
                   GenerationConfig(max_new_tokens=tokens, ignore_eos=c is None),
                   sink=lambda out, i=i: stamps[i].append((time.perf_counter(), len(out.token_ids))))
    while eng.has_work():
        eng.step()
    out = []
    for i, s in enumerate(stamps):
        s = [(t, k) for t, k in s if k]
        n_tok = sum(k for _, k in s)
        span = s[-1][0] - s[0][0]
        out.append({"constrained": i in constrained, "tokens": n_tok,
                    "decode_tok_s": (n_tok - s[0][1]) / span if span > 0 else 0.0})
    return out


def speed(llm, tokens: int, repeats: int) -> dict:
    masks = llm.engine.runner.masks
    run_batch(llm, 2, {1}, 16)  # warm: kernels, the grammar cache, the mask thread
    res = {}
    for name, n, constrained in (("batch1", 1, {0}), ("batch8_half", 8, set(range(1, 8, 2)))):
        rates = {"unconstrained": [], "constrained_run": [], "constrained_rows": [], "free_rows": []}
        mask_ms = []
        for _ in range(repeats):
            base = run_batch(llm, n, set(), tokens)
            rates["unconstrained"].append(statistics.mean(r["decode_tok_s"] for r in base))
            s0, b0 = masks.seconds, masks.built
            got = run_batch(llm, n, constrained, tokens)
            mask_ms.append(1000 * (masks.seconds - s0) / max(1, masks.built - b0))
            rates["constrained_run"].append(statistics.mean(r["decode_tok_s"] for r in got))
            rates["constrained_rows"].append(statistics.mean(r["decode_tok_s"] for r in got if r["constrained"]))
            free = [r["decode_tok_s"] for r in got if not r["constrained"]]
            if free:
                rates["free_rows"].append(statistics.mean(free))
        med = {k: round(statistics.median(v), 2) for k, v in rates.items() if v}
        med["ratio_constrained_rows"] = round(med["constrained_rows"] / med["unconstrained"], 3)
        med["ratio_whole_run"] = round(med["constrained_run"] / med["unconstrained"], 3)
        med["mask_ms_per_token"] = round(statistics.median(mask_ms), 3)
        res[name] = med
        print(name, med, flush=True)
    masks.overlap = False
    inline = [statistics.mean(r["decode_tok_s"] for r in run_batch(llm, 8, set(range(1, 8, 2)), tokens)
                              if r["constrained"]) for _ in range(repeats)]
    masks.overlap = True
    res["batch8_half"]["constrained_rows_inline_masks"] = round(statistics.median(inline), 2)
    print("batch8_half, masks filled inline:", res["batch8_half"]["constrained_rows_inline_masks"], flush=True)
    return res


def compile_times(llm) -> dict:
    vocab = vocab_for(llm.tokenizer)
    firsts = []
    for i in range(10):
        t0 = time.perf_counter()
        CACHE.matcher(Constraint.json_schema(twenty_properties(f"_c{i}")), vocab)
        firsts.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(100):
        CACHE.matcher(Constraint.json_schema(twenty_properties("_c9")), vocab)
    cached = (time.perf_counter() - t0) / 100
    res = {"first_median_ms": round(1000 * statistics.median(firsts), 3),
           "first_max_ms": round(1000 * max(firsts), 3), "cached_ms": round(1000 * cached, 4)}
    print("compile (20-property schema):", res, flush=True)
    return res


def coverage(llm, tokens: int) -> dict:
    vocab = vocab_for(llm.tokenizer)
    rows, runnable = [], []
    for name, schema in coverage_set():
        try:
            c = Constraint.json_schema(schema)
            CACHE.matcher(c, vocab)
            rows.append({"name": name, "compiled": True})
            runnable.append((name, schema, c))
        except FastDecodeError as e:
            rows.append({"name": name, "compiled": False, "error": str(e)})
    by_name = {r["name"]: r for r in rows}
    B = llm.max_batch_size
    for k in range(0, len(runnable), B):
        part = runnable[k:k + B]
        prompts = [chat(llm, f"Reply with JSON: an example of a {name.replace('-', ' ')}.") for name, _, _ in part]
        eng = llm.engine
        reqs = [eng.submit(p, SamplingParams(temperature=0, constraint=c), GenerationConfig(max_new_tokens=tokens))
                for p, (_, _, c) in zip(prompts, part)]
        while eng.has_work():
            eng.step()
        for (name, schema, _), r in zip(part, reqs):
            done = r.outputs[-1].completion
            entry = by_name[name]
            entry["finish_reason"] = done.finish_reason
            entry["text"] = done.text[:200]
            try:
                jsonschema.validate(json.loads(done.text), schema)
                entry["valid"] = True
            except (json.JSONDecodeError, jsonschema.ValidationError) as e:
                entry["valid"] = False
                entry["invalid"] = str(e).splitlines()[0][:120]
        print(f"  coverage: {min(k + B, len(runnable))}/{len(runnable)} generated", flush=True)
    meant = [r for r in rows if not r["name"].startswith("refused-")]
    refused = [r for r in rows if r["name"].startswith("refused-")]
    res = {"schemas": len(meant), "compiled": sum(r["compiled"] for r in meant),
           "valid": sum(bool(r.get("valid")) for r in meant),
           "refused_as_meant": sum(not r["compiled"] for r in refused), "refused_total": len(refused),
           "rows": rows}
    print(f"coverage: {res['compiled']}/{res['schemas']} compiled, {res['valid']}/{res['schemas']} outputs valid "
          f"(jsonschema); refused keywords: {res['refused_as_meant']}/{res['refused_total']} refused", flush=True)
    for r in rows:
        if not r.get("valid"):
            print("  ", r["name"], r.get("finish_reason"), r.get("error") or r.get("invalid"), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--coverage-tokens", type=int, default=192)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-coverage", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    llm = fastdecode.load(args.model)
    print("model:", llm.source, "| steps:", llm.compiled or llm.compile, flush=True)
    res = {"model": llm.source, "compiled": llm.compiled, "compile_times": compile_times(llm)}
    if not args.skip_speed:
        res["speed"] = speed(llm, args.tokens, args.repeats)
    if not args.skip_coverage:
        res["coverage"] = coverage(llm, args.coverage_tokens)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
