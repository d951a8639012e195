"""`LLM`: a loaded model (what `load()` in build.py returns), to `generate`, `stream` or `chat` with."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence, Union

import torch

from ..compile.background import PackageWhenReady
from ..engine import Completion, Engine, GenerationConfig
from ..engine.draft import DraftProposer
from ..errors import FastDecodeError
from ..model.args import ModelArgs
from ..model.moe import MoEFeedForward
from ..model.transformer import Transformer
from ..quant import KernelChoice
from ..sampling import SamplingParams
from ..structured import OPTIONS as CONSTRAINT_OPTIONS
from ..structured import from_options
from ..text.harmony import HarmonySplitter, is_harmony
from ..text.tokenizer import Tokenizer
from .generate import GenerationRun, prompt_names, run_generation

Prompts = Union[str, Sequence[str], Sequence[int], Sequence[Sequence[int]]]


@dataclass(frozen=True)
class LoadReport:
    """What load() made of its options, for the stats and the CLI."""

    source: str  # "preset:<name>" or the checkpoint's path
    compile: str  # the strategy whose steps run ("none" where a package runs them)
    cache: str = "static"
    weights: str = "float"  # the weights= it was loaded with ("auto" is "float" off CPU)
    weights_summary: str = "float"  # what became of the checkpoint's tensor types
    kernels: KernelChoice = field(default_factory=KernelChoice)  # which kernels run the matmuls
    # Where a converted GGUF copy lives (fastdecode.checkpoints.clear_cache() removes it).
    cache_path: Optional[str] = None
    from_cache: bool = False
    load_seconds: float = 0.0


class LLM:
    """A loaded model with its tokenizer, ready to generate. The engine owns the
    model, its KV cache and every request; the report says how it was loaded."""

    def __init__(self, engine: Engine, report: LoadReport):
        self.engine, self.report = engine, report
        self.model: Transformer = engine.model
        self.tokenizer: Tokenizer = engine.tokenizer
        self.args: ModelArgs = engine.model.args

    max_seq_len = property(lambda self: self.engine.max_seq_len)
    max_batch_size = property(lambda self: self.engine.max_batch_size)
    source = property(lambda self: self.report.source)
    compile = property(lambda self: self.report.compile)
    cache = property(lambda self: self.report.cache)
    weights = property(lambda self: self.report.weights)
    weights_summary = property(lambda self: self.report.weights_summary)
    kernels = property(lambda self: self.report.kernels)
    cache_path = property(lambda self: self.report.cache_path)
    from_cache = property(lambda self: self.report.from_cache)
    load_seconds = property(lambda self: self.report.load_seconds)

    @property
    def draft(self) -> Optional[DraftProposer]:
        """The draft model of speculative="draft:<model>" (its `model`, `steps`), if loaded."""
        return self.engine.draft

    @property
    def compiled(self) -> Optional[str]:
        """Path of the exported package running the steps, if any."""
        return self.engine.runner.steps.compiled

    @property
    def exporting_package(self) -> Optional[int]:
        """The pid of the background process exporting this machine's package for the model, if one runs."""
        steps = self.engine.runner.steps
        return steps.pid if isinstance(steps, PackageWhenReady) and steps.exporting else None

    @property
    def steps(self):
        """The step callables the engine runs (a compile strategy's or a package's)."""
        return self.engine.runner.steps

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads: all tensors except the embedding
        table, of which one row is read (tied models read it whole as the output head),
        and of an MoE layer's experts the share one token chooses (top_k of them)."""
        def nbytes(tensors) -> int:
            return sum(t.numel() * t.element_size() for t in tensors)

        total = nbytes(self.model.state_dict().values())
        if self.model.output is not None:
            total -= nbytes(self.model.tok_embeddings.state_dict().values())
        for layer in self.model.layers:
            ff = layer.feed_forward
            if isinstance(ff, MoEFeedForward):
                experts = nbytes(ff.experts.state_dict().values())
                total -= experts - experts * ff.top_k // len(ff.experts)
        return total

    # -- requests ------------------------------------------------------------

    def encode_prompts(self, prompts: Prompts) -> list[list[int]]:
        """Normalize str / list[str] / list[int] / list[list[int]] into lists of ids
        (text is tokenized); whether the ids can run is Engine.check's to say."""
        if isinstance(prompts, torch.Tensor):
            prompts = prompts.tolist()
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
            raise FastDecodeError("prompts must be a non-empty str, list of str, list of ids or list of id lists")
        if all(_is_id(p) for p in prompts):
            prompts = [list(prompts)]
        out = []
        for name, p in zip(prompt_names(len(prompts)), prompts):
            if isinstance(p, str):
                if not p:
                    raise FastDecodeError(f"{name} is empty")
                out.append(self.tokenizer.encode(p))
            elif isinstance(p, (list, tuple)) and all(_is_id(t) for t in p):
                out.append([int(t) for t in p])
            else:
                raise FastDecodeError(
                    f"{name} has type {type(p).__name__}; accepted: str or a list of int token ids")
        return out

    def start(self, prompts: Prompts, params: SamplingParams, config: GenerationConfig) -> GenerationRun:
        """Submit one request per prompt, each with its own generator (seeded
        alike), after the engine has checked them all; iterate the result to
        run them. More prompts than max_batch_size wait for free slots."""
        return run_generation(self.engine, self.encode_prompts(prompts), params, config)

    def generate(self, prompts: Prompts, **options: Any) -> list[Completion]:
        """One Completion per prompt, in order. Options: the fields of
        SamplingParams and GenerationConfig (max_new_tokens, temperature, top_k,
        top_p, min_p, repetition_penalty, seed, stop, ignore_eos, ...)."""
        run = self.start(prompts, *split_options(options))
        for _ in run:
            pass
        return run.completions

    def stream(self, prompt: Union[str, Sequence[int]], **options: Any) -> Iterator[str]:
        """Yield the completion of one prompt as text pieces, each valid UTF-8."""
        if not isinstance(prompt, str) and not (isinstance(prompt, (list, tuple)) and all(_is_id(t) for t in prompt)):
            raise FastDecodeError("stream takes one prompt: a str or a list of int token ids")
        run = self.start(prompt, *split_options(options))
        for step in run:
            if step.pieces[0]:
                yield step.pieces[0]

    def chat(self, messages: list[dict], *, continue_final_message: bool = False, **options: Any) -> Completion:
        """Render `messages` with the checkpoint's chat template and return the assistant's reply
        (with `continue_final_message`, the rest of the final message, whose text it continues).
        A harmony reply (gpt-oss) is read apart: `text` is its answer, `reasoning` its analysis."""
        prompt = self.chat_prompt(messages, add_generation_prompt=not continue_final_message,
                                  continue_final_message=continue_final_message)
        if not is_harmony(self.tokenizer.chat_template):
            return self.generate([prompt], **options)[0]
        # Decoded with its channel markers, which the splitter takes out.
        out = self.generate([prompt], **{**options, "skip_special_tokens": False})[0]
        reasoning, text = HarmonySplitter().feed(out.text, finished=True)
        return dataclasses.replace(out, text=text, reasoning=reasoning)

    def chat_prompt(self, messages: list[dict], tools: Optional[list[dict]] = None,
                    template_kwargs: Optional[dict[str, Any]] = None, *, add_generation_prompt: bool = True,
                    continue_final_message: bool = False) -> list[int]:
        """Token ids of `messages` rendered with the chat template, ready for the reply (the
        assistant's header, or without it when `add_generation_prompt` is false; with
        `continue_final_message`, and add_generation_prompt false, the final message left open for
        the reply to continue); `tools` (OpenAI's tool definitions) reach the template as its
        `tools` variable, and `template_kwargs` as variables of their own (Qwen 3:
        {"enable_thinking": False})."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=continue_final_message, tools=tools,
                                                  variables=template_kwargs)
        return self.tokenizer.encode(text, add_special_tokens=False)


_SAMPLING_FIELDS = set(SamplingParams.__dataclass_fields__)
_CONFIG_FIELDS = set(GenerationConfig.__dataclass_fields__)


def _option_parameters() -> list[inspect.Parameter]:
    """The keyword-only options of generate/stream/chat, with the dataclasses' defaults."""
    fields = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
              for cls in (GenerationConfig, SamplingParams) for f in dataclasses.fields(cls)]
    return fields + [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
                     for name, kind in CONSTRAINT_OPTIONS.items()]


