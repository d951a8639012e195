"""The chat page in headless Chromium when things go wrong: a server with an API key (asked
for, a wrong one, then the right one) and a server that dies mid-reply."""

import pytest
from chat_browser import browser, open_chat  # noqa: F401 (fixtures)
from serve_process import ServeProcess, serve

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    s = serve(tmp_path_factory, "max_batch_size=1", env={"FASTDECODE_API_KEY": KEY})
    yield s
    s.stop()


def test_the_page_asks_for_the_key_and_shows_a_wrong_one(keyed_server, open_chat):
    from playwright.sync_api import expect

    chat = open_chat(keyed_server.url)
    page = chat.page
    form, message = page.locator("#key-form"), page.locator("#key-message")
    expect(message).to_have_text("This server needs an API key.")
    chat.settings(max_tokens="8")
    chat.no_eos()  # a reply of a known length
    chat.send("Hi")  # refused (401) before any reply: the message waits for the key
    expect(form).to_be_visible()
    expect(page.locator("#input")).to_have_value("Hi")  # waited for, not read once: the page may still be settling
    expect(page.locator(".msg")).to_have_count(0)
    page.fill("#key", "wrong")
    page.click("#key-form button")
    expect(message).to_have_text("incorrect API key")  # the server's 401 message
    assert page.evaluate("sessionStorage.getItem('fastdecode.apiKey')") is None
    page.fill("#key", KEY)
    page.click("#key-form button")
    expect(form).to_be_hidden()
    expect(page.locator("#model")).to_have_text("tiny")
    expect(page.locator(".msg.assistant .meta")).to_contain_text("8 tokens")  # the waiting message went out
    assert page.evaluate("sessionStorage.getItem('fastdecode.apiKey')") == KEY
    page.reload()  # asked once: the key stays for the tab's session
    expect(page.locator("#model")).to_have_text("tiny")
    expect(form).to_be_hidden()
    expect(page.locator(".msg")).to_have_count(2)


def test_connection_lost_mid_reply_keeps_it_and_retries(tmp_path, open_chat):
    from playwright.sync_api import expect

    server = ServeProcess(tmp_path / "server.log", "max_batch_size=1").wait_ready()
    try:
        chat = open_chat(server.url)
        page = chat.page
        chat.no_eos(max_tokens=400)
        chat.send("Tell me a long story")
        body = page.locator(".msg.assistant .body")
        expect(body).not_to_be_empty()
        server.proc.kill()  # the server is gone mid-stream
        expect(page.locator("#error")).to_contain_text("connection lost")
        expect(page.locator(".msg.assistant .meta")).to_contain_text("connection lost")
        partial = body.inner_text()
        assert partial and page.locator("#retry").is_visible()

        server.stop()
        server = ServeProcess(tmp_path / "server2.log", "max_batch_size=1", port=server.port).wait_ready()
        page.unroute("**/v1/chat/completions")
        chat.no_eos(max_tokens=20)
        page.click("#retry")  # a new reply in place of the broken one
        expect(page.locator(".msg.assistant .meta")).to_contain_text("20 tokens")
        assert page.locator(".msg").count() == 2 and page.locator("#error").is_hidden()

        server.stop()
        chat.send("Anyone there?")
        expect(page.locator("#error")).to_contain_text("cannot reach the server")
        assert page.locator("#input").input_value() == "Anyone there?" and page.locator(".msg").count() == 2
    finally:
        server.stop()
