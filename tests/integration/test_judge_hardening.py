"""The remote judge against hostile or broken servers (a real local HTTP server, the real openai client):
non-finite rewards are retried as bad replies and then reported, never scored, written or cached; HTML
and non-JSON replies are bad replies too; ``--timeout`` bounds a hanging server; the cache key holds
the API root; a server that echoes the request's headers (API key included) never gets the key into
any output or file, through the command line included."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlft.cli import main
from rlft.rewards.remote import JudgeError, RemoteRewardJudge

from tests.conftest import write_jsonl_rows

pytestmark = pytest.mark.timeout(120)

API_KEY = "sk-echo-SECRET-5d1e77"
KEY_ENV = "RLFT_TEST_ECHO_KEY"
MODEL = "tiny/judge"


class Server:
    """``POST /v1/chat/completions`` answering per ``mode``: 'reward:<value>' content (``reward``),
    an HTML page, broken JSON, headers echoed in a 400 error body or in the reply content, or a hang."""

    def __init__(self):
        self.mode, self.reward, self.hits, self.delay = "reward", "1.5", 0, 0.0
        self.auth: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                server.handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def send(self, h, status, body: bytes, ctype="application/json"):
        try:
            h.send_response(status)
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def handle(self, h):
        h.rfile.read(int(h.headers.get("Content-Length", 0)))
        self.hits += 1
        headers = dict(h.headers.items())
        self.auth.append(h.headers.get("Authorization", ""))
        if self.mode == "hang":
            time.sleep(self.delay)
        if self.mode == "html":
            return self.send(h, 200, b"<html><body>Gateway login</body></html>", "text/html")
        if self.mode == "broken_json":
            return self.send(h, 200, b'{"choices": [')
        if self.mode == "echo_error":
            return self.send(h, 400, json.dumps({"error": {"message": f"bad request; you sent {headers}"}}).encode())
        content = f"echo:{headers}" if self.mode == "echo_reply" else f"reward:{self.reward}"
        body = {
            "id": "x", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
        }
        self.send(h, 200, json.dumps(body).encode())


@pytest.fixture(scope="module")
def server():
    srv = Server()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture
def fresh(server):
    server.mode, server.reward, server.hits, server.delay = "reward", "1.5", 0, 0.0
    server.auth = []
    return server


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, API_KEY)


def judge(server, cache=None, **kw):
    options = dict(api_key_env=KEY_ENV, max_concurrency=1, max_retries=2, backoff_s=0.01, timeout_s=10,
                   cache_path=cache)
    options.update(kw)
    return RemoteRewardJudge(server.base_url, MODEL, **options)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_non_finite_reward_is_retried_then_reported_and_never_cached(fresh, tmp_path, value):
    fresh.reward = value
    cache = tmp_path / "cache.jsonl"
    with pytest.raises(JudgeError) as info:
        judge(fresh, cache).score(["hi"], ["there"])
    assert str(info.value) == (f"the judge at {fresh.base_url} still failed after 2 retries "
                               f"(the judge's 'reward' value is not a finite number: '{value}')")
    assert fresh.hits == 3
    assert not cache.exists() or cache.read_text() == ""


def test_non_finite_cache_lines_are_ignored(fresh, tmp_path):
    j = judge(fresh, tmp_path / "cache.jsonl")
    key = j._key([{"role": "user", "content": "hi"}], "there")
    (tmp_path / "cache.jsonl").write_text(json.dumps({"key": key, "model": MODEL, "reward": float("nan")}) + "\n")
    assert judge(fresh, tmp_path / "cache.jsonl").score(["hi"], ["there"]) == [1.5]
    assert fresh.hits == 1  # the NaN line was not taken as a score


@pytest.mark.parametrize("mode, what", [
    ("html", "the judge's reply is not a chat completion (got an HTML page)"),
    ("broken_json", "unreadable reply (JSONDecodeError)"),
])
def test_html_and_broken_json_replies_are_bad_replies(fresh, mode, what):
    fresh.mode = mode
    with pytest.raises(JudgeError) as info:
        judge(fresh, max_retries=1).score(["hi"], ["there"])
    assert str(info.value) == f"the judge at {fresh.base_url} still failed after 1 retries ({what})"
    assert fresh.hits == 2


def test_timeout_bounds_a_hanging_server(fresh):
    fresh.mode, fresh.delay = "hang", 3.0
    t0 = time.perf_counter()
    with pytest.raises(JudgeError) as info:
        judge(fresh, max_retries=1, timeout_s=0.3).score(["hi"], ["there"])
    assert time.perf_counter() - t0 < 2.0  # 2 attempts x 0.3 s + backoff, not 2 x 3 s
    assert str(info.value) == f"the judge at {fresh.base_url} still failed after 1 retries (APITimeoutError)"


def test_cache_key_includes_the_api_root(fresh, tmp_path):
    cache = tmp_path / "cache.jsonl"
    assert judge(fresh, cache).score(["hi"], ["there"]) == [1.5]
    other = RemoteRewardJudge("http://127.0.0.1:9/v1", MODEL, api_key_env=KEY_ENV, cache_path=cache)
    assert other.cached("hi", "there") is None
    assert judge(fresh, cache).cached("hi", "there") == 1.5


@pytest.mark.parametrize("mode", ["echo_error", "echo_reply"])
def test_echoed_headers_never_leak_the_key(fresh, tmp_path, mode, capfd):
    fresh.mode = mode
    policy = write_jsonl_rows(tmp_path / "policy.jsonl", [{"prompt": "Name a fruit.", "response": "A banana."}])
    reference = write_jsonl_rows(tmp_path / "reference.jsonl", [{"prompt": "Name a fruit.", "response": "An apple."}])
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        main(["eval", "winrate", "--policy", str(policy), "--reference", str(reference), "--data", "None",
              "--judge", "remote", "--base-url", fresh.base_url, "--judge-model", MODEL, "--api-key-env", KEY_ENV,
              "--max-retries", "0", "--max-concurrency", "1", "--output-dir", str(out)])
    assert info.value.code == 1
    stdout, stderr = capfd.readouterr()
    assert fresh.hits >= 1  # (the second pair may start before the first failure cancels the queue)
    assert set(fresh.auth) == {f"Bearer {API_KEY}"}  # the key reached the server, which echoed it back
    assert API_KEY not in stdout and API_KEY not in stderr
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), path
    last = stderr.strip().splitlines()[-1]
    if mode == "echo_error":
        assert last == f"rlft eval winrate: error: the judge at {fresh.base_url} refused a request (HTTP 400)"
    else:
        assert last.startswith("rlft eval winrate: error: the judge's reply has no 'reward' field: \"echo:{")
        assert "Bearer [API key]" in last  # the echoed header, masked


def test_winrate_refuses_non_finite_rewards_from_any_judge(tmp_path, monkeypatch):
    from rlft.eval import winrate as winrate_module
    from rlft.eval.winrate import WinrateConfig, run_winrate

    class NanJudge:
        def score(self, prompts, responses):
            return [1.0, float("nan")][: len(responses)] + [0.0] * (len(responses) - 2)

    monkeypatch.setattr(winrate_module, "make_judge", lambda cfg, run_dir: NanJudge())
    policy = write_jsonl_rows(tmp_path / "p.jsonl", [{"prompt": "a", "response": "x"}])
    reference = write_jsonl_rows(tmp_path / "r.jsonl", [{"prompt": "a", "response": "y"}])
    cfg = WinrateConfig(policy=str(policy), reference=str(reference), judge="stub", data=None,
                        output_dir=str(tmp_path / "out"))
    with pytest.raises(ValueError) as info:
        run_winrate(cfg)
    assert str(info.value) == ("the judge 'stub' gave 1 non-finite reward(s), e.g. nan for the reference response "
                               "to prompt 0; nothing was written")
    assert not (tmp_path / "out" / "winrate.json").exists() and not (tmp_path / "out" / "winrate.jsonl").exists()
