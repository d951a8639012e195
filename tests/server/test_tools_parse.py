"""Reading tool calls back from a reply (no model): every format, whole and in any pieces,
text before the calls, replies cut short, and the markers never in the content."""

import itertools
import json
import random

import pytest

from fastdecode.server.tools.formats import FORMATS, GENERIC, HERMES, LLAMA3_JSON, detect
from fastdecode.server.tools.parse import Arguments, CallParser, CallStart, Content, parse_reply
from fastdecode.server.tools.stream import to_deltas

NAMES = ["get_weather", "add", "noop"]
# Arguments as json.dumps writes them with the templates' separators: strings with quotes,
# braces and escapes, nesting, unicode, and scalars (a schema need not be an object).
ARGS = [
    {"city": 'Paris "15e" {arr.}', "days": 3, "units": ["c", {"k": [1, 2]}]},
    {"x": -1.5e-3, "y": 2, "note": "back\\slash \u00e9\u65e5 \n tab\t"},
    {},
    "just a string",
    42,
    None,
]


def dumps(value):
    return json.dumps(value, ensure_ascii=False)


def calls_text(fmt, calls):
    return fmt.render([(name, dumps(args)) for name, args in calls])


def pieces_of(text, rng, most=10):
    cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, min(most, len(text) + 1))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def stream(fmt, pieces):
    """Content, [(id, name)], {index: arguments} and the event order from feeding `pieces`."""
    parser = CallParser(fmt, NAMES)
    events = [e for p in pieces for e in parser.feed(p)] + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    starts = [(e.id, e.name) for e in events if isinstance(e, CallStart)]
    args = {}
    for e in events:
        if isinstance(e, Arguments):
            assert any(isinstance(s, CallStart) and s.index == e.index for s in events[:events.index(e)])
            args[e.index] = args.get(e.index, "") + e.text
    return content, starts, args, events


def replies(fmt):
    rng = random.Random(0)
    for n in (1,) if fmt.one_call else (1, 2, 3):
        calls = [(rng.choice(NAMES), rng.choice(ARGS)) for _ in range(n)]
        yield "", calls
        if fmt.anywhere:
            yield "Let me look that up: {not a call} <tool or {\"tool_calls\"\n\n ", calls


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_calls_read_back_whole_and_in_any_pieces(fmt):
    rng = random.Random(1)
    for before, calls in replies(fmt):
        text = before + calls_text(fmt, calls)
        whole = parse_reply(fmt, NAMES, text)
        assert whole.content == (before.rstrip() or None)  # the whitespace before the calls is dropped
        assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == calls
        assert [c.arguments for c in whole.calls] == [dumps(a) for _, a in calls]  # the text as written
        assert len({c.id for c in whole.calls}) == len(calls) and all(c.id.startswith("call_") for c in whole.calls)
        for _ in range(100):
            content, starts, args, _ = stream(fmt, pieces_of(text, rng))
            assert content == (whole.content or "")
            assert [name for _, name in starts] == [c.name for c in whole.calls]
            assert [args.get(i, "") for i in range(len(calls))] == [c.arguments for c in whole.calls]
        content, _, _, _ = stream(fmt, list(text))  # a character at a time
        assert content == (whole.content or "")


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_text_replies_stay_text(fmt):
    rng = random.Random(2)
    partial = fmt.trigger[:-1]
    for text in ("Hello there.", "", f"ends with a partial marker {partial}", "a { brace", "tail \n\n  "):
        whole = parse_reply(fmt, NAMES, text)
        if not fmt.anywhere and text.startswith(partial):
            continue
        assert whole.calls == [] and whole.content == text
        for _ in range(30):
            assert stream(fmt, pieces_of(text, rng))[0] == text


def test_the_marker_never_reaches_the_content_while_streaming():
    text = "Sure. " + calls_text(HERMES, [("add", {"x": 1})])
    parser = CallParser(HERMES, NAMES)
    sent = ""
    for ch in text:
        sent += "".join(e.text for e in parser.feed(ch) if isinstance(e, Content))
        assert "<" not in sent  # not even the marker's first character, before it is known not to be one
    assert sent == "Sure."


