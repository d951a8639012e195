"""Synchronous generation over the engine: what `LLM.generate`, `stream` and
`chat` (and the CLI) call.

`run_generation` submits one request per prompt and, when iterated, drives
the engine (or waits on its background thread) until they finish, yielding a
`StepOutput` per engine step that produced something for them. Each request
keeps its own slot, positions and generator, so a prompt's output does not
depend on what shares the batch.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Generator, Iterator

from ..engine import Completion, Engine, GenerationConfig, RequestOutput
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


def run_generation(engine: Engine, prompts: list[list[int]], params: SamplingParams,
                   cfg: GenerationConfig) -> GenerationRun:
    """Submit already-encoded prompts; nothing runs until the result is iterated."""
    outputs: queue.SimpleQueue = queue.SimpleQueue()
    requests = []
    try:
        for i, p in enumerate(prompts):
            requests.append(engine.submit(p, params, cfg, sink=lambda out, i=i: outputs.put((i, out))))
    except BaseException:
        for r in requests:
            engine.cancel(r)
        raise
    # The generator fills the run's completions but holds no reference to the run:
    # with none, dropping an abandoned run closes the generator (and cancels) at once.
    completions: list[Completion] = []
    return GenerationRun(_drive(completions, engine, requests, outputs), completions)


def _drive(results: list, engine: Engine, requests, outputs: queue.SimpleQueue) -> Generator[StepOutput, None, None]:
    B = len(requests)
    finished = [False] * B
    completions: list = [None] * B
    try:
        while not all(finished):
            if engine.background:
                pending = [outputs.get()]  # the engine's thread steps; wait for it
            else:
                engine.step()
                pending = []
            while True:
                try:
                    pending.append(outputs.get_nowait())
                except queue.Empty:
                    break
            if not pending:
                continue
            pieces = [""] * B
            for i, out in pending:
                out: RequestOutput
                if out.error is not None:
                    raise out.error
                pieces[i] += out.text
                if out.finished:
                    finished[i] = True
                    completions[i] = out.completion
            yield StepOutput(pieces, list(finished))
        results[:] = completions
    finally:
        # Abandoned (closed, interrupted or collected): the next step frees the slots.
        # Only a flag is set here, since this may run while a step is in progress.
        for r, f in zip(requests, finished):
            if not f:
                engine.cancel(r)
