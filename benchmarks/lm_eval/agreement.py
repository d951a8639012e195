"""Issue 27's agreement target against references nobody here wrote: the multiple-choice task's
loglikelihoods (tasks/mc.jsonl, scored as lm-eval scores them: context, then " " + choice)
from fastdecode's `prompt_logprobs`, from transformers loading the same GGUF (it dequantizes to
float32), and from llama.cpp (llama-cpp-python, logits of every position) on the same file.

    FASTDECODE_NO_PACKAGE=1 .venv/bin/python benchmarks/lm_eval/agreement.py --out agreement.json

Reported per choice, in nats per continuation token: |ours - transformers| with weights=float
(target <= 0.01), and with the file's quantized weights next to |llama.cpp - transformers|
(target: no further from transformers than llama.cpp is), and the two quantized engines
against each other.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from pathlib import Path

import torch

TASKS = Path(__file__).parent / "tasks"


def pairs() -> list[tuple[str, str]]:
    out = []
    for line in (TASKS / "mc.jsonl").read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        out += [(doc["question"], " " + c) for c in doc["choices"]]
    return out


def split_ids(tokenizer, ctx: str, cont: str) -> tuple[list[int], int]:
    """lm-eval's split: the context's ids, then the rest of context+continuation's."""
    whole = tokenizer.encode(ctx + cont, add_special_tokens=False)
    n = len(tokenizer.encode(ctx, add_special_tokens=False))
    return whole, n


def fastdecode_scores(path: str, weights: str, items) -> list[list[float]]:
    import fastdecode

    llm = fastdecode.load(path, weights=weights, max_seq_len=256, max_batch_size=8)
    prompts = [ids for ids, _ in items]
    outs = llm.generate(prompts, max_new_tokens=1, temperature=0, prompt_logprobs=0)
    # prompt_logprobs[j] scores token j (None for the first).
    return [[e.logprob for e in o.prompt_logprobs[n:]] for o, (_, n) in zip(outs, items)]


def transformers_scores(path: Path, items) -> list[list[float]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids, n in items:
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            out.append([logp[j - 1, ids[j]].item() for j in range(n, len(ids))])
    return out


def llama_cpp_scores(path: Path, items) -> list[list[float]]:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=256, logits_all=True, n_threads=os.cpu_count(), verbose=False)
    out = []
    for ids, n in items:
        llm.reset()
        llm.eval(ids)
        logits = torch.tensor(llm.scores[:len(ids)], dtype=torch.float32)
        logp = torch.log_softmax(logits, -1)
        out.append([logp[j - 1, ids[j]].item() for j in range(n, len(ids))])
    return out


def per_token_gap(a: list[list[float]], b: list[list[float]]) -> dict:
    """Per choice: |sum a - sum b| / tokens; and the largest single-token difference."""
    per_choice = [abs(sum(x) - sum(y)) / len(x) for x, y in zip(a, b)]
    per_token = [abs(p - q) for x, y in zip(a, b) for p, q in zip(x, y)]
    return {"mean_nats_per_token": sum(per_choice) / len(per_choice), "max_nats_per_token": max(per_choice),
            "max_single_token": max(per_token)}


def main() -> None:
    from fastdecode.checkpoints import default_model_path

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    path = default_model_path()

    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    items = [split_ids(tok, c, x) for c, x in pairs()]
    ref = transformers_scores(path, items)
    rows = {
        "fastdecode weights=float": fastdecode_scores(str(path), "float", items),
        "fastdecode quantized (the file's)": fastdecode_scores(str(path), "auto", items),
    }
    try:
        rows["llama.cpp"] = llama_cpp_scores(path, items)
    except ImportError:
        pass
    report = {
        "command": "benchmarks/lm_eval/agreement.py",
        "model": str(path),
        "machine": {"cpu": subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True,
                                          text=True).stdout.strip(), "platform": platform.platform()},
        "load": os.getloadavg(),
        "choices": len(items),
        "continuation_tokens": sum(len(r) for r in ref),
        "against_transformers": {k: per_token_gap(v, ref) for k, v in rows.items()},
    }
    if "llama.cpp" in rows:  # the same quantized file, two engines
        report["quantized_against_llama_cpp"] = per_token_gap(rows["fastdecode quantized (the file's)"], rows["llama.cpp"])
    # A longer sample of the same gaps: every token of the shipped text's first 255-token window.
    import fastdecode
    text = (Path(fastdecode.__file__).parent / "data" / "perplexity.txt").read_text(encoding="utf-8")
    long = [(tok.encode(text, add_special_tokens=False)[:255], 1)]
    ref = transformers_scores(path, long)
    report["text_window_against_transformers"] = {
        k: {"mean_abs_nats_per_token": sum(abs(x - y) for x, y in zip(v[0], ref[0])) / len(ref[0])}
        for k, v in {"fastdecode weights=float": fastdecode_scores(str(path), "float", long),
                     "fastdecode quantized (the file's)": fastdecode_scores(str(path), "auto", long),
                     **({"llama.cpp": llama_cpp_scores(path, long)} if "llama.cpp" in rows else {})}.items()}
    print(json.dumps(report, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
