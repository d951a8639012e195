"""`Constraint`: what a request's output must match, validated once when built.

The grammar itself is llguidance's: this module only turns each kind into the
library's grammar text and asks the library whether it is valid (without a
tokenizer, so a bad spec fails before any engine sees it).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional, Union

from ..errors import FastDecodeError

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
# The stated limits on a spec: its text, and the work llguidance may spend compiling it
# (LIMITS below; its lexer fuel is ~50k units per ms, so 1M is ~20 ms of regex analysis).
MAX_SPEC_CHARS = 256 * 1024
MAX_CHOICES = 4096
# JSON is written as json.dumps writes it by default (", " and ": ", no other whitespace),
# so a model cannot run on as whitespace (vLLM #38696). Unimplemented keywords are errors.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": False}


def parser_limits():
    """llguidance's resource limits for compiling and masking (its defaults, stated here)."""
    import llguidance

    return llguidance.LLParserLimits(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000,
                                     max_grammar_size=500_000, max_lexer_states=250_000, verbose_errors=False)


@dataclass(frozen=True)
class Constraint:
    """A request's output must match this.

    kind: json_schema | json_object | regex | choice | grammar.
    spec: json_schema: the schema as JSON text (build with Constraint.json_schema to pass a
        dict or a pydantic model); regex: the pattern (Rust regex syntax, the whole output
        must match); choice: a tuple of strings, the output is exactly one of them;
        grammar: a Lark grammar in llguidance's dialect (which may embed `%json {...}`,
        special tokens as `<name>`, and `[lazy]` rules for free text until a marker) or a
        GBNF grammar (llama.cpp's; converted by llguidance); json_object: empty.
    """

    kind: str
    spec: Union[str, tuple[str, ...]] = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise FastDecodeError(f"unknown constraint kind {self.kind!r}; accepted: {', '.join(KINDS)}")
        if self.kind == "choice":
            object.__setattr__(self, "spec", _choices(self.spec))
        elif not isinstance(self.spec, str):
            raise FastDecodeError(f"{self.kind} must be a string, got {type(self.spec).__name__}")
        size = len(self.spec) if isinstance(self.spec, str) else sum(len(c) for c in self.spec)
        if size > MAX_SPEC_CHARS:
            raise FastDecodeError(f"{self.kind} has {size} characters; accepted: at most {MAX_SPEC_CHARS}")
        if self.kind in ("regex", "grammar") and not self.spec.strip():
            raise FastDecodeError(f"{self.kind} is empty; accepted: a non-empty {self.kind}")
        if self.kind == "json_schema":
            _check_schema_text(self.spec)
        error = _validate(self.kind, self.spec)
        if error:
            raise FastDecodeError(error)

    # -- constructors ---------------------------------------------------------------

    @classmethod
    def json_schema(cls, schema: Any) -> "Constraint":
        """From a schema as a dict, a bool, JSON text, or a pydantic model class."""
        return cls("json_schema", schema_text(schema))

    @classmethod
    def json_object(cls) -> "Constraint":
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: Any) -> "Constraint":
        return cls("choice", options)

    @classmethod
    def grammar(cls, text: str) -> "Constraint":
        return cls("grammar", text)

    # -- what the engine uses -------------------------------------------------------

    @property
    def key(self) -> str:
        """A hash of the kind and spec: compiled grammars are cached by it (and the tokenizer)."""
        return _key(self.kind, self.spec)

    def grammar_text(self) -> str:
        """The llguidance grammar (its JSON form) this constraint compiles to."""
        return _grammar(self.kind, self.spec)


# json.loads recurses once per level of nesting: text nested past Python's limit raises RecursionError.
_TOO_DEEP = "json_schema is not valid JSON: it is nested too deeply to parse"


