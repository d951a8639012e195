"""The chat page at GET /: served with a strict CSP (in-process), then driven in headless
Chromium against a server on the tiny model: a streamed reply with its stats, the settings
sent, reload, screenshots, Stop freeing the slot, model text kept as text, bad input."""

import asyncio
import json
import re

import httpx
import pytest
from chat_browser import RESULTS, browser, metric, open_chat, wait_for_metric  # noqa: F401 (fixtures)
from serve_process import error_of, serve

from fastdecode.server.app import create_app
from fastdecode.server.settings import ServeSettings
from fastdecode.server.state import ServerState
from fastdecode.cli.keys import load_settings

CHAT = "**/v1/chat/completions"


def get(path, *keys):
    app = create_app(ServerState(load_settings(ServeSettings, ["model=tiny", *keys])))

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.get(path)
    return asyncio.run(go())


def test_the_page_is_package_data_served_with_a_strict_csp():
    page = get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "unsafe" not in csp
    assert re.findall(r"<script[^>]*>", page.text) == ['<script src="ui/chat.js" defer>']  # no inline script
    for path, kind in (("/ui/chat.js", "text/javascript"), ("/ui/chat.css", "text/css")):
        r = get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
        assert "http://" not in r.text and "https://" not in r.text  # nothing from another host
    assert "innerHTML" not in get("/ui/chat.js").text


def test_ui_false_turns_the_page_off():
    for path in ("/", "/ui/chat.js"):
        r = get(path, "ui=false")
        assert r.status_code == 404 and error_of(r)["code"] == "not_found"


# -- in the browser --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = serve(tmp_path_factory, "max_batch_size=2")
    yield s
    s.stop()


def test_a_streamed_reply_with_stats_survives_a_reload(server, open_chat):
    from playwright.sync_api import expect

    chat = open_chat(server.url)
    page = chat.page
    expect(page.locator("#model")).to_have_text("tiny")
    chat.settings(system="You are terse.", temperature="0.5", top_p="0.9", max_tokens="120", seed="7")
    chat.no_eos()
    # Records whether reply text was on the page while the stream still ran (the Stop
    # button showing): a check after the fact could miss a stream this short.
    page.evaluate("""() => {
      window.sawStreaming = false;
      new MutationObserver(() => {
        const body = document.querySelector('.msg.assistant .body');
        const stop = document.querySelector('#stop');
        if (body && body.textContent.length > 0 && stop && stop.checkVisibility()) window.sawStreaming = true;
      }).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
    }""")
    with page.expect_request(CHAT) as sent:
        chat.send("Hello")
    body = sent.value.post_data_json
    assert body["messages"] == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello"}]
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.5, 0.9, 120, 7)
    assert body["stream"] is True and body["model"] == "tiny"

    reply = page.locator(".msg.assistant")
    expect(reply.locator(".body")).not_to_be_empty()
    meta = reply.locator(".meta")
    expect(meta).to_contain_text("tokens/s")
    assert page.evaluate("window.sawStreaming")  # tokens showed as they arrived, before the stream ended
    assert re.fullmatch(r"120 tokens · [\d.]+ tokens/s · first token \d+ ms · max tokens reached", meta.inner_text())
    assert page.locator("#send").is_visible() and not page.locator("#stop").is_visible()
    text = reply.locator(".body").inner_text()

    page.reload()
    expect(page.locator(".msg")).to_have_count(2)
    expect(page.locator(".msg.user .body")).to_have_text("Hello")
    assert reply.locator(".body").inner_text() == text and reply.locator(".meta").inner_text() == meta.inner_text()
    assert page.locator("#system").input_value() == "You are terse."  # the settings are kept too

    RESULTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=RESULTS / "light.png")
    page.emulate_media(color_scheme="dark")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(21, 23, 26)"
    page.screenshot(path=RESULTS / "dark.png")
    page.set_viewport_size({"width": 360, "height": 740})
    assert page.evaluate("document.documentElement.scrollWidth") <= 360  # no sideways scrolling
    for button in ("#send", "#new-chat"):
        box = page.locator(button).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 360
    page.screenshot(path=RESULTS / "narrow.png")

    page.click("#new-chat")
    expect(page.locator(".msg")).to_have_count(0)
    page.reload()
    expect(page.locator("#model")).to_have_text("tiny")
    expect(page.locator(".msg")).to_have_count(0)  # cleared from storage too


