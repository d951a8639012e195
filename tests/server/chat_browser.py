"""Headless Chromium driving the chat page, for the browser tests.

The browser is Debian's `chromium`, launched by Playwright through
`executable_path`: Playwright's own browser builds are never downloaded.
Without chromium (or the playwright package) the tests skip, except in CI
(CI=true), where .ci/run installs it and a missing browser is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx
import pytest
from serve_process import NO_EOS, ROOT

RESULTS = ROOT / "results" / "chat-page"  # screenshots: the results folder is git-ignored
TIMEOUT_MS = 20_000  # generous: the machine is shared, and 2 cores run the server and the browser


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run the browser tests (.ci/run installs chromium)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    path = os.environ.get("FASTDECODE_CHROMIUM") or shutil.which("chromium")
    if path is None:
        _missing("chromium is not installed (apt-get install -y chromium)")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (pip install -e '.[test]')")
    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path)
        yield b
        b.close()


@dataclass
class Chat:
    """A page of the chat UI, with what it reported that a user would not see in the page."""

    page: Any
    dialogs: list = field(default_factory=list)  # alert()/confirm() messages: none may appear
    errors: list = field(default_factory=list)  # uncaught script errors

    def send(self, text: str) -> None:
        self.page.fill("#input", text)
        self.page.press("#input", "Enter")

    def settings(self, **values: str) -> None:
        if self.page.locator("#settings").get_attribute("open") is None:  # the fields are in a closed <details>
            self.page.click("#settings summary")
        for name, value in values.items():
            self.page.fill(f"#{name}", value)

    def no_eos(self, **extra: Any) -> None:
        """Chat requests leave with EOS banned (and `extra` fields), so replies run to max_tokens."""
        def rewrite(route: Any) -> None:
            body = {**route.request.post_data_json, "logit_bias": NO_EOS, **extra}
            route.continue_(post_data=json.dumps(body))
        self.page.route("**/v1/chat/completions", rewrite)


@pytest.fixture
def open_chat(browser) -> Callable[..., Chat]:
    contexts = []
    chats = []

    def open_(url: str, **options: Any) -> Chat:
        ctx = browser.new_context(**{"viewport": {"width": 900, "height": 700}, **options})
        ctx.set_default_timeout(TIMEOUT_MS)
        contexts.append(ctx)
        chat = Chat(ctx.new_page())
        chat.page.on("dialog", lambda d: (chat.dialogs.append(d.message), d.dismiss()))
        chat.page.on("pageerror", lambda e: chat.errors.append(str(e)))
        chat.page.goto(url + "/")
        chats.append(chat)
        return chat

    yield open_
    for ctx in contexts:
        ctx.close()
    for chat in chats:
        assert not chat.dialogs and not chat.errors, (chat.dialogs, chat.errors)


def metric(url: str, name: str, headers: dict | None = None) -> float:
    text = httpx.get(url + "/metrics", headers=headers).text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def wait_for_metric(url: str, name: str, value: float, timeout: float = 5.0) -> float:
    deadline = time.monotonic() + timeout
    while (got := metric(url, name)) != value and time.monotonic() < deadline:
        time.sleep(0.05)
    return got
