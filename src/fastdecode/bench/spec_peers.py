"""Peers for `fastdecode bench-spec`: prompt lookup in transformers and in llama-cpp-python.

Each peer decodes the same chat-rendered prompt ids as fastdecode, greedily, at
batch 1, in two modes: "plain" (its own baseline) and "prompt-lookup":

- transformers: `generate(..., prompt_lookup_num_tokens=K, max_matching_ngram_size=N)`
  on the same checkpoint (a GGUF file is dequantized to the run's dtype, float32 on CPU);
  plain is the same call without the two options. EOS is the model's generation config's.
- llama.cpp: llama-cpp-python's `Llama.generate` on the same GGUF file, with
  `draft_model=LlamaPromptLookupDecoding(max_ngram_size=N, num_pred_tokens=K)`; plain is a
  second `Llama` without a draft model (a draft model makes `Llama` copy every
  position's logits, logits_all=True, a cost plain decoding does not pay). Greedy:
  top_k=1, temp=0, repeat_penalty=1; it stops at an end-of-generation token.

Timing comes from streaming timestamps, so prefill is left out: a transformers
streamer and llama-cpp's token generator mark the time each chunk of new tokens
arrives. Decode tokens/s = (tokens produced, EOS included, minus those of the first
chunk) / (last arrival - first arrival), as fastdecode counts its own. The first
chunk is the first token alone, except in transformers' prompt lookup, whose
prefill forward also verifies a draft (its accepted tokens are not counted).
Tokens per forward = generated tokens / model forwards (prefill included):
forward calls of the transformers model, `Llama.eval` calls.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..errors import FastDecodeError
from .peers import (PeerSkipped, load_hf_model, load_llama, peer_checkpoint, require_llama_cpp,
                    require_transformers)

SPEC_PEERS = ("transformers", "llama.cpp")
PEER_MODES = ("plain", "prompt-lookup")
TIMING = ("decode tokens/s from streaming timestamps: tokens after the first chunk / (last arrival - first "
          "arrival); prefill excluded")


def check_spec_peers(peers: list[str]) -> None:
    for name in peers:
        if name not in SPEC_PEERS:
            raise FastDecodeError(f"unknown peer {name!r}; accepted: {', '.join(SPEC_PEERS)} (peers= for none)")
    if len(set(peers)) != len(peers):
        raise FastDecodeError(f"peers has a repeated name: {', '.join(peers)}")


@dataclass
class PeerOptions:
    """What the peers share with the fastdecode run."""

    model: Optional[str]
    device: str
    dtype: Optional[str]
    max_new_tokens: int
    num_draft_tokens: int  # K: draft length
    ngram_size: int  # N: longest n-gram matched
    threads: Optional[int] = None  # llama.cpp threads; none takes torch's


@dataclass
class PeerRun:
    """One greedy answer: `token_ids` without EOS; `chunks` are (arrival time, tokens)."""

    token_ids: list[int]
    chunks: list[tuple[float, int]]
    forwards: int

    @property
    def decode_tokens_per_s(self) -> float:
        if len(self.chunks) < 2:
            return 0.0
        span = self.chunks[-1][0] - self.chunks[0][0]
        produced = sum(n for _, n in self.chunks) - self.chunks[0][1]
        return produced / span if span > 0 else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return len(self.token_ids) / self.forwards if self.forwards else 0.0


class _Arrivals:
    """A transformers streamer: the first `put` is the prompt; each later one is a chunk of new tokens."""

    def __init__(self, now: Callable[[], float]):
        self.now, self.seen_prompt = now, False
        self.chunks: list[tuple[float, int]] = []

    def put(self, value: torch.Tensor) -> None:
        if self.seen_prompt:
            self.chunks.append((self.now(), int(value.numel())))
        self.seen_prompt = True

    def end(self) -> None:
        pass


class HFSpecPeer:
    name = "transformers"

    def __init__(self, o: PeerOptions):
        require_transformers()
        ckpt = peer_checkpoint(o.model)
        from ..config import resolve_device, resolve_dtype

        self.device = resolve_device(o.device)
        torch_dtype = resolve_dtype(o.dtype, self.device)
        self.dtype = str(torch_dtype).removeprefix("torch.")
        self.source = str(ckpt.gguf_path or ckpt.directory)
        self.model = load_hf_model(ckpt, self.device, torch_dtype)
        eos = self.model.generation_config.eos_token_id
        self.eos = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
        self.forwards = 0
        self.hook = self.model.register_forward_hook(self._count)
        self.lookup = {"prompt_lookup_num_tokens": o.num_draft_tokens, "max_matching_ngram_size": o.ngram_size}

    def _count(self, *_: Any) -> None:
        self.forwards += 1

    def generate(self, mode: str, prompt: list[int], max_new_tokens: int) -> PeerRun:
        from ..engine import timing

        ids = torch.tensor([prompt], device=self.device)
        arrivals = _Arrivals(lambda: timing.now(self.device))
        self.forwards = 0
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                      do_sample=False, streamer=arrivals, pad_token_id=0, disable_compile=True,
                                      **(self.lookup if mode == "prompt-lookup" else {}))
        new = out[0, len(prompt):].tolist()
        end = next((i for i, t in enumerate(new) if t in self.eos), len(new))
        return PeerRun(new[:end], arrivals.chunks, self.forwards)

    def close(self) -> None:
        self.hook.remove()
        self.model = None


class LlamaSpecPeer:
    name = "llama.cpp"
    dtype = "gguf"

    def __init__(self, o: PeerOptions, n_ctx: int, n_batch: int):
        self.ckpt = peer_checkpoint(o.model)
        require_llama_cpp(self.ckpt, o.device)
        self.source = str(self.ckpt.gguf_path)
        self.threads = o.threads or torch.get_num_threads()
        self.n_ctx, self.n_batch = n_ctx, n_batch
        self.lookup = {"max_ngram_size": o.ngram_size, "num_pred_tokens": o.num_draft_tokens}
        self.llama: Any = None
        self.mode = ""
        self.forwards = 0
        self._open("plain")  # a model that does not load fails here, before anything is measured

    def _open(self, mode: str) -> None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.close()
        # With a draft model `Llama` reads every position's logits, but it sizes that buffer by
        # its `logits_all` argument: without logits_all=True it holds n_batch rows and
        # fails once prompt + answer pass n_batch (llama-cpp-python 0.3.x).
        draft = ({"draft_model": LlamaPromptLookupDecoding(**self.lookup), "logits_all": True}
                 if mode == "prompt-lookup" else {})
        self.llama = load_llama(self.ckpt, n_ctx=self.n_ctx, n_batch=self.n_batch, threads=self.threads, **draft)
        evaluate = self.llama.eval

        def counted(tokens):  # one Llama.eval = one forward over its tokens
            self.forwards += 1
            return evaluate(tokens)

        self.llama.eval = counted
        self.mode = mode

    def generate(self, mode: str, prompt: list[int], max_new_tokens: int) -> PeerRun:
        import llama_cpp

        if mode != self.mode:
            self._open(mode)
        vocab = llama_cpp.llama_model_get_vocab(self.llama.model)
        self.llama.reset()  # no KV reuse from the previous prompt: every run prefills
        self.forwards = 0
        tokens: list[int] = []
        chunks: list[tuple[float, int]] = []
        for tok in self.llama.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0):
            chunks.append((time.perf_counter(), 1))
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                break
            tokens.append(int(tok))
            if len(tokens) == max_new_tokens:
                break
        return PeerRun(tokens, chunks, self.forwards)

    def close(self) -> None:
        if self.llama is not None:
            self.llama.close()
        self.llama = None


def open_peer(name: str, o: PeerOptions, prompts: dict[str, list[list[int]]]):
    if name == "transformers":
        return HFSpecPeer(o)
    longest = max((len(p) for ps in prompts.values() for p in ps), default=1)
    return LlamaSpecPeer(o, n_ctx=longest + o.max_new_tokens + o.num_draft_tokens + 8, n_batch=longest)


def run_spec_peers(peers: list[str], o: PeerOptions, prompts: dict[str, list[list[int]]]) -> dict[str, Any]:
    """Per peer: {"skipped": why} when it cannot run here, else its per-prompt rows
    and per-task-set summary for each of PEER_MODES (`prompts`: task set -> prompt ids)."""
    check_spec_peers(peers)
    report: dict[str, Any] = {}
    for name in peers:
        try:
            peer = open_peer(name, o, prompts)
        except PeerSkipped as e:
            report[name] = {"skipped": str(e)}
        except Exception as e:  # e.g. transformers does not know the GGUF file's architecture
            report[name] = {"skipped": f"its model did not load: {_one_line(e)}"}
        else:
            try:
                report[name] = _measure(peer, o, prompts)
            except Exception as e:  # keep fastdecode's figures and the other peers
                report[name] = {"error": _one_line(e)}
            finally:
                peer.close()
        if "skipped" in report[name] or "error" in report[name]:
            print(f"peer {name}: {report[name].get('skipped') or report[name].get('error')}", file=sys.stderr)
    return report


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _measure(peer, o: PeerOptions, prompts: dict[str, list[list[int]]]) -> dict[str, Any]:
    runs: dict[str, dict[str, list[PeerRun]]] = {kind: {} for kind in prompts}
    for mode in PEER_MODES:  # mode outermost: llama.cpp loads one Llama per mode
        first = next((p for ps in prompts.values() for p in ps), None)
        if first is not None:
            peer.generate(mode, first[:16], 4)  # warm up, untimed
        for kind, ps in prompts.items():
            runs[kind][mode] = [peer.generate(mode, p, o.max_new_tokens) for p in ps]
            print(f"{peer.name} {kind} {mode}: " + ", ".join(
                f"{r.decode_tokens_per_s:.1f} tok/s ({r.tokens_per_forward:.2f}/fwd)" for r in runs[kind][mode]),
                file=sys.stderr)
    tasks = {}
    for kind, by_mode in runs.items():
        plain = by_mode["plain"]
        per_prompt = {mode: [{"tokens": len(r.token_ids), "decode_tokens_per_s": round(r.decode_tokens_per_s, 1),
                              "tokens_per_forward": round(r.tokens_per_forward, 2),
                              "same_tokens_as_plain": r.token_ids == b.token_ids}
                             for r, b in zip(rs, plain)] for mode, rs in by_mode.items()}
        tasks[kind] = {"per_prompt": per_prompt, "summary": {mode: _summary(rows, per_prompt["plain"])
                                                              for mode, rows in per_prompt.items()}}
    return {"engine": peer.name, "source": peer.source, "dtype": peer.dtype, "timing": TIMING,
            "num_draft_tokens": o.num_draft_tokens, "ngram_size": o.ngram_size, "tasks": tasks}


def _summary(rows: list[dict], plain: list[dict]) -> dict[str, Any]:
    if not rows:
        return {}
    ratios = [r["decode_tokens_per_s"] / b["decode_tokens_per_s"] for r, b in zip(rows, plain)
              if b["decode_tokens_per_s"] > 0]
    return {"median_tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in rows),
            "vs_plain": round(statistics.median(ratios), 2) if ratios else None,
            "tokens_per_forward": round(statistics.mean(r["tokens_per_forward"] for r in rows), 2),
            "same_tokens_as_plain": all(r["same_tokens_as_plain"] for r in rows)}


def summary_lines(peers: dict[str, Any]) -> list[str]:
    """The printed summary: one line per peer, task set and mode, or the peer's note."""
    lines = []
    for name, rep in peers.items():
        if "tasks" not in rep:
            lines.append(f"peer {name}: {'skipped' if 'skipped' in rep else 'failed'}: "
                         f"{rep.get('skipped') or rep.get('error')}")
            continue
        for kind, t in rep["tasks"].items():
            for mode, row in t["summary"].items():
                if row:
                    lines.append(f"{kind:<11} {name + ' ' + mode:<26} {row['median_tokens_per_s']:>7} tok/s  "
                                 f"x{row['vs_plain']} vs its plain  {row['tokens_per_forward']} tokens/forward  "
                                 f"same tokens: {row['same_tokens_as_plain']}")
    return lines
