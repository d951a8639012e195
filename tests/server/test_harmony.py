"""gpt-oss's harmony replies read as reasoning_content and content: the splitter against a plain
reference over every way a reply can arrive in pieces; the server on a tiny model whose vocabulary
holds harmony's markers as special tokens, its replies made to follow the format by a grammar; and
a harmony vocabulary's end-of-reply tokens."""

import itertools
import json
import re
import sys
from pathlib import Path

import pytest
from test_reasoning import app_for, whole_and_streamed

import fastdecode
from fastdecode.text.harmony import MARKERS, HarmonySplitter, is_harmony


def reference(text):
    """The split, written plainly for the whole reply: each message's channel and body."""
    if not text.startswith("<|"):
        text = "<|channel|>final<|message|>" + text
    reasoning = content = ""
    for m in re.finditer(r"<\|channel\|>(\w*)[^<]*(?:<\|constrain\|>\w*)?<\|message\|>(.*?)"
                         r"(?=<\|end\|>|<\|return\|>|<\|call\|>|<\|start\|>|$)", text, re.S):
        if m.group(1) == "analysis":
            reasoning += m.group(2)
        else:
            content += m.group(2)
    return reasoning, content


REPLIES = [
    "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>4.",
    "<|channel|>analysis<|message|>cut off mid-thought",
    "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done",
    "<|channel|>analysis<|message|>a<|start|>assistant<|channel|>final<|message|>b",  # no <|end|>
    "Plain answer, no header.",
    "<|channel|>final<|message|>x <|y|> and < and <| z",
    "<|channel|>analysis<|mess",
]


@pytest.mark.parametrize("reply", REPLIES)
def test_every_split_into_pieces_adds_up_to_the_reference(reply):
    want = reference(reply)
    assert HarmonySplitter().feed(reply, finished=True) == want
    for cuts in itertools.chain(itertools.combinations(range(1, len(reply)), 1),
                                itertools.combinations(range(1, len(reply)), 2)):
        s = HarmonySplitter()
        bounds = [0, *cuts, len(reply)]
        pieces = [reply[a:b] for a, b in zip(bounds, bounds[1:])]
        sent = [s.feed(p, finished=k == len(pieces) - 1) for k, p in enumerate(pieces)]
        assert ("".join(r for r, _ in sent), "".join(c for _, c in sent)) == want, pieces


def test_which_templates_are_harmony():
    assert is_harmony("{{ '<|start|>assistant<|channel|>final<|message|>' }}")
    assert not is_harmony("<|im_start|>assistant") and not is_harmony(None)


# A harmony-like template: the prompt ends where the model writes its first header.
TEMPLATE = ("{% for m in messages %}{{ '<|start|>' + m['role'] + '<|message|>' + m['content'] + '<|end|>' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}"
            "{# <|channel|>final #}")


@pytest.fixture(scope="module")
def harmony_llm(tmp_path_factory):
    """The tiny model with harmony's markers as control tokens (its end of reply <|return|>)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "checkpoints"))
    from tiny_checkpoints import SPECIALS, byte_level_tokens, gguf_tensors, hf_model, write_gguf

    tokens = byte_level_tokens() + list(MARKERS)
    path = write_gguf(tmp_path_factory.mktemp("harmony") / "h.gguf",
                      gguf_tensors(hf_model(vocab_size=len(tokens))), tokens=tokens,
                      control=(*SPECIALS, *MARKERS), template=TEMPLATE, context=512)
    llm = fastdecode.load(str(path), max_batch_size=2, max_seq_len=512)
    yield llm
    llm.engine.close()


def test_a_harmony_vocabulary_ends_replies_at_return_and_call_not_at_end(harmony_llm):
    tok = harmony_llm.tokenizer
    ids = {m: tok.encode(m, add_special_tokens=False)[0] for m in ("<|end|>", "<|return|>", "<|call|>")}
    assert ids["<|return|>"] in tok.eos_ids and ids["<|call|>"] in tok.eos_ids
    assert ids["<|end|>"] not in tok.eos_ids


def test_the_server_reads_the_channels_apart(harmony_llm):
    """A reply made to follow harmony by a grammar that names the markers as tokens (they are special
    tokens, which the reply's text keeps): the analysis body is reasoning_content, the final body
    content, no marker in either."""
    grammar = ('start: <|channel|> "analysis" <|message|> /[a-z]{3,8}/ <|end|> <|start|> "assistant" '
               '<|channel|> "final" <|message|> /[a-z]{2,6}/')
    pattern = (r"<\|channel\|>analysis<\|message\|>[a-z]{3,8}<\|end\|><\|start\|>assistant"
               r"<\|channel\|>final<\|message\|>[a-z]{2,6}")
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60, "temperature": 0,
            "structured_outputs": {"grammar": grammar}}
    raw = app_for(harmony_llm, None, "reasoning=none")
    from test_tools_models import post

    text = post(raw, {**body, "skip_special_tokens": False}).json()["choices"][0]["message"]["content"]
    assert re.fullmatch(pattern, text), text
    message = whole_and_streamed(app_for(harmony_llm), body)
    assert (message["reasoning_content"], message["content"]) == reference(text)
    assert message["reasoning_content"] and message["content"] and "<|" not in json.dumps(message)


def test_the_chat_repl_shows_and_keeps_the_answer_only(harmony_llm):
    """`fastdecode chat` on a harmony template: the reply (shaped by the same grammar) streams its final
    channel alone, and the history keeps that as the assistant's message."""
    from fastdecode.api.llm import split_options
    from fastdecode.cli.repl import ChatSession

    grammar = ('start: <|channel|> "analysis" <|message|> /[a-z]{3,8}/ <|end|> <|start|> "assistant" '
               '<|channel|> "final" <|message|> /[a-z]{2,6}/')
    params, config = split_options({"grammar": grammar, "temperature": 0, "max_new_tokens": 60})
    session = ChatSession(harmony_llm, params, config)
    shown = []
    text, stopped = session.answer(session.ask("hi")[0], shown.append)
    assert not stopped and text == "".join(shown) and re.fullmatch("[a-z]{2,6}", text), shown
    assert session.turns[-1] == {"role": "assistant", "content": text}


def test_llm_chat_returns_the_answer_and_its_reasoning_apart(harmony_llm):
    grammar = ('start: <|channel|> "analysis" <|message|> /[a-z]{3,8}/ <|end|> <|start|> "assistant" '
               '<|channel|> "final" <|message|> /[a-z]{2,6}/')
    out = harmony_llm.chat([{"role": "user", "content": "hi"}], grammar=grammar, temperature=0, max_new_tokens=60)
    assert re.fullmatch("[a-z]{3,8}", out.reasoning) and re.fullmatch("[a-z]{2,6}", out.text), out
    assert out.finish_reason == "stop" and "<|" not in out.text
    plain = harmony_llm.generate([harmony_llm.chat_prompt([{"role": "user", "content": "hi"}])], grammar=grammar,
                                 temperature=0, max_new_tokens=60)[0]
    assert plain.reasoning is None and plain.text == f"analysis{out.reasoning}assistantfinal{out.text}"


# -- tool calls ---------------------------------------------------------------------------------

CALL_REPLY = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
              'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}')


