"""The chat page with tools, in headless Chromium: a reply's tool calls show as calls (name
and arguments, never the raw JSON or markers), results typed in go back as tool messages,
and a real server's constrained call on the tiny model; a thinking model's reasoning_content
shows folded apart from its answer."""

import json

import jsonschema
import pytest
from chat_browser import browser, open_chat  # noqa: F401 (fixtures)
from serve_process import serve

CHAT = "**/v1/chat/completions"
# Small: the tools are listed in the prompt, and the tiny model's context is 512 tokens.
SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"enum": [1, 2]}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = serve(tmp_path_factory, "max_batch_size=2")
    yield s
    s.stop()


def sse(deltas, finish):
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}]
    events += [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    events += [{"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
               {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}]
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def answer_with(page, replies):
    """The page's chat requests answered with `replies` in turn; returns the list their bodies go to."""
    bodies = []

    def answer(route):
        bodies.append(route.request.post_data_json)
        route.fulfill(status=200, content_type="text/event-stream", body=replies[len(bodies) - 1])

    page.route(CHAT, answer)
    return bodies


def test_a_tool_call_shows_as_a_call_and_its_result_goes_back(server, open_chat):
    from playwright.sync_api import expect

    calls = [{"index": 0, "id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
             {"index": 0, "function": {"arguments": '{"city": "Pa'}},
             {"index": 0, "function": {"arguments": 'ris", "days": 2}'}}]
    chat = open_chat(server.url)
    page = chat.page
    chat.settings(tools=json.dumps(TOOLS))
    bodies = answer_with(page, [sse([{"content": "Checking."}] + [{"tool_calls": [c]} for c in calls], "tool_calls"),
                                sse([{"content": "It is 22 C in Paris."}], "stop")])
    chat.send("Weather in Paris?")
    reply = page.locator(".msg.assistant").first
    expect(reply.locator(".tool-call .call-name")).to_have_text("get_weather")
    args = reply.locator(".tool-call .call-arguments")
    assert json.loads(args.inner_text()) == {"city": "Paris", "days": 2}
    assert args.inner_text() == json.dumps({"city": "Paris", "days": 2}, indent=2)  # pretty-printed
    assert reply.locator(".body p").all_inner_texts() == ["Checking."]  # the call is not text
    assert bodies[0]["tools"] == TOOLS

    page.fill(".call-result textarea", "22 C, sunny")
    page.click(".call-result button")
    expect(page.locator(".msg.assistant").nth(1).locator(".body")).to_have_text("It is 22 C in Paris.")
    expect(page.locator(".msg.tool .body")).to_have_text("22 C, sunny")
    expect(page.locator(".msg.tool .who")).to_have_text("Result of get_weather")
    assert page.locator(".call-result").count() == 0  # answered: no box any more
    sent = bodies[1]["messages"]
    assert sent[1:] == [
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_abc", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
        {"role": "tool", "content": "22 C, sunny", "tool_call_id": "call_abc"}]

    page.reload()  # kept with the conversation
    expect(page.locator(".tool-call .call-name")).to_have_text("get_weather")
    expect(page.locator(".msg")).to_have_count(4)


def test_a_thought_shows_apart_from_the_answer(server, open_chat):
    from playwright.sync_api import expect

    chat = open_chat(server.url)
    page = chat.page
    bodies = answer_with(page, [sse([{"reasoning_content": "The user greets."}, {"reasoning_content": " Greet back."},
                                     {"content": "Hello!"}], "stop"), sse([{"content": "Fine."}], "stop")])
    chat.send("Hi")
    reply = page.locator(".msg.assistant").first
    thought = reply.locator("details.thinking")
    expect(thought.locator("summary")).to_have_text("Thinking")
    expect(thought).not_to_have_attribute("open", "")  # folded once the answer has come
    assert thought.locator("p").all_text_contents() == ["The user greets. Greet back."]  # folded: not rendered
    assert reply.locator(".body > div > p").all_inner_texts() == ["Hello!"]
    chat.send("How are you?")
    expect(page.locator(".msg.assistant").nth(1).locator(".body")).to_have_text("Fine.")
    assert bodies[1]["messages"][1:3] == [{"role": "assistant", "content": "Hello!"},
                                          {"role": "user", "content": "How are you?"}]  # the thought stays here
    page.reload()  # kept with the conversation
    expect(page.locator(".msg.assistant").first.locator("details.thinking p")).to_have_text(  # text, shown or not
        "The user greets. Greet back.")


def test_bad_tools_json_is_refused_in_the_page(server, open_chat):
    from playwright.sync_api import expect

    chat = open_chat(server.url)
    chat.settings(tools="[{not json")
    chat.send("Hi")
    expect(chat.page.locator("#error")).to_contain_text("Tools is not valid JSON")
    assert chat.page.locator(".msg").count() == 0 and chat.page.locator("#input").input_value() == "Hi"


def test_a_real_constrained_call_from_the_server(server, open_chat):
    from playwright.sync_api import expect

    chat = open_chat(server.url)
    chat.settings(tools=json.dumps(TOOLS), temperature="0", max_tokens="100")

    def required(route):  # the page sends tool_choice auto (the default); the tiny model would write text
        route.continue_(post_data=json.dumps({**route.request.post_data_json, "tool_choice": "required",
                                             "parallel_tool_calls": False}))

    chat.page.route(CHAT, required)
    chat.send("Weather in Paris?")
    call = chat.page.locator(".msg.assistant .tool-call")
    expect(call.locator(".call-name")).to_have_text("get_weather")
    expect(chat.page.locator(".call-result")).to_have_count(1)  # the stream has ended
    jsonschema.validate(json.loads(call.locator(".call-arguments").inner_text()), SCHEMA)
    assert chat.page.locator(".msg.assistant .body p").count() == 0  # content null: no text, no raw JSON
