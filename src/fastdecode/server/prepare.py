"""Turning an OpenAI request into engine work: prompt ids, per-choice sampling, stopping.

OpenAI's defaults apply (temperature 1, completions' max_tokens 16), not
fastdecode's. Runs in a worker thread: tokenizing and rendering a chat
template are CPU work that should not stall the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from ..api.generate import prompt_names
from ..api.llm import LLM
from ..engine import GenerationConfig
from ..errors import FastDecodeError
from ..sampling import SamplingParams
from ..structured import Constraint, json_schema_lark
from ..text.harmony import MARKERS as HARMONY_MARKERS
from ..text.harmony import is_harmony
from .errors import APIError, from_fastdecode
from .protocol import ChatCompletionRequest, CompletionRequest, TokenizeRequest
from .reasoning import MARKERS as THINK_MARKERS
from .reasoning import inside_thinking, thinks
from .structured import prepare_constraint, request_constraint
from .tools.formats import ToolFormat
from .tools.formats import detect as detect_format
from .tools.formats import special_markers, special_tokens
from .tools.grammar import tool_constraint
from .tools.prompt import template_input
from .tools.spec import ToolSpec, tool_spec
from .tools.stream import ToolSetup

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_CHOICES = 128  # prompts x n in one request


@dataclass
class Job:
    """What one HTTP request asks of the engine. Choice c answers prompts[c // n]."""

    prompts: list[list[int]]
    n: int
    params: list[SamplingParams]  # one per choice
    config: GenerationConfig
    logprobs: Optional[int]  # alternatives per token when logprobs are asked for
    echo: bool = False  # completions: the prompt's text (and logprobs) before the generated ones
    drop: bool = False  # max_tokens=0 with echo: one token is generated, then dropped
    prompt_logprobs: Optional[int] = None  # vLLM's field: alternatives per prompt token
    tools: Optional[ToolSetup] = None  # chat with tool calls possible: how to read them from the reply
    # chat whose reply's <think> block is read apart: whether the reply starts inside it; None: not read
    thinking: Optional[bool] = None
    harmony: bool = False  # chat whose reply is gpt-oss's channels, read apart (harmony.py)

    @property
    def choice_prompts(self) -> list[list[int]]:
        return [p for p in self.prompts for _ in range(self.n)]

    @property
    def choice_names(self) -> list[str]:
        """How the engine's errors name each choice's prompt, as `generate` names them."""
        return [name for name in prompt_names(len(self.prompts)) for _ in range(self.n)]

    @property
    def prompt_tokens(self) -> int:
        """Usage counts each prompt once, however many choices it has (as OpenAI does)."""
        return sum(len(p) for p in self.prompts)


def prepare_completion(req: CompletionRequest, llm: LLM, max_tokens_limit: Optional[int]) -> Job:
    echo = bool(req.echo)
    if echo and req.stream:
        raise APIError(400, "echo is not supported with stream=true", param="echo")
    drop = req.max_tokens == 0
    if drop and not echo:
        raise APIError(400, "max_tokens=0 is only accepted with echo=true (the prompt's logprobs); "
                       "accepted otherwise: an integer >= 1", param="max_tokens")
    try:
        prompts = llm.encode_prompts(req.prompt)
    except FastDecodeError as e:
        raise from_fastdecode(e, param="prompt") from None
    return _job(req, prompts, llm, max_tokens_limit, req.max_tokens,
                COMPLETIONS_DEFAULT_MAX_TOKENS, req.logprobs, "prompt", echo=echo, drop=drop)


def prepare_chat(req: ChatCompletionRequest, llm: LLM, max_tokens_limit: Optional[int],
                 reasoning: bool = True) -> Job:
    """reasoning: read a thinking template's <think> block, or a harmony reply's analysis channel, into
    reasoning_content."""
    if llm.tokenizer.chat_template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions with a plain prompt",
                       param="messages")
    if req.top_logprobs and not req.logprobs:  # 0 asks for nothing (vLLM's default, which clients send)
        raise APIError(400, f"top_logprobs={req.top_logprobs} needs logprobs=true", param="top_logprobs")
    spec = tool_spec(req.tools, req.tool_choice, req.parallel_tool_calls)
    template = llm.tokenizer.template_for(spec is not None)
    fmt = detect_format(template)
    answer = _tool_answer(spec, request_constraint(req), fmt)
    messages, tools = template_input(req.messages, fmt, spec)
    try:
        prompt = llm.chat_prompt(messages, tools=tools, template_kwargs=template_kwargs(req),
                                 **template_flags(req))
    except FastDecodeError as e:
        raise APIError(400, str(e), param="messages") from None
    if not prompt:
        raise APIError(400, "the messages render to an empty prompt", param="messages")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    top = (req.top_logprobs or 0) if req.logprobs else None
    setup, constraint, specials = None, None, {}
    if spec is not None:
        setup = ToolSetup(fmt, spec)
        specials = special_markers(fmt, llm.tokenizer)
        constraint = tool_constraint(fmt, spec, llm.tokenizer, specials, answer)
    # A reply constrained to a format (JSON, a grammar, calls from its first token) is that
    # format, never thinking; tool_choice auto leaves the reply free until its calls.
    thinking = None
    free = request_constraint(req) is None and (spec is None or spec.choice == "auto")
    harmony = reasoning and is_harmony(template)
    if harmony:  # channels, whatever the constraint: a reply without a header is all answer
        specials = {**specials, **special_tokens(HARMONY_MARKERS, llm.tokenizer)}
    elif reasoning and thinks(template) and free:
        thinking = inside_thinking(llm.tokenizer.decode(prompt[-8:], skip_special_tokens=False))
        specials = {**specials, **special_tokens(THINK_MARKERS, llm.tokenizer)}
    # Markers that are special tokens ([TOOL_CALLS], a <think> some vocabularies make special) are
    # read from the text: it keeps them.
    job = _job(req, [prompt], llm, max_tokens_limit, max_tokens, None, top, "messages", constraint=constraint,
               skip_special_tokens=not specials)
    job.tools, job.thinking, job.harmony = setup, thinking, harmony
    return job