def test_llama3_calls_only_open_the_reply():
    call = calls_text(LLAMA3_JSON, [("add", {"x": 1})])
    assert parse_reply(LLAMA3_JSON, NAMES, call).calls[0].name == "add"
    later = "I would call " + call
    assert parse_reply(LLAMA3_JSON, NAMES, later).content == later
    assert parse_reply(LLAMA3_JSON, NAMES, later).calls == []


def test_replies_cut_short():
    full = calls_text(HERMES, [("get_weather", {"city": "Paris"}), ("add", {"x": 1, "y": 2})])
    second = full.index('"add"')
    args_at = full.index("{", second)
    inside_args = parse_reply(HERMES, NAMES, full[:args_at + 6])
    assert [c.name for c in inside_args.calls] == ["get_weather", "add"]
    assert inside_args.calls[1].arguments == full[args_at:args_at + 6]  # what came, as OpenAI does
    assert inside_args.content is None
    inside_name = parse_reply(HERMES, NAMES, full[:second + 3])
    assert [c.name for c in inside_name.calls] == ["get_weather"]  # a name cut short is no call
    assert inside_name.content is None
    inside_end = parse_reply(HERMES, NAMES, full[:-4])  # in the closing marker
    assert len(inside_end.calls) == 2 and inside_end.content is None


def test_finish_reason_is_tool_calls_only_for_complete_calls():
    from fastdecode.server.tools.spec import Function, ToolSpec
    from fastdecode.server.tools.stream import ToolSetup

    setup = ToolSetup(GENERIC, ToolSpec(tuple(Function(n, {}, {}) for n in NAMES), "required", None, True))
    full = calls_text(GENERIC, [("get_weather", {"city": "Paris"}), ("add", {"x": 1})])
    # A stop string (", " here) can end the reply inside a call's text or its arguments.
    for text, reason in ((full, "tool_calls"), (full[:-2], "tool_calls"), (full[:full.index(", ")], "stop"),
                         (full[:full.index('{"x"') + 4], "stop")):
        reader = setup.reader()
        reader.deltas(text, finished=True)
        assert reader.finish_reason("stop") == reason, text
        assert reader.finish_reason("length") == "length"


def test_text_that_leaves_the_format_is_kept_as_content():
    # The grammar does not let this happen; a stop string or an unconstrained reply could.
    reply = parse_reply(GENERIC, NAMES, 'Hi {"tool_calls": [{"name": "unknown", "arguments": {}}]}')
    assert reply.calls == [] and reply.content.startswith("Hi") and "unknown" in reply.content


def test_deltas_carry_index_id_and_name_once_then_fragments():
    parser = CallParser(HERMES, NAMES, new_id=map("call_{}".format, itertools.count()).__next__)
    text = "ok " + calls_text(HERMES, [("add", {"x": 1}), ("noop", {})])
    deltas = [d.model_dump() for p in (text[:20], text[20:50], text[50:]) for d in to_deltas(parser.feed(p))]
    deltas += [d.model_dump() for d in to_deltas(parser.finish())]
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    heads = [c for c in calls if "id" in c]
    assert [(c["index"], c["id"], c["type"], c["function"]["name"]) for c in heads] == \
        [(0, "call_0", "function", "add"), (1, "call_1", "function", "noop")]
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in calls if "id" not in c)
    joined = {i: "".join(c["function"].get("arguments", "") for c in calls if c["index"] == i) for i in (0, 1)}
    assert joined == {0: '{"x": 1}', 1: "{}"}
    assert "".join(d.get("content", "") for d in deltas) == "ok"


def test_the_format_is_read_from_the_template_text():
    assert detect("... {{ '<tool_call>\\n' }} ...") is HERMES
    assert detect("{% if m.role == 'ipython' %}...") is LLAMA3_JSON
    assert detect("{{ '<|python_tag|>' + x }}") is LLAMA3_JSON
    assert detect("{% for m in messages %}{{ m.content }}{% endfor %}") is GENERIC
    assert detect(None) is GENERIC