def test_a_call_reads_through_the_splitter_in_any_pieces():
    """With tools, a message to a function reaches the call parser whole; the analysis stays reasoning."""
    from fastdecode.server.tools.formats import HARMONY
    from fastdecode.server.tools.parse import CallParser

    for size in (1, 2, 3, 7, len(CALL_REPLY)):
        splitter, parser = HarmonySplitter(keep_calls=True), CallParser(HARMONY, ["get_weather"])
        reasoning = ""
        for i in range(0, len(CALL_REPLY), size):
            r, c = splitter.feed(CALL_REPLY[i:i + size], finished=i + size >= len(CALL_REPLY))
            reasoning += r
            parser.feed(c)
        parser.finish()
        assert reasoning == "Need weather." and parser.content is None, size
        assert [(c.name, json.loads(c.arguments)) for c in parser.calls] == [("get_weather", {"city": "Paris"})]
    # the recipient after the role, as the template writes earlier calls, and no <|constrain|>
    other = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather"
             '<|channel|>commentary<|message|>{"city": "Paris"}')
    parser = CallParser(HARMONY, ["get_weather"])
    parser.feed(HarmonySplitter(keep_calls=True).feed(other, finished=True)[1])
    parser.finish()
    assert [(c.name, json.loads(c.arguments)) for c in parser.calls] == [("get_weather", {"city": "Paris"})]
    # without tools the message to a function is neither reasoning nor shown
    assert HarmonySplitter().feed(CALL_REPLY, finished=True) == ("Need weather.", '{"city": "Paris"}')


def test_harmony_templates_call_tools_in_their_own_format(harmony_llm):
    """tool_choice required holds the reply to one harmony call from its first token; the response has the
    call, finish_reason tool_calls, and no marker in any field, streamed or whole."""
    from fastdecode.server.tools.formats import HARMONY, detect

    assert detect(TEMPLATE) is HARMONY
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"], "additionalProperties": False}}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": "required",
            "max_tokens": 60, "temperature": 0}
    from test_tools_models import post

    assert post(app_for(harmony_llm), body).json()["choices"][0]["finish_reason"] == "tool_calls"
    message = whole_and_streamed(app_for(harmony_llm), body)
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "pick" and json.loads(call["function"]["arguments"])["n"] in (1, 2)
    assert not message.get("content") and "<|" not in json.dumps(message)
    # auto: the grammar holds the messages' headers and a call's arguments; the model writes the call's
    # header itself (pushed to by a bias on <|channel|> and on the space before `to=`)
    tok = harmony_llm.tokenizer
    bias = {str(tok.encode(t, add_special_tokens=False)[0]): 100 for t in ("<|channel|>", " ")}
    message = whole_and_streamed(app_for(harmony_llm), {**body, "tool_choice": "auto", "logit_bias": bias})
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "pick" and json.loads(call["function"]["arguments"])["n"] in (1, 2)
    assert not message.get("content") and "<|" not in json.dumps(message)
