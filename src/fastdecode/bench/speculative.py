"""`fastdecode bench-spec`: speculative decoding on input-grounded and open-ended tasks.

Input-grounded tasks quote 300-1,000 tokens of the shipped public-domain text
(Alice's Adventures in Wonderland, data/perplexity.txt) and ask to repeat,
extract from or summarize it; open-ended tasks ask for new text. Each prompt is
rendered with the model's chat template and decoded greedily at batch 1, once
per mode; the report gives decode tokens/s, tokens per target forward and the
draft acceptance rate, and checks that every mode produced the same tokens.
The peers installed here (`peers`: transformers' prompt_lookup_num_tokens and
llama-cpp-python's LlamaPromptLookupDecoding) then decode the same prompt ids, each
with and without prompt lookup; see bench/spec_peers.py.
"""

from __future__ import annotations

import shlex
import statistics
import sys
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Optional

from ..config import LoadOptions
from ..errors import FastDecodeError
from ..cli.command import run_command
from ..cli.keys import ModelKeys
from .report import machine_info, write_json
from .spec_peers import SPEC_PEERS, PeerOptions, check_spec_peers, run_spec_peers, summary_lines

OPEN_ENDED = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in a few paragraphs why the sky is blue.",
    "Give me ten ideas for a rainy Sunday afternoon, with a sentence about each.",
    "Describe the life cycle of a star to a curious twelve-year-old.",
]


def grounded_tasks(tokenizer) -> list[str]:
    text = resources.files("fastdecode").joinpath("data/perplexity.txt").read_text(encoding="utf-8")
    paragraphs = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 200]
    passages, cur = [], ""
    for p in paragraphs:  # passages of ~300-1,000 tokens
        cur = f"{cur}\n\n{p}" if cur else p
        if len(tokenizer.encode(cur)) >= 300:
            passages.append(cur)
            cur = ""
        if len(passages) == 3:
            break
    asks = ["Repeat the following passage exactly, word for word.",
            "Copy out every sentence of the following passage that mentions Alice.",
            "Summarize the following passage, quoting its key sentences."]
    return [f"{ask}\n\n{passage}" for ask, passage in zip(asks, passages)]


@dataclass
class SpecBenchSettings(ModelKeys):
    modes: list[str] = field(default_factory=lambda: ["none", "prompt-lookup"], metadata={
        "help": "speculative modes to compare: none, prompt-lookup, draft:MODEL (one draft model at most)"})
    max_new_tokens: int = field(default=192, metadata={"help": "tokens per answer (greedy; EOS ends it)"})
    num_draft_tokens: int = field(default=4, metadata={"help": "as generate's num_draft_tokens"})
    ngram_size: int = field(default=3, metadata={"help": "as generate's ngram_size"})
    compiled: Optional[str] = field(default=LoadOptions.compiled, metadata={"help": "as load(compiled=...)"})
    peers: list[str] = field(default_factory=lambda: list(SPEC_PEERS), metadata={
        "help": "peers run on the same prompts when installed, each with and without prompt lookup: "
                + ", ".join(SPEC_PEERS) + "; peers= for none"})
    out: str = field(default="bench-results/speculative.json", metadata={"help": "results file (JSON)"})

    def __post_init__(self) -> None:
        from ..engine.speculative import check_speculative

        for mode in self.modes:
            check_speculative(mode, self.num_draft_tokens, self.ngram_size)
        if len(self.draft_modes) > 1:
            raise FastDecodeError(f"modes has {len(self.draft_modes)} draft models; accepted: at most one per run")
        check_spec_peers(self.peers)
        if self.max_new_tokens < 1:
            raise FastDecodeError(f"max_new_tokens={self.max_new_tokens} is out of range; accepted: an integer >= 1")


    @property
    def draft_modes(self) -> list[str]:
        from ..engine.speculative import draft_model_name

        return [m for m in self.modes if draft_model_name(m)]


def run(s: SpecBenchSettings) -> dict:
    from ..api.build import load
    from ..engine import EngineThread

    thread = EngineThread(lambda: load(s.model, device=s.device, dtype=s.dtype, weights=s.weights,
                                       compiled=s.compiled, max_batch_size=1,
                                       speculative=(s.draft_modes or ["none"])[0]))
    thread.start()
    llm = thread.wait()
    tasks = {"grounded": grounded_tasks(llm.tokenizer), "open-ended": OPEN_ENDED}
    report: dict = {"settings": asdict(s), "source": llm.source, "compiled": llm.compiled, "tasks": {}}
    llm.generate("warm up", max_new_tokens=8)
    for kind, prompts in tasks.items():
        rows = {}
        for mode in s.modes:
            per = []
            for p in prompts:
                c = llm.chat([{"role": "user", "content": p}], max_new_tokens=s.max_new_tokens, temperature=0,
                             speculative=mode, num_draft_tokens=s.num_draft_tokens, ngram_size=s.ngram_size)
                per.append({"prompt_tokens": c.prompt_tokens, "tokens": c.completion_tokens,
                            "decode_tokens_per_s": round(c.decode_tokens_per_s, 1),
                            "tokens_per_forward": round(c.tokens_per_forward, 2),
                            "acceptance": None if c.acceptance_rate is None else round(c.acceptance_rate, 3),
                            "token_ids": c.token_ids})
            rows[mode] = per
            print(f"{kind} {mode}: " + ", ".join(f"{r['decode_tokens_per_s']} tok/s ({r['tokens_per_forward']}/fwd)"
                                                 for r in per), file=sys.stderr)
        base = rows[s.modes[0]]
        summary = {}
        for mode, per in rows.items():
            same = all(a["token_ids"] == b["token_ids"] for a, b in zip(per, base))
            summary[mode] = {
                "median_tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in per),
                "vs_first_mode": round(statistics.median(
                    r["decode_tokens_per_s"] / b["decode_tokens_per_s"] for r, b in zip(per, base)), 2),
                "tokens_per_forward": round(statistics.mean(r["tokens_per_forward"] for r in per), 2),
                "same_tokens_as_first_mode": same}
        for per in rows.values():
            for r in per:
                del r["token_ids"]
        report["tasks"][kind] = {"per_prompt": rows, "summary": summary}
    prompt_ids = {kind: [llm.chat_prompt([{"role": "user", "content": p}]) for p in ps] for kind, ps in tasks.items()}
    llm.engine.close()
    if s.peers:  # after fastdecode's engine is closed, so the peers have its memory
        report["peers"] = run_spec_peers(s.peers, PeerOptions(s.model, s.device, s.dtype, s.max_new_tokens,
                                                              s.num_draft_tokens, s.ngram_size), prompt_ids)
    return report


def main(argv: list[str]) -> int:
    usage = "usage: fastdecode bench-spec [--config FILE] [key=value ...]\n\n" + (__doc__ or "") + "\nkeys:\n"
    return run_command(argv, SpecBenchSettings, usage, lambda s: _bench(s, argv))


def _bench(s: SpecBenchSettings, argv: list[str]) -> int:
    report = run(s)
    report["command"] = shlex.join(["fastdecode", "bench-spec", *argv])
    report["machine"] = machine_info(s.device)
    write_json(s.out, report)
    for kind, t in report["tasks"].items():
        for mode, row in t["summary"].items():
            print(f"{kind:<11} {mode:<14} {row['median_tokens_per_s']:>7} tok/s  x{row['vs_first_mode']:<5} "
                  f"{row['tokens_per_forward']} tokens/forward  same tokens: {row['same_tokens_as_first_mode']}")
    for line in summary_lines(report.get("peers", {})):
        print(line)
    print(f"results: {s.out}")
    return 0