def test_stop_mid_reply_frees_the_slot(server, open_chat):
    from playwright.sync_api import expect

    aborted = metric(server.url, 'fastdecode_choices_finished_total{finish_reason="abort"}')
    chat = open_chat(server.url)
    chat.no_eos(max_tokens=450)
    # Stop is clicked by the page itself on the reply's first text: a click from the test
    # process could land after the last of the 450 tokens (the tiny model streams them in
    # well under a second when the server has the cores to itself).
    chat.page.evaluate("""() => {
      window.stopClicked = false;
      const seen = new MutationObserver(() => {
        const body = document.querySelector('.msg.assistant .body');
        const stop = document.querySelector('#stop');
        if (!window.stopClicked && body && body.textContent.length > 0 && stop && !stop.hidden) {
          window.stopClicked = true;
          seen.disconnect();
          stop.click();
        }
      });
      seen.observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
    }""")
    chat.send("Count to a thousand")
    body = chat.page.locator(".msg.assistant .body")
    expect(body).not_to_be_empty()
    assert chat.page.evaluate("window.stopClicked")
    expect(chat.page.locator(".msg.assistant .meta")).to_contain_text("stopped")
    assert body.inner_text()  # the partial reply stays
    assert wait_for_metric(server.url, "fastdecode_slots_in_use", 0) == 0
    assert wait_for_metric(server.url, 'fastdecode_choices_finished_total{finish_reason="abort"}',
                           aborted + 1) == aborted + 1


def test_model_text_is_inserted_as_text(server, open_chat):
    from playwright.sync_api import expect

    # The tiny model cannot be made to say this, so the reply is a canned stream in the server's format.
    pieces = ["Look: <img src=x onerror=alert(1)>\n\n", "```html\n<script>alert(2)</script>\n", "```\nbye"]
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    events += [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    events += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
               {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}]
    sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    chat = open_chat(server.url)
    chat.page.route(CHAT, lambda route: route.fulfill(status=200, content_type="text/event-stream", body=sse))
    requests = []
    chat.page.on("request", lambda r: requests.append(r.url))
    chat.send("<img src=x onerror=alert(3)> and <b>bold</b>")
    reply = chat.page.locator(".msg.assistant")
    expect(reply.locator(".meta")).to_contain_text("9 tokens")
    assert reply.locator("p").all_inner_texts() == ["Look: <img src=x onerror=alert(1)>", "bye"]
    assert reply.locator("pre code").inner_text() == "<script>alert(2)</script>"  # the fence: a monospace box
    assert "monospace" in reply.locator("pre code").evaluate("e => getComputedStyle(e).fontFamily")
    expect(chat.page.locator(".msg.user .body")).to_have_text("<img src=x onerror=alert(3)> and <b>bold</b>")
    assert chat.page.locator("#transcript img, #transcript script, #transcript b").count() == 0
    assert not [u for u in requests if u.endswith("/x")]  # no <img> tried to load
    # chat.dialogs is checked empty when the page closes: no alert() ran


def test_empty_and_oversized_messages(server, open_chat):
    from playwright.sync_api import expect

    chat = open_chat(server.url)
    expect(chat.page.locator("#model")).to_have_text("tiny")
    sent = []
    chat.page.on("request", lambda r: sent.append(r) if r.url.endswith("/v1/chat/completions") else None)
    chat.send("  \n ")
    chat.page.click("#send")
    big = "x" * 100_000
    chat.send(big)
    error = chat.page.locator("#error")
    expect(error).to_contain_text("context is 512 tokens")  # the server's 400, in the page
    assert len(sent) == 1  # the blank message was not sent
    assert chat.page.locator(".msg").count() == 0
    assert chat.page.locator("#input").input_value() == big  # taken back for editing