def _document_options(method) -> None:
    """Show the real option names and defaults in help() and IDEs; the dataclasses stay the one source."""
    sig = inspect.signature(method)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    method.__signature__ = sig.replace(parameters=params + _option_parameters())


for _method in (LLM.generate, LLM.stream, LLM.chat):
    _document_options(_method)


def split_options(options: dict[str, Any]) -> tuple[SamplingParams, GenerationConfig]:
    """Build (SamplingParams, GenerationConfig) from keyword options; unknown keys fail.
    json_schema=, regex=, choice= and grammar= become SamplingParams.constraint."""
    unknown = set(options) - _SAMPLING_FIELDS - _CONFIG_FIELDS - set(CONSTRAINT_OPTIONS)
    if unknown:
        raise FastDecodeError(
            f"unknown option(s) {', '.join(sorted(unknown))}; accepted: "
            f"{', '.join(sorted(_SAMPLING_FIELDS | _CONFIG_FIELDS | set(CONSTRAINT_OPTIONS)))}")
    sampling = {k: v for k, v in options.items() if k in _SAMPLING_FIELDS}
    asked = {k: options[k] for k in CONSTRAINT_OPTIONS if options.get(k) is not None}
    if asked:
        if sampling.get("constraint") is not None:
            raise FastDecodeError(f"give constraint= or {', '.join(asked)}=, not both")
        sampling["constraint"] = from_options(**asked)
    params = SamplingParams(**sampling)
    config = GenerationConfig(**{k: v for k, v in options.items() if k in _CONFIG_FIELDS})
    return params, config


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