def _tool_answer(spec: Optional[ToolSpec], asked: Optional[Constraint], fmt: ToolFormat) -> Optional[str]:
    """With tools and a JSON response_format (as OpenAI's Agents SDK sends for an agent with an
    output type), the reply is calls or that JSON: the JSON's grammar rule under tool_choice auto.
    Required or named calls are the whole reply, so the format has nothing to hold there."""
    if spec is None or asked is None or spec.choice != "auto":
        return None
    if asked.kind not in ("json_schema", "json_object") or fmt.channels:
        what = "a regex, choice or grammar" if asked.kind not in ("json_schema", "json_object") \
            else f"a JSON answer in the {fmt.name} tool format"
        raise APIError(400, f"tool_choice 'auto' cannot be combined with {what}; accepted with tools: a JSON "
                       "response_format (json_schema or json_object), or tool_choice 'none', 'required' or a "
                       "named function", param="tool_choice")
    return json_schema_lark(asked.spec if asked.kind == "json_schema" else {"type": "object"})


# What the server itself hands every chat template.
_RESERVED = ("messages", "tools", "add_generation_prompt")


def template_flags(req: Union[ChatCompletionRequest, TokenizeRequest]) -> dict[str, bool]:
    """add_generation_prompt and continue_final_message as the renderer takes them (null: the default)."""
    add = req.add_generation_prompt is not False
    cont = bool(req.continue_final_message)
    if add and cont:
        if req.add_generation_prompt is not None and "add_generation_prompt" in req.model_fields_set:
            raise APIError(400, "continue_final_message continues the final message, so it needs "
                           "add_generation_prompt false; accepted: one of them true", param="continue_final_message")
        add = False  # asked only to continue: the generation prompt is off by that alone
    return {"add_generation_prompt": add, "continue_final_message": cont}


def template_kwargs(req: Union[ChatCompletionRequest, TokenizeRequest]) -> dict[str, Any]:
    """A request's chat_template_kwargs, and its reasoning_effort, as the template's variables; a
    name the server sets itself, or a reasoning_effort given twice apart, is a 400."""
    given = dict(req.chat_template_kwargs or {})
    for name in given:
        if name in _RESERVED:
            raise APIError(400, f"chat_template_kwargs may not set {name!r} (the server sets "
                           f"{', '.join(_RESERVED)}); give it in its own field", param="chat_template_kwargs")
    if req.reasoning_effort is not None:
        if given.get("reasoning_effort", req.reasoning_effort) != req.reasoning_effort:
            raise APIError(400, f"reasoning_effort is {req.reasoning_effort!r} but chat_template_kwargs sets it to "
                           f"{given['reasoning_effort']!r:.40}; give one", param="reasoning_effort")
        given["reasoning_effort"] = req.reasoning_effort
    return given


