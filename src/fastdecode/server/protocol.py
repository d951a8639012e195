"""Request and response shapes of the OpenAI-compatible API, as pydantic models.

Requests are parsed strictly (a string is not a number, a number is not a
string) and unknown fields are ignored, as OpenAI does. Ranges that name an
OpenAI field are checked here so errors name it; the engine's dataclasses
check again when the request is translated (prepare.py).
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictStr, ValidationInfo, field_validator, model_serializer,
                      model_validator)

from ..sampling import MAX_LOGPROBS

MAX_N = 16  # choices per prompt
MAX_STOP = 16  # stop strings per request
INT64 = 2 ** 63


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_In):
    include_usage: Optional[bool] = False


class _Sampling(_In):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0, allow_inf_nan=False)
    top_p: Optional[float] = Field(default=None, ge=0, le=1)
    top_k: Optional[int] = Field(default=None, ge=-1)  # 0 and -1 mean no limit (llama.cpp, vLLM)
    min_p: Optional[float] = Field(default=None, ge=0, lt=1)
    presence_penalty: Optional[float] = Field(default=None, ge=-2, le=2)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2, le=2)
    repetition_penalty: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    seed: Optional[int] = Field(default=None, ge=-INT64, lt=INT64)
    stop: Any = None  # a string or a list of strings (checked below, for a clear message)
    n: Optional[int] = Field(default=None, ge=1, le=MAX_N)
    logit_bias: Optional[dict[str, float]] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    # fastdecode's own (vLLM's names): EOS is suppressed until min_tokens exist, or ignored.
    min_tokens: Optional[int] = Field(default=None, ge=0)
    ignore_eos: Optional[bool] = False
    # vLLM's: requests share cached prompt prefixes only with requests of the same salt.
    cache_salt: Optional[StrictStr] = None
    # vLLM's: each prompt token's logprob with this many alternatives, in a top-level
    # `prompt_logprobs` list per choice (see PromptLogprob).
    prompt_logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # vLLM's: false keeps special tokens' text in the reply (markers the server reads are kept anyway).
    skip_special_tokens: Optional[bool] = None
    # -- structured outputs (constrain helper): mapped to one Constraint by server/structured.py.
    # Loosely typed here so that structured.py's messages name exactly what is wrong.
    response_format: Any = None  # OpenAI: {"type": "text" | "json_object" | "json_schema", ...}
    structured_outputs: Any = None  # vLLM: {"json" | "regex" | "choice" | "grammar" | "json_object": ...}
    guided_json: Any = None  # vLLM's older top-level names for the same
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    json_schema: Any = None  # llama.cpp: a schema
    grammar: Any = None  # llama.cpp: GBNF (Lark is accepted too)
    # -- end of structured outputs

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Any) -> tuple[str, ...]:
        if v is None:
            return ()
        if isinstance(v, str):
            return (v,)
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise ValueError(f"must be a string or a list of strings, got {_short(v)}")
        if len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings are accepted, got {len(v)}")
        return tuple(v)


class CompletionRequest(_Sampling):
    prompt: Any  # str, list[str], list[int] or list[list[int]]: checked below, for one clear message

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Union[str, list[str], list[int], list[list[int]]]:
        def ids(x: Any) -> bool:
            return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

        if isinstance(v, str) or (isinstance(v, list) and v and (
                all(isinstance(p, str) for p in v) or ids(v) or all(ids(p) for p in v))):
            return v
        raise ValueError("must be a string, a non-empty list of strings, a list of token ids or a list "
                         f"of token id lists, got {_short(v)}")
    logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: Optional[bool] = False
    max_tokens: Optional[int] = Field(default=None, ge=0)  # 0: only with echo (the prompt's logprobs)
    # OpenAI's, not run here: named so that a request using them fails instead of being
    # answered as if they were absent.
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: Optional[str]) -> Optional[str]:
        if v:
            raise ValueError("is not supported (no fill-in-the-middle); accepted: null or an empty string")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v != 1:
            raise ValueError(f"is not supported (got {v}); accepted: 1 or leave it out, and use n for several choices")
        return v


class FunctionCallIn(_In):
    name: StrictStr
    arguments: Any = "{}"  # OpenAI's JSON string; an object is taken too

    @field_validator("arguments")
    @classmethod
    def _arguments(cls, v: Any) -> Any:
        if isinstance(v, (str, dict)):
            return v
        raise ValueError(f"must be a JSON string (or an object), got {_short(v)}")


class ToolCallIn(_In):
    """A call in an earlier assistant message, sent back for the next turn."""

    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_In):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = Field(default=None, validate_default=True)  # _text: an assistant's missing one reads as ""
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCallIn]] = None  # assistant messages; content may then be null
    tool_call_id: Optional[StrictStr] = None  # tool messages: the call this is the result of
    # OpenAI's deprecated form of tool_calls: named so that a history using it fails instead of
    # losing the call.
    function_call: Any = None

    @field_validator("function_call")
    @classmethod
    def _function_call(cls, v: Any) -> None:
        return _refuse_deprecated(v, "tool_calls", '[{"id": ..., "type": "function", "function": '
                                  '{"name": ..., "arguments": ...}}]')

    @model_validator(mode="after")
    def _tool_fields(self) -> "ChatMessage":
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id: the id of the call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls is only accepted on assistant messages, not on {self.role}")
        return self

    @field_validator("content")
    @classmethod
    def _text(cls, v: Any, info: ValidationInfo) -> str:
        """A string, or a list of text parts joined by newlines (None, or no content: an assistant
        turn with no text; any other role's is an error). An assistant's refusal parts (OpenAI's, sent
        back with the history) are its text too."""
        role = info.data.get("role")
        if v is None and role is not None and role != "assistant":
            raise ValueError(f"a {role} message needs content (a string or a list of text parts)")
        if v is None or isinstance(v, str):
            return v or ""
        if not isinstance(v, list):
            raise ValueError('must be a string or a list of text parts {"type": "text", "text": "..."}, '
                             f"got {_short(v)}")
        texts = []
        for i, part in enumerate(v):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "refusal" and info.data.get("role") == "assistant" and isinstance(part.get("refusal"), str):
                texts.append(part["refusal"])
                continue
            if kind != "text" or not isinstance(part.get("text"), str):
                # Name the part: an image or audio part is the usual one, and the model reads text only.
                what = f"has type {kind!r}" if kind not in (None, "text") else f"is {_short(part)}"
                raise ValueError(f'part {i} {what}; accepted: text parts {{"type": "text", "text": "..."}} '
                                 "(this server reads text only)")
            texts.append(part["text"])
        return "\n".join(texts)


class FunctionDefinition(_In):
    name: StrictStr
    description: Optional[StrictStr] = None
    parameters: Any = None  # a JSON Schema: checked in tools/spec.py
    strict: Optional[bool] = None


class ToolDefinition(_In):
    type: Literal["function"]
    function: FunctionDefinition


# OpenAI's values; a template that reads the variable takes what it knows (gpt-oss: low, medium, high).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: Optional[list[ToolDefinition]] = None
    tool_choice: Any = None  # none | auto | required | {"type": "function", ...}: checked in tools/spec.py
    parallel_tool_calls: Optional[bool] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # vLLM's: variables for the template
    reasoning_effort: Optional[ReasoningEffort] = None  # OpenAI's: the template's `reasoning_effort` (gpt-oss's)
    # vLLM's: the template's generation prompt, or the final message left open to be continued
    add_generation_prompt: Optional[bool] = True
    continue_final_message: Optional[bool] = False
    # OpenAI's deprecated forms of tools and tool_choice: named so that a request using them fails
    # with where they go now, instead of being answered as if no function were offered.
    functions: Any = None
    function_call: Any = None

    @field_validator("functions")
    @classmethod
    def _functions(cls, v: Any) -> None:
        return _refuse_deprecated(v, "tools", '[{"type": "function", "function": {...}}]')

    @field_validator("function_call")
    @classmethod
    def _function_call(cls, v: Any) -> None:
        return _refuse_deprecated(v, "tool_choice", '("none", "auto", "required" or {"type": "function", '
                                  '"function": {"name": ...}})')


def _refuse_deprecated(v: Any, modern: str, form: str) -> None:
    """A field OpenAI deprecated in favour of `modern` (given as `form`): only its absence is accepted."""
    if v is not None:
        raise ValueError(f"is the deprecated form of {modern}; accepted: {modern} {form}")
    return v


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- responses -------------------------------------------------------------------------

class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens reused from the prefix cache, not prefilled


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: Optional[PromptTokensDetails] = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]
    refusal: None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[Optional[float]]  # null for the first prompt token (echo)
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class PromptLogprob(BaseModel):
    """vLLM's prompt_logprobs entry: one per candidate token, keyed by its id (a JSON string):
    the prompt token itself and the most likely alternatives. `prompt_logprobs` is a list of
    one null (the first prompt token) then one {token_id: PromptLogprob} per prompt token."""

    logprob: float
    rank: int  # 1 + tokens more likely
    decoded_token: str


PromptLogprobs = list[Optional[dict[str, PromptLogprob]]]


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str]  # null when the reply is tool calls only
    tool_calls: Optional[list[ToolCall]] = None
    reasoning_content: Optional[str] = None  # the thinking of a model that thinks in <think> blocks

    @model_serializer(mode="wrap")
    def _present_when_made(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for key in ("tool_calls", "reasoning_content"):
            if getattr(self, key) is None:
                out.pop(key, None)
        return out


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None
    prompt_logprobs: Optional[PromptLogprobs] = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: Optional[str] = None
    # vLLM's place for chat (one prompt for every choice); each choice carries the same list too.
    prompt_logprobs: Optional[PromptLogprobs] = None


class FunctionDelta(BaseModel):
    name: Optional[str] = None
    arguments: Optional[str] = None


class ToolCallDelta(BaseModel):
    """A streamed call: its first chunk has index, id, type and name; later ones argument fragments."""

    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: FunctionDelta

    @model_serializer(mode="wrap")
    def _present(self, handler: Any) -> dict[str, Any]:
        return _without_none(handler(self))


class Delta(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCallDelta]] = None

    @model_serializer(mode="wrap")
    def _present(self, handler: Any) -> dict[str, Any]:  # OpenAI leaves unset delta fields out
        return _without_none(handler(self))


def _without_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _without_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [_without_none(v) for v in d]
    return d


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None
    prompt_logprobs: Optional[PromptLogprobs] = None  # on the choice's last chunk


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None
    system_fingerprint: Optional[str] = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    prompt_logprobs: Optional[PromptLogprobs] = None


class TextCompletion(BaseModel):
    """A /v1/completions response; streamed chunks have the same shape (usage: null)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None
    system_fingerprint: Optional[str] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "fastdecode"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeRequest(_In):
    """POST /tokenize: `prompt` (text) or `messages` (rendered with the chat template as
    /v1/chat/completions renders them), exactly one."""

    model: Optional[str] = None
    prompt: Optional[StrictStr] = None
    messages: Optional[list[ChatMessage]] = Field(default=None, min_length=1)
    tools: Optional[list[ToolDefinition]] = None  # with messages: offered as /v1/chat/completions offers them
    chat_template_kwargs: Optional[dict[str, Any]] = None  # with messages: as /v1/chat/completions takes them
    reasoning_effort: Optional[ReasoningEffort] = None
    add_generation_prompt: Optional[bool] = True  # with messages: as /v1/chat/completions takes them
    continue_final_message: Optional[bool] = False
    add_special_tokens: Optional[bool] = True


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeRequest(_In):
    model: Optional[str] = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfo(BaseModel):
    """GET /tokenizer_info: vLLM's field names, which lm-eval's remote tokenizer reads."""

    tokenizer_class: str
    eos_token: Optional[str] = None
    bos_token: Optional[str] = None
    pad_token: Optional[str] = None
    eos_token_id: Optional[int] = None
    bos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    chat_template: Optional[str] = None
    model_max_length: int
    max_model_len: int
    vocab_size: int
    add_bos_token: bool


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
