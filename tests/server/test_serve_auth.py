"""API keys: with one set (here from $FASTDECODE_API_KEY), /v1/* and /metrics need it in
either header form; /health stays public."""

import httpx
import openai
import pytest
from serve_process import error_of, serve

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = serve(tmp_path_factory, "max_batch_size=1", env={"FASTDECODE_API_KEY": KEY})
    yield s
    s.stop()


def test_health_needs_no_key(server):
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/tokenizer_info"])
def test_missing_and_wrong_keys_get_401(server, path):
    r = httpx.get(server.url + path)
    assert r.status_code == 401 and error_of(r)["code"] == "missing_api_key"
    assert r.headers["www-authenticate"] == "Bearer"
    for headers in ({"Authorization": "Bearer wrong"}, {"X-Api-Key": "wrong"}, {"Authorization": f"Basic {KEY}"},
                    {"Authorization": f"Bearer {KEY}x"}):
        r = httpx.get(server.url + path, headers=headers)
        assert r.status_code == 401, headers
        error_of(r)


@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/tokenizer_info"])
def test_either_header_form_passes(server, path):
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"X-Api-Key": KEY}):
        assert httpx.get(server.url + path, headers=headers).status_code == 200


def test_the_key_is_checked_before_the_body_is_read(server):
    r = httpx.post(server.url + "/v1/chat/completions", content=b"x" * (2 << 20))
    assert r.status_code == 401


def test_openai_client_with_and_without_the_key(server):
    bad = server.openai(api_key="nope")
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    good = server.openai(api_key=KEY)
    assert [m.id for m in good.models.list().data] == ["tiny"]
    out = good.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert out.choices[0].finish_reason in ("stop", "length")


def test_tokenizer_routes_need_the_key(server):
    for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [97]})):
        r = httpx.post(server.url + path, json=body)
        assert r.status_code == 401 and error_of(r)["code"] == "missing_api_key"
        assert httpx.post(server.url + path, json=body, headers={"X-Api-Key": KEY}).status_code == 200
