"""Write tests/golden/smollm2_135m_instruct.json: what the default checkpoint computes today.

    .venv/bin/python scripts/make_golden.py

For each prompt it stores the token ids, the top-5 (id, logit) of the last
prompt position from the cache-free forward, and the greedy token ids
of 32 new tokens; tests/golden/test_golden.py checks them on every run. Rerun it
only when a change is meant to alter the numerics, and say so in the commit.

It runs on the native kernels, `load()`'s choice wherever they build (AVX2 and a
C++ compiler), whose results do not depend on the CPU's instruction set, the
thread count or the batch. The PyTorch reference path, run without them, is not
stored: its RMSNorm rounds differently (the int8 activation quantization turns
that into logit differences of ~0.3), and its greedy tokens change with the
thread count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
from pathlib import Path

os.environ["FASTDECODE_NO_PACKAGE"] = "1"  # the eager model, as the tests run it; no package exported

import torch  # noqa: E402

import fastdecode  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "tests" / "golden" / "smollm2_135m_instruct.json"
NEW_TOKENS = 32
TOP_K = 5
# A plain sentence start, code, a chat-template-rendered question, and non-English UTF-8.
CASES = [
    {"name": "sentence", "prompt": "The history of the printing press begins"},
    {"name": "code", "prompt": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'},
    {"name": "chat", "messages": [{"role": "user", "content": "What is the boiling point of water at sea level?"}]},
    {"name": "utf8", "prompt": "Voilà ce que l'élève a écrit en japonais : 東京は日本の首都です。"},
]


def prompt_ids(llm, case: dict) -> list[int]:
    prompt = llm.chat_prompt(case["messages"]) if "messages" in case else case["prompt"]
    return llm.encode_prompts(prompt)[0]


def top_logits(llm, ids: list[int]) -> list[list]:
    """[[id, logit], ...] of the last position, best first, from the cache-free forward."""
    with torch.no_grad():
        logits = llm.model(torch.tensor([ids], device=llm.device), None)[0, -1].float()
    values, indices = logits.topk(TOP_K)
    return [[int(i), float(v)] for i, v in zip(indices, values)]


def greedy(llm, ids: list[int]) -> list[int]:
    return llm.generate(ids, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)[0].token_ids


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main() -> int:
    llm = fastdecode.load()
    if llm.kernels.quant == "reference":
        print(f"make_golden.py: run it where the native kernels load ({llm.kernels.reason})", file=sys.stderr)
        return 1
    cases = []
    for case in CASES:
        ids = prompt_ids(llm, case)
        cases.append({**case, "prompt_ids": ids, "top_logits": top_logits(llm, ids), "greedy_ids": greedy(llm, ids)})
    checkpoint = Path(llm.source)
    golden = {
        "made_by": "scripts/make_golden.py",
        "checkpoint": {"name": "smollm2-135m-instruct", "file": checkpoint.name, "sha256": sha256(checkpoint)},
        "torch": torch.__version__,
        "load": "fastdecode.load() with default options, FASTDECODE_NO_PACKAGE=1",
        "kv_dtype": llm.engine.kv_dtype,  # load()'s auto choice: the greedy tokens read this cache
        "weights_summary": llm.weights_summary,
        "kernels": dataclasses.asdict(llm.kernels),
        "new_tokens": NEW_TOKENS,
        "cases": cases,
    }
    text = json.dumps(golden, indent=1, ensure_ascii=False)
    # Lists of numbers on one line each: ids and (id, logit) pairs stay readable in a diff.
    text = re.sub(r"\[\s+([-\d.,e\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {OUT}: {len(cases)} prompts, weights {llm.weights_summary}, kernels {llm.kernels.quant}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
