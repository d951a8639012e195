"""The `fastdecode` command: `generate` and `chat` here, and dispatch to the others
(bench, bench-engine, bench-spec, export, perplexity, serve).

A thin layer over the Python API. Keys, defaults and validation come from the
dataclasses the API uses (`LoadOptions`, `SamplingParams`, `GenerationConfig`);
this file only parses, streams and reports.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any, NoReturn, Optional, Sequence

from ..api.build import build
from ..api.llm import LLM
from ..config import LoadOptions
from ..engine import timing
from ..engine.request import GenerationConfig
from ..engine.speculative import draft_model_name
from ..errors import FastDecodeError
from ..sampling import SamplingParams
from ..structured import from_options
from ..text.chat_template import compile_template
from ..version import __version__
from .command import EXIT_USAGE, exit_code
from .keys import (JsonText, copy_fields, decode_utf8, describe_settings, format_value, is_override,
                   load_settings, read_user_file)
from .progress import progress



def _help(text: str) -> dict[str, str]:
    return {"help": text}


# load()'s keys (LoadOptions holds their defaults and help), then the CLI's own.
_LOAD_KEYS = ("model", "device", "dtype", "compile", "compiled", "max_seq_len", "max_batch_size", "cache",
              "kv_dtype", "weights")
_LOAD_HELP = {"max_batch_size": "most prompts per batch; none fits the prompts given (generate) or 1 (chat)."}


@dataclass
class _PromptKeys:
    prompt: tuple[str, ...] = field(default=(), metadata=_help(
        "prompt text; repeat the key (or give several arguments) for a batch. In chat, "
        "the first user messages."))
    prompt_file: Optional[str] = field(default=None, metadata=_help(
        "UTF-8 file with one prompt per line (blank lines skipped); - reads stdin."))
    chat: Optional[bool] = field(default=None, metadata=_help(
        "generate: render each prompt with the model's chat template; none does so when the "
        "model has one (chat always does)."))
    system: Optional[str] = field(default=None, metadata=_help("system message for chat-template prompts."))


@dataclass
class _ConstraintKeys:
    """What the output must match (at most one; see fastdecode.structured).

    json_schema: a JSON schema (JSON text; in YAML also a mapping): the output is JSON valid against it.
    regex: a regular expression (Rust syntax) the whole output matches.
    choice: the output is exactly one of these strings; repeat the key for each.
    grammar: a Lark grammar (llguidance's dialect) or a GBNF grammar (llama.cpp's) the output follows.
    """

    json_schema: Optional[JsonText] = None
    regex: Optional[str] = None
    choice: Optional[tuple[str, ...]] = None
    grammar: Optional[str] = None


# Per-request fields of the Python API and the server, not command-line keys
# (the constraint comes from _ConstraintKeys).
API_ONLY_KEYS = ("logit_bias", "logprobs", "prompt_logprobs", "prompt_logprob_ranks", "constraint")

GenerateSettings = dataclasses.make_dataclass(
    "GenerateSettings",
    copy_fields(LoadOptions, include=_LOAD_KEYS, help=_LOAD_HELP) + copy_fields(_PromptKeys)
    + copy_fields(LoadOptions, include=("prefix_cache", "tp"))
    + copy_fields(SamplingParams, exclude=API_ONLY_KEYS) + copy_fields(GenerationConfig)
    + copy_fields(_ConstraintKeys),
    namespace={"__module__": __name__})
GenerateSettings.__doc__ = "Every key of `fastdecode generate` and `fastdecode chat`."

_SAMPLING_KEYS = [f.name for f in dataclasses.fields(SamplingParams) if f.name not in API_ONLY_KEYS]
_CONFIG_KEYS = [f.name for f in dataclasses.fields(GenerationConfig)]


# -- building API objects from settings ---------------------------------------------

def sampling_and_config(s: Any) -> tuple[SamplingParams, GenerationConfig]:
    constraint = from_options(json_schema=s.json_schema, regex=s.regex, grammar=s.grammar,
                              choice=list(s.choice) if s.choice is not None else None)
    params = SamplingParams(**{k: getattr(s, k) for k in _SAMPLING_KEYS}, constraint=constraint)
    config = GenerationConfig(**{k: getattr(s, k) for k in _CONFIG_KEYS})
    return params, config


def check_utf8(text: str, what: str) -> str:
    """Arguments that were not valid UTF-8 arrive as surrogate escapes; refuse them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        byte = f" (byte 0x{ord(bad) - 0xDC00:02x})" if 0xDC80 <= ord(bad) <= 0xDCFF else ""
        raise FastDecodeError(f"{what} is not valid UTF-8{byte} at character {e.start}") from None
    return text


