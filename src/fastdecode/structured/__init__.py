"""Constrained decoding: outputs that match a JSON schema, a regex, a choice or a grammar.

The grammar work is llguidance's (compile, per-token masks); this package holds
the one request type for every way of asking, and the engine's side of it.

The interface (also in /work/helpers/CONSTRAINT_API.md for the tools helper):

    from fastdecode.structured import Constraint, json_schema_lark

    Constraint(kind, spec)            frozen dataclass, validated on construction
                                      (FastDecodeError, one line, naming what was wrong)
      kind "json_schema"  spec: the schema as JSON text; Constraint.json_schema(x) takes a
                          dict, a bool, JSON text or a pydantic model class
      kind "json_object"  spec "": any JSON object      (Constraint.json_object())
      kind "regex"        spec: a pattern the whole output matches (Rust regex syntax)
      kind "choice"       spec: tuple of strings; the output is exactly one
      kind "grammar"      spec: Lark in llguidance's dialect, or GBNF (converted by llguidance)
    constraint.key                    sha256 of (kind, spec); with the vocabulary's
                                      fingerprint it keys the compiled-grammar cache
    json_schema_lark(schema) -> str   "%json {...}" with the same JSON options as a
                                      json_schema constraint, to embed in a Lark grammar
    schema_error(schema) -> str       '' or why the schema is invalid against its metaschema
                                      (json_schema constraints are checked so too)
    from_options(json_schema=, regex=, choice=, grammar=) -> Constraint | None

    SamplingParams(constraint=Constraint(...))    how a request carries it; LLM.generate/
        stream/chat take constraint= or json_schema= / regex= / choice= / grammar=.

What the engine does with a request's constraint:
- the output is constrained from its first generated token; the prompt is not parsed;
- each step, the row's logits outside the grammar's allowed tokens are set to -inf after
  penalties, bias and the EOS ban of min_new_tokens, before temperature/top-k/top-p;
  logprobs stay those of the raw distribution;
- EOS (the request's eos ids) is allowed exactly where the grammar accepts, and where the
  grammar names that token itself (e.g. `<|eom_id|>` closing a Llama tool call), which
  then ends the request; a grammar that can take no more tokens ends the request at once
  with finish_reason "stop";
  max_new_tokens or a stop string still end it first ("length", "stop");
- JSON is written with ", " and ": " and no other whitespace (runaway whitespace is
  impossible); JSON-schema keywords llguidance does not implement are errors, never ignored;
- speculative drafts are verified against the grammar (a draft it rejects is never kept);
  draft-model drafts are proposed unconstrained and verified the same way;
- with compile="generate", constrained rows decode one token per step outside the K-step
  graph (their masks depend on each sampled token); other rows keep the graph.

Lazy grammars (tool_choice=auto: free text until a marker, then constrained) are
grammars too: in llguidance's Lark, `hd[lazy]: /(.|\\n)*/ "<tool_call>"` matches as little
text as possible up to the marker, and a special token can be named as `<tool_call>`
(or `<[id]>`); see llguidance's docs/syntax.md ("Lazy lexemes", "Special tokens").

Limits (stated, enforced): a spec of at most MAX_SPEC_CHARS characters, at most
MAX_CHOICES choices, and llguidance's resource limits while compiling and masking
(constraint.parser_limits()); past them the constraint is refused with its reason.
"""

from .compiler import CACHE, GrammarCache, GrammarState, start_state
from .constraint import (JSON_OPTIONS, KINDS, MAX_CHOICES, MAX_SPEC_CHARS, OPTIONS, Constraint, from_options,
                         json_schema_lark, schema_error, schema_text)
from .vocab import Vocab, vocab_for

__all__ = ["Constraint", "KINDS", "OPTIONS", "JSON_OPTIONS", "MAX_SPEC_CHARS", "MAX_CHOICES", "from_options",
           "json_schema_lark", "schema_error", "schema_text", "GrammarCache", "GrammarState", "CACHE", "start_state",
           "Vocab", "vocab_for"]
