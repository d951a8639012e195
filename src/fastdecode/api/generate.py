"""Synchronous generation over the engine: what `LLM.generate`, `stream` and
`chat` (and the CLI) call.

`run_generation` submits one request per prompt (a RequestStream) and, when
iterated, drives the engine (or waits on its background thread) until they
finish, yielding a `StepOutput` per engine step that produced something for them. Each request
keeps its own slot, positions and generator, so a prompt's output does not
depend on what shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, Iterator

from ..engine import Completion, Engine, GenerationConfig, RequestOutput
from ..engine.stream import RequestStream
from ..sampling import SamplingParams


@dataclass
class StepOutput:
    """What one step added: the text piece per prompt ('' if none or finished)."""

    pieces: list[str]
    finished: list[bool]


@dataclass
class GenerationRun:
    """Iterate to drive the generation (one StepOutput per step); then read `completions`."""

    steps: Generator[StepOutput, None, None]
    completions: list[Completion] = field(default_factory=list)

    def __iter__(self) -> Iterator[StepOutput]:
        return self.steps

    def close(self) -> None:
        """Cancel what has not finished (also done when the iteration is abandoned)."""
        self.steps.close()


def prompt_names(n: int) -> list[str]:
    """How errors name each of n prompts: "prompt i", or "the prompt" when it is the only one."""
    return ["the prompt"] if n == 1 else [f"prompt {i}" for i in range(n)]


def run_generation(engine: Engine, prompts: list[list[int]], params: SamplingParams,
                   cfg: GenerationConfig) -> GenerationRun:
    """Submit prompts (token ids, named in errors by prompt_names; none is queued when one cannot
    run); nothing runs until the result is iterated."""
    stream = RequestStream(engine).submit(prompts, params, cfg, names=prompt_names(len(prompts)))
    # The generator fills the run's completions but holds no reference to the run:
    # with none, dropping an abandoned run closes the generator (and cancels) at once.
    completions: list[Completion] = []
    return GenerationRun(_drive(completions, stream), completions)


def _drive(results: list, stream: RequestStream) -> Generator[StepOutput, None, None]:
    B = len(stream.requests)
    finished = [False] * B
    completions: list = [None] * B
    try:
        while not all(finished):
            pieces = [""] * B
            for i, out in stream.next_step():
                out: RequestOutput
                pieces[i] += out.text
                if out.finished:
                    finished[i] = True
                    completions[i] = out.completion
            yield StepOutput(pieces, list(finished))
        results[:] = completions
    finally:
        # Abandoned (closed, interrupted or collected): the next step frees the slots.
        # Only a flag is set here, since this may run while a step is in progress.
        stream.cancel()