def read_prompt_file(path: str) -> list[str]:
    """One prompt per line of a UTF-8 file (or stdin for '-'); blank lines are skipped."""
    data = sys.stdin.buffer.read() if path == "-" else read_user_file(path, "prompt_file")
    text = decode_utf8(data, path, "prompt_file")
    # split on newlines only: str.splitlines would also split on form feeds and U+2028
    prompts = [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    if not prompts:
        raise FastDecodeError(f"prompt_file {path!r} has no prompts (one per line expected)")
    return prompts


def collect_prompts(s: Any) -> list[str]:
    prompts = [check_utf8(p, f"prompt {i + 1}") for i, p in enumerate(s.prompt)]
    if s.prompt_file is not None:
        prompts += read_prompt_file(s.prompt_file)
    return prompts


def load_model(s: Any, batch_size: Optional[int] = None) -> LLM:
    max_batch_size = batch_size if s.max_batch_size is None else s.max_batch_size
    if s.tp != 1:
        from ..parallel.launch import join_torchrun

        join_torchrun(s.tp, s.device)  # ranks other than 0 print only their errors from here on
    # A draft model is loaded with the target; the other modes are per request.
    draft = s.speculative if draft_model_name(s.speculative) else "none"
    options = LoadOptions.from_settings(s, max_batch_size=max_batch_size, speculative=draft)
    with progress(f"loading {options.model}"):
        return build(options)


def chat_messages(prompt: str, system: Optional[str]) -> list[dict]:
    head = [{"role": "system", "content": system}] if system else []
    return head + [{"role": "user", "content": prompt}]


# -- stats -------------------------------------------------------------------------

def completion_stats(c: Any, llm: LLM) -> dict[str, Any]:
    return {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "time_to_first_token_s": c.time_to_first_token_s,
        "decode_tokens_per_s": c.decode_tokens_per_s,
        # every decode step reads the weights once, whatever the batch size
        "bandwidth_gb_s": llm.weight_bytes_per_token * c.decode_tokens_per_s / 1e9,
        "peak_memory_bytes": c.peak_memory_bytes,
    }


def describe_kernels(llm: LLM) -> str:
    k = llm.kernels
    parts = []
    if k.quant != "none":
        parts.append(f"quantized: {k.quant}")
    parts.append("float: native GEMV" if k.gemv else "float: torch")
    if k.reason:
        parts.append(f"({k.reason})")
    return ", ".join(parts)


def describe_steps(llm: LLM) -> str:
    if llm.compiled:
        return f"compiled package {llm.compiled}"
    ran = "eager" if llm.compile == "none" else f"compiled in this process (compile={llm.compile})"
    pid = llm.exporting_package
    return ran if pid is None else f"{ran}; this machine's package is being exported in the background (pid {pid})"


def format_stats(completions: Sequence[Any], llm: LLM) -> str:
    """The stats block printed on stderr after a run."""
    first = completion_stats(completions[0], llm)
    n = len(completions)
    prompt_tokens = sum(c.prompt_tokens for c in completions)
    cached = sum(c.cached_tokens for c in completions)
    generated = sum(c.completion_tokens for c in completions)
    rate = first["decode_tokens_per_s"]
    batch = f" per sequence, {rate * n:.1f} total ({n} sequences)" if n > 1 else ""
    memory = timing.memory_source(llm.device)
    loaded = f"model load:           {llm.load_seconds:.2f} s"
    if llm.cache_path:
        loaded += f" ({'from' if llm.from_cache else 'converted, cached at'} {llm.cache_path})"
    return "\n".join([
        loaded,
        f"model steps:          {describe_steps(llm)}",
        f"weights:              {llm.weights_summary}",
        f"matmul kernels:       {describe_kernels(llm)}",
        f"kv cache:             {llm.max_batch_size} slot{'s' if llm.max_batch_size != 1 else ''} x "
        f"{llm.max_seq_len} positions, "
        f"{llm.engine.kv_dtype}, {llm.engine.cache_bytes:,} bytes ({llm.engine.cache_bytes / 1e6:.0f} MB), "
        "allocated once",
        f"prompt tokens:        {prompt_tokens:,}" + (f", {cached:,} from cache" if cached else ""),
        f"generated tokens:     {generated}",
        f"time to first token:  {first['time_to_first_token_s'] * 1e3:.1f} ms",
        f"decode:               {rate:.1f} tokens/s{batch}",
        f"bandwidth achieved:   {first['bandwidth_gb_s']:.2f} GB/s "
        f"({llm.weight_bytes_per_token / 1e6:.1f} MB of weights per token)",
        f"peak memory:          {first['peak_memory_bytes'] / 2**20:.1f} MiB ({memory})",
        *_speculation_stats(completions),
    ])


def _speculation_stats(completions: Sequence[Any]) -> list[str]:
    drafted = sum(c.draft_tokens for c in completions)
    if not drafted:
        return []
    accepted = sum(c.accepted_tokens for c in completions)
    per_forward = sum(c.completion_tokens for c in completions) / max(1, sum(c.target_forwards for c in completions))
    return [f"speculative:          {accepted}/{drafted} drafts accepted ({accepted / drafted:.0%}), "
            f"{per_forward:.2f} tokens per forward"]


# -- generate ----------------------------------------------------------------------

def cmd_generate(s: Any, as_json: bool) -> int:
    prompts = collect_prompts(s)
    if not prompts:
        raise FastDecodeError('no prompt given; pass one as an argument ("Tell me a joke"), '
                              'prompt=TEXT or prompt_file=PATH')
    if s.system is not None:
        check_utf8(s.system, "system")
    params, config = sampling_and_config(s)
    llm = load_model(s, batch_size=len(prompts))
    use_chat = s.chat if s.chat is not None else llm.tokenizer.chat_template is not None
    inputs = [llm.chat_prompt(chat_messages(p, s.system)) for p in prompts] if use_chat else prompts
    run = llm.start(inputs, params, config)

    # One prompt streams piece by piece; a batch prints each completion, in
    # prompt order, as soon as it and all before it have finished.
    stream_one = len(prompts) == 1 and not as_json
    texts = [""] * len(prompts)
    printed = 0
    steps = iter(run)
    # A compiled model compiles on its first step; show that wait, not a frozen terminal.
    compiling = llm.compile != "none"
    with progress(f"compiling ({llm.compile}) and prefilling", enabled=None if compiling else False):
        step = next(steps, None)
    while step is not None:
        if stream_one:
            _write(step.pieces[0])
        else:
            for b, piece in enumerate(step.pieces):
                texts[b] += piece
            while not as_json and printed < len(prompts) and step.finished[printed]:
                _write(f"--- [{printed + 1}/{len(prompts)}] ---\n{texts[printed]}\n")
                printed += 1
        step = next(steps, None)
    if stream_one:
        _write("\n")
    completions = run.completions
    if as_json:
        for p, c in zip(prompts, completions):
            obj = {"prompt": p, "text": c.text, "tokens": c.token_ids, "finish_reason": c.finish_reason,
                   "stats": completion_stats(c, llm)}
            _write(json.dumps(obj, ensure_ascii=False) + "\n")
    print(format_stats(completions, llm), file=sys.stderr)
    return 0


def _write(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


# -- chat ----------------------------------------------------------------------------

def cmd_chat(s: Any) -> int:
    from .repl import ChatSession, run_repl

    opening = collect_prompts(s)
    if s.system is not None:
        check_utf8(s.system, "system")
    if s.tp != 1:
        raise FastDecodeError(f"tp={s.tp}: chat runs in one process; tensor parallelism is for generate")
    params, config = sampling_and_config(s)
    llm = load_model(s, batch_size=1)
    if llm.tokenizer.chat_template is None:  # e.g. a base (pretrained) checkpoint
        raise FastDecodeError(f"{llm.source}: this checkpoint has no chat template, so chat cannot format turns; "
                              "prompt it as plain text with `fastdecode generate`")
    # A template that does not parse would fail every message, each as a notice, and leave with exit 0.
    compile_template(llm.tokenizer.chat_template)
    if config.max_new_tokens >= llm.max_seq_len:  # every message would be "too long"
        raise FastDecodeError(f"max_new_tokens={config.max_new_tokens} leaves no room for a message in this "
                              f"model's max_seq_len={llm.max_seq_len}; give max_new_tokens below {llm.max_seq_len}")
    session = ChatSession(llm, params, config, system=s.system)
    return run_repl(session, opening=opening)


# -- entry point -------------------------------------------------------------------------

_DISPATCH = {"bench": "fastdecode.bench.cli", "bench-engine": "fastdecode.bench.engine_load",
             "bench-spec": "fastdecode.bench.speculative",
             "export": "fastdecode.cli.export",
             "perplexity": "fastdecode.cli.perplexity", "serve": "fastdecode.server.cli"}
_USAGE = """usage: fastdecode [--version] {generate,chat,bench,bench-engine,bench-spec,export,perplexity,serve} ...

  generate   generate text for one or more prompts (fastdecode generate --help)
  chat       interactive multi-turn chat with the model's chat template
  bench      benchmarks
  bench-engine  concurrent requests through the engine (fastdecode bench-engine --help)
  bench-spec    speculative decoding on grounded and open-ended tasks (fastdecode bench-spec --help)
  export     export the compiled model step to a .pt2 package (fastdecode export --help)
  perplexity the model's perplexity on a text, as llama-perplexity (fastdecode perplexity --help)
  serve      an OpenAI-compatible HTTP server (fastdecode serve --help)"""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as every command's one line (exit 2) instead of usage and a message."""

    def error(self, message: str) -> NoReturn:
        options = [" ".join([a.option_strings[-1], *([a.metavar] if a.metavar else [])])
                   for a in self._actions if a.option_strings and a.dest != "help"]
        raise FastDecodeError(f"{message}; accepted: {', '.join(options)}, key=value and prompts")


def _command_parser(name: str) -> argparse.ArgumentParser:
    what = {"generate": "Generate text for one or more prompts.",
            "chat": "Chat with the model, one message per line on stdin; /reset clears the "
                    "history, /exit or end of input quits, Ctrl-C stops an answer."}[name]
    parser = _Parser(
        prog=f"fastdecode {name}", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=what + "\n\nSettings come from --config FILE, then key=value arguments, "
                           "which win. A plain argument is a prompt.",
        epilog="keys (key=value, default shown):\n" + describe_settings(GenerateSettings))
    parser.add_argument("--config", metavar="FILE", help="YAML file of key: value settings")
    if name == "generate":
        parser.add_argument("--json", action="store_true",
                            help="print one JSON object per prompt (text, tokens, finish reason, stats)")
        parser.add_argument("--print-config", action="store_true",
                            help="print a YAML config documenting every key with its default, and exit")
    parser.add_argument("args", nargs="*", metavar="key=value | PROMPT")
    return parser


def parse_command(name: str, argv: list[str]) -> tuple[Any, argparse.Namespace]:
    ns = _command_parser(name).parse_intermixed_args(argv)
    overrides = [a if is_override(a) else f"prompt={a}" for a in ns.args]
    return load_settings(GenerateSettings, overrides, ns.config), ns


def config_template() -> str:
    """configs/generate.yaml: every key commented out at its default, with its meaning."""
    out = ["# fastdecode generate / chat settings: fastdecode generate --config configs/generate.yaml",
           "# Every key is shown at its default (the defaults live in the Python dataclasses);",
           "# uncomment a line to change it. key=value arguments on the command line win over this file.",
           "# Regenerate with: fastdecode generate --print-config > configs/generate.yaml"]
    for f in dataclasses.fields(GenerateSettings):
        out.append("")
        for line in _wrap(f.metadata.get("help", ""), 86):
            out.append(f"# {line}")
        value = f.default
        out.append(f"# {f.name}: {json.dumps(list(value)) if isinstance(value, tuple) else _yaml(value)}")
    return "\n".join(out) + "\n"


def _yaml(value: Any) -> str:
    return "null" if value is None else format_value(value)


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width) or [""]


def _dispatch(name: str, argv: list[str]) -> int:
    module_name = _DISPATCH[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise FastDecodeError(f"'fastdecode {name}' is not available in this installation") from None
        raise
    return module.main(argv)


def run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else EXIT_USAGE
    if argv[0] == "--version":
        print(f"fastdecode {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name in _DISPATCH:
        return _dispatch(name, rest)
    if name not in ("generate", "chat"):
        raise FastDecodeError(f"unknown command {name!r}; accepted: generate, chat, {', '.join(_DISPATCH)}")
    settings, ns = parse_command(name, rest)
    if name == "chat":
        return cmd_chat(settings)
    if ns.print_config:
        _write(config_template())
        return 0
    return cmd_generate(settings, ns.json)


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    return exit_code(lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