def schema_text(schema: Any) -> str:
    """A JSON schema as compact JSON text, its key order kept (it is the output's order)."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):  # a pydantic model class
        schema = schema.model_json_schema()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise FastDecodeError(f"json_schema is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") \
                from None
        except RecursionError:
            raise FastDecodeError(_TOO_DEEP) from None
    _schema_object(schema)
    try:
        return json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise FastDecodeError(f"json_schema is not JSON-serializable: {e}") from None


def json_schema_lark(schema: Any) -> str:
    """`%json {...}` for embedding a schema in a Lark grammar, with the same JSON
    options (no free whitespace, strict keywords) as a json_schema constraint."""
    parsed = _formats_as_annotations(_schema_object(json.loads(schema_text(schema))))
    parsed = {**parsed, "x-guidance": {**JSON_OPTIONS}}
    return "%json " + json.dumps(parsed, ensure_ascii=False)


# The API's keyword options that build a Constraint (name: what it takes, for the signatures).
OPTIONS = {"json_schema": "dict | str | pydantic model class", "regex": "str", "choice": "list[str]",
           "grammar": "str (Lark or GBNF)"}


def from_options(json_schema: Any = None, regex: Optional[str] = None, choice: Any = None,
                 grammar: Optional[str] = None, json_object: bool = False) -> Optional[Constraint]:
    """The one Constraint the API's keyword options ask for (None if none); more than one fails."""
    given = {k: v for k, v in (("json_schema", json_schema), ("regex", regex), ("choice", choice),
                               ("grammar", grammar)) if v is not None}
    if json_object:
        given["json_object"] = True
    if len(given) > 1:
        raise FastDecodeError(f"give at most one of json_schema, regex, choice, grammar; got {', '.join(given)}")
    if not given:
        return None
    kind, value = next(iter(given.items()))
    if kind == "json_schema":
        return Constraint.json_schema(value)
    if kind == "json_object":
        return Constraint.json_object()
    return Constraint(kind, value)


# -- validation and compilation (cached: requests repeat their specs) ------------------

def _choices(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise FastDecodeError(f"choice must be a list of strings, got {type(value).__name__}")
    if not value:
        raise FastDecodeError("choice is empty; accepted: a non-empty list of strings")
    bad = [c for c in value if not isinstance(c, str)]  # a list: a null option is bad too
    if bad:
        raise FastDecodeError(f"choice must hold only strings, got {bad[0]!r}")
    if len(value) > MAX_CHOICES:
        raise FastDecodeError(f"choice has {len(value)} options; accepted: at most {MAX_CHOICES}")
    return tuple(value)


def _check_schema_text(text: str) -> None:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise FastDecodeError(f"json_schema is not valid JSON: {e.msg}") from None
    except RecursionError:
        raise FastDecodeError(_TOO_DEEP) from None
    _schema_object(schema)


def _schema_object(schema: Any) -> dict:
    """A parsed schema as an object: JSON Schema's `true` (any value) is `{}`; `false`, which no
    value matches, is refused (llguidance takes neither)."""
    if schema is True:
        return {}
    if schema is False:
        raise FastDecodeError("json_schema is false, which no value matches; accepted: an object schema, "
                              "or true for any JSON value")
    if not isinstance(schema, dict):
        raise FastDecodeError(f"json_schema must be a JSON object (or true/false), got {type(schema).__name__}")
    return schema


# Keywords whose value is a subschema or a list of them ("items": either), or a map of names to them.
_SUBSCHEMAS = ("items", "additionalItems", "additionalProperties", "not", "if", "then", "else", "contains",
               "propertyNames", "unevaluatedItems", "unevaluatedProperties", "anyOf", "oneOf", "allOf", "prefixItems")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _formats_as_annotations(schema: Any) -> Any:
    """`schema` (freshly parsed: changed in place) without the string formats llguidance does not
    implement: JSON Schema makes `format` an annotation unless a validator opts in to asserting
    it, and llguidance refuses a format it does not know (pydantic's SecretStr is "password",
    bytes "binary", Path "path"; OpenAPI's "uri-reference"), where the formats it knows it
    enforces. A loop, not recursion: a schema may nest past Python's recursion limit (llguidance
    then refuses it in one line)."""
    todo = [schema]
    while todo:
        s = todo.pop()
        if not isinstance(s, dict):
            continue
        if isinstance(s.get("format"), str) and not _known_format(s["format"]):
            del s["format"]
        for k in _SUBSCHEMAS:
            v = s.get(k)
            todo.extend(v if isinstance(v, list) else [v])
        for k in _MAPS:
            if isinstance(s.get(k), dict):
                todo.extend(s[k].values())
    return schema


@functools.lru_cache(maxsize=64)
def _known_format(name: str) -> bool:
    from llguidance import LLMatcher

    grammar = LLMatcher.grammar_from_json_schema(json.dumps({"type": "string", "format": name}))
    return not LLMatcher.validate_grammar(grammar, None, limits=parser_limits())


@functools.lru_cache(maxsize=512)
def _key(kind: str, spec: Union[str, tuple[str, ...]]) -> str:
    text = json.dumps([kind, spec], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=512)
def _grammar(kind: str, spec: Union[str, tuple[str, ...]]) -> str:
    import llguidance
    from llguidance import LLMatcher

    if kind == "json_schema":
        schema = _formats_as_annotations(_schema_object(json.loads(spec)))  # JSON Schema's true: {}, any value
        return LLMatcher.grammar_from_json_schema(json.dumps(schema, ensure_ascii=False), overrides=JSON_OPTIONS)
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema('{"type":"object"}', overrides=JSON_OPTIONS)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec))
    try:
        return llguidance.grammar_from("grammar", spec)  # Lark as is; GBNF converted to Lark
    except ValueError as e:  # the GBNF converter's message
        raise _GrammarError(str(e)) from None