def _job(req: Union[ChatCompletionRequest, CompletionRequest], prompts: list[list[int]], llm: LLM,
         limit: Optional[int], asked: Optional[int], default: Optional[int], logprobs: Optional[int],
         prompt_param: str, echo: bool = False, drop: bool = False, constraint: Optional[Constraint] = None,
         skip_special_tokens: bool = True) -> Job:
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")
    n = req.n or 1
    if len(prompts) * n > MAX_CHOICES:
        raise APIError(400, f"{len(prompts)} prompts x n={n} is {len(prompts) * n} choices; at most "
                       f"{MAX_CHOICES} are accepted in one request", param="n")
    # Errors name the field the client sent: chat's max_completion_tokens (OpenAI's current name) wins.
    field = ("max_completion_tokens" if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens
             is not None else "max_tokens")
    # echo's max_tokens=0: the engine generates one token (never fed back, so a prompt filling
    # the whole context fits), which the reply drops
    max_tokens = max(_max_tokens(prompts, llm.max_seq_len, limit, asked, default, prompt_param, field), int(drop))
    if constraint is None:  # tools bring their own
        constraint = prepare_constraint(req, llm.tokenizer)
    names = {"max_new_tokens": field, "min_new_tokens": "min_tokens", "logprobs": "top_logprobs"
             if isinstance(req, ChatCompletionRequest) else "logprobs"}
    try:
        config = GenerationConfig(max_new_tokens=max_tokens, min_new_tokens=min(req.min_tokens or 0, max_tokens),
                                  stop=req.stop, ignore_eos=bool(req.ignore_eos), cache_salt=req.cache_salt,
                                  skip_special_tokens=skip_special_tokens and req.skip_special_tokens is not False)
        seeds = [None if req.seed is None else req.seed + j for j in range(n)]
        # The engine computes prompt logprobs once, with as many alternatives as either use needs.
        wants = [k for k in (logprobs if echo else None, req.prompt_logprobs) if k is not None]
        scored = max(wants) if wants else None
        # Ranks only for vLLM's prompt_logprobs: echo's output has none.
        ranks = req.prompt_logprobs is not None
        params = [_sampling(req, seed, logprobs, scored, constraint, ranks) for _ in prompts for seed in seeds]
    except FastDecodeError as e:
        raise from_fastdecode(e, names) from None
    return Job(prompts, n, params, config, logprobs, echo=echo, drop=drop, prompt_logprobs=req.prompt_logprobs)


def _sampling(req: Union[ChatCompletionRequest, CompletionRequest], seed: Optional[int],
              logprobs: Optional[int], prompt_logprobs: Optional[int] = None,
              constraint: Optional[Constraint] = None, ranks: bool = True) -> SamplingParams:
    def given(value, default):
        return default if value is None else value

    return SamplingParams(
        temperature=given(req.temperature, 1.0), top_p=given(req.top_p, 1.0),
        top_k=req.top_k if req.top_k is not None and req.top_k > 0 else None,
        min_p=given(req.min_p, 0.0), repetition_penalty=given(req.repetition_penalty, 1.0),
        frequency_penalty=given(req.frequency_penalty, 0.0), presence_penalty=given(req.presence_penalty, 0.0),
        seed=seed, logit_bias=req.logit_bias or None, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
        constraint=constraint, prompt_logprob_ranks=ranks)


def _max_tokens(prompts: list[list[int]], context: int, limit: Optional[int], asked: Optional[int],
                default: Optional[int], param: str, field: str = "max_tokens") -> int:
    """The request's max_tokens (sent as `field`), or the default that fits, with the context checked."""
    longest = max(len(p) for p in prompts)
    if asked is not None and limit is not None and asked > limit:
        raise APIError(400, f"{field}={asked} is over this server's limit of {limit}", param=field)
    room = context - longest
    if room < 1 and not (asked == 0 and room == 0):  # 0: echo's prompt alone
        raise APIError(400, f"the prompt has {longest} tokens, but this model's context is {context} tokens "
                       "(prompt and completion together): shorten the prompt", param=param,
                       code="context_length_exceeded")
    if asked is None:
        return min(room, default or room, limit or room)
    if asked > room:
        raise APIError(400, f"this model's context is {context} tokens, but the prompt has {longest} tokens; "
                       f"with {field}={asked} it needs {longest + asked}: at most {room} tokens fit after "
                       f"this prompt, so lower {field} or shorten the prompt", param=param,
                       code="context_length_exceeded")
    return asked
