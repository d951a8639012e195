"""What the runner measures: a `Contender` loads once, then runs batches of prompts.

Every contender reports the same `Timing`, taken the same way (wall clock with
a device sync at each mark), so rows from fastdecode and from its peers compare
directly.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

import torch

from ..engine import timing
from ..engine.request import GenerationConfig
from ..errors import FastDecodeError
from ..sampling import SamplingParams
from .options import MODES, BenchSettings


@dataclass
class Timing:
    """One generate call: `ttft_s` from the call to the first new token (prefill
    and first sample), then one entry in `step_s` per further token."""

    ttft_s: float
    step_s: list[float]
    peak_memory_bytes: Optional[int] = None

    @property
    def total_s(self) -> float:
        return self.ttft_s + sum(self.step_s)


class Contender:
    """Base: `name` labels rows, `engine` groups them, `compiles` turns on compile figures."""

    name: str = ""
    engine: str = ""
    compiles: bool = False
    load_s: float = 0.0
    load_compile_s: Optional[float] = None  # compile time spent inside load_s
    weight_bytes_per_token: int = 0
    vocab_size: int = 0

    def run(self, prompts: list[list[int]], new_tokens: int) -> Timing:
        raise NotImplementedError

    def close(self) -> None:
        """Drop the model so the next contender has the memory."""


class StepClock:
    """Marks a time (after a device sync) at each call; diffs give per-step times."""

    def __init__(self, device: torch.device):
        self.device = device
        self.marks: list[float] = []
        self.start = 0.0

    def begin(self) -> None:
        self.marks.clear()
        self.start = timing.now(self.device)

    def mark(self) -> None:
        self.marks.append(timing.now(self.device))

    def timing(self, peak: Optional[int] = None) -> Timing:
        if not self.marks:
            raise RuntimeError("the generate call produced no tokens")
        steps = [b - a for a, b in zip(self.marks, self.marks[1:])]
        return Timing(ttft_s=self.marks[0] - self.start, step_s=steps, peak_memory_bytes=peak)


class PeerSkipped(Exception):
    """The contender (a peer, or a mode of ours) cannot run here; the message says why and how to fix it."""


class EngineContender(Contender):
    """fastdecode itself in one of MODES, driven through `LLM.start` step by step."""

    engine = "fastdecode"

    def __init__(self, mode: str, s: BenchSettings):
        from ..api.build import load

        self.name = mode
        self.compiles = MODES[mode].get("compile", "none") != "none"
        before = compile_counters()
        t0 = time.perf_counter()
        kwargs = {"weights": s.weights, **MODES[mode]}
        if mode == "package":  # the engine is built on the package's steps
            kwargs["compiled"], self.load_compile_s = self._package(s, kwargs)
        # Every run repeats its row's prompt: with prefix caching on, runs after the first would
        # time a prefill of one token, not the prompt's (llama.cpp's peer gets no cache either).
        self.llm = load(s.model, device=s.device, dtype=s.dtype, max_batch_size=s.max_batch_size,
                        max_seq_len=s.max_seq_len, tp=s.tp, prefix_cache=False, **kwargs)
        self.load_s = time.perf_counter() - t0
        if self.compiles and self.llm.compile == "none":  # the load ran the eager steps instead, and said why
            raise PeerSkipped(f"compile={MODES[mode]['compile']} does not run for {self.llm.source} here (a mixture-"
                              "of-experts or LFM2 model, or no C++ compiler): its load ran the eager steps")
        if self.compiles and before:  # a strategy may compile while loading
            self.load_compile_s = compile_counters()["compile_s"] - before["compile_s"]
        self.weight_bytes_per_token = self.llm.weight_bytes_per_token
        self.vocab_size = self.llm.args.vocab_size
        self.device = self.llm.device
        self.dtype = str(self.llm.dtype).removeprefix("torch.")
        self.source = self.llm.source
        self.weights = f"{self.llm.weights_summary}; kernels: {self.llm.kernels.quant}, ops {self.llm.kernels.ops}"

    @staticmethod
    def _package(s: BenchSettings, kwargs: dict) -> tuple[str, Optional[float]]:
        """s.package, or a package of the model exported now into the results folder (and its export time)."""
        from ..api.build import load
        from ..compile.aot import export_package

        if s.package is not None:
            return s.package, None
        os.makedirs(s.out, exist_ok=True)
        path = os.path.join(s.out, "package.pt2")
        model = load(s.model, device=s.device, dtype=s.dtype, weights=kwargs["weights"], compiled=None,
                     max_batch_size=1, max_seq_len=16).model
        t0 = time.perf_counter()
        try:
            export_package(model, path)
        except FastDecodeError as e:  # a model that is not exported (an MoE one): no package row here
            raise PeerSkipped(str(e)) from None
        return path, time.perf_counter() - t0

    def run(self, prompts: list[list[int]], new_tokens: int) -> Timing:
        if len(prompts) > self.llm.max_batch_size:  # the engine would queue the rest: not one batch
            raise FastDecodeError(f"batch of {len(prompts)} prompts exceeds max_batch_size={self.llm.max_batch_size}")
        run = self.llm.start(prompts, SamplingParams(temperature=0.0),
                             GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True))
        clock = StepClock(self.device)
        clock.begin()
        for _ in run:
            clock.mark()
        return clock.timing(run.completions[0].peak_memory_bytes if run.completions else None)

    def close(self) -> None:
        self.llm = None


def compile_counters() -> dict[str, float]:
    """Dynamo's running totals (graphs built, frames compiled, seconds spent
    compiling); the runner reports their differences across a row."""
    try:
        from torch._dynamo import utils
    except ImportError:  # a torch build without dynamo
        return {}
    compiles = utils.compilation_time_metrics.get("_compile.compile_inner", [])
    return {"graphs": int(utils.counters["stats"].get("unique_graphs", 0)),
            "compiles": len(compiles), "compile_s": float(sum(compiles))}