class _GrammarError(Exception):
    pass


@functools.lru_cache(maxsize=512)
def _validate(kind: str, spec: Union[str, tuple[str, ...]]) -> str:
    """'' if llguidance accepts the spec, else a one-line error naming the kind."""
    from llguidance import LLMatcher

    try:
        grammar = _grammar(kind, spec)
    except _GrammarError as e:  # neither Lark nor GBNF
        detail = str(e).replace("Failed to convert the grammar from GBNF to Lark: ", "")
        return f"grammar is neither Lark nor valid GBNF: {one_line(detail)}"
    except ValueError as e:  # grammar_from_json_schema on text that is not a JSON object
        return f"{kind}: {one_line(str(e))}"
    error = LLMatcher.validate_grammar(grammar, None, limits=parser_limits())
    if not error:
        # After llguidance, whose limits refuse a schema nested deeper than jsonschema can recurse.
        return schema_error(json.loads(spec)) if kind == "json_schema" else ""
    what = {"json_schema": "json_schema is not supported or not valid",
            "json_object": "json_object", "regex": f"regex {_short(spec)} does not compile",
            "choice": "choice", "grammar": "grammar has an error"}[kind]
    return f"{what}: {one_line(error)}"


def schema_error(schema: Any) -> str:
    """'' if `schema` is valid against its draft's metaschema ($schema's, else 2020-12's), else why
    not, on one line. llguidance compiles some invalid schemas and ignores the bad keyword there (a
    negative multipleOf): the output would be unconstrained by it, and no validator could check it."""
    import jsonschema

    schema = _schema_object(schema)
    try:
        # No format checks: they would hold `pattern` to Python's regex syntax (no \p{L}); llguidance
        # compiles the patterns, and names one it cannot.
        jsonschema.validators.validator_for(schema).check_schema(schema, format_checker=None)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        message = e.message if len(e.message) <= 200 else e.message[:197] + "..."  # it quotes the bad value
        return f"json_schema is not a valid JSON Schema: {one_line(message)}" + (f" (at {where})" if where else "")
    except RecursionError:
        return "json_schema is nested too deeply to check"
    return ""


def one_line(message: str) -> str:
    """llguidance's messages on one line: the source echo and caret lines dropped."""
    keep = []
    for line in message.splitlines():
        s = line.strip()
        if not s or set(s) <= set("^ ~|") or (s[:1].isdigit() and " | " in s[:8]):
            continue
        keep.append(s.replace("<non-verbose/>", "").strip())  # the tag of verbose_errors=False
    return " ".join(k for k in keep if k) or message.strip()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
