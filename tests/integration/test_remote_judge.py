"""RemoteRewardJudge against a REAL local HTTP server (stdlib ``http.server`` on 127.0.0.1, ephemeral
port, in a thread) that speaks the OpenAI chat-completions protocol and scores with a tiny local
reward model, as NVIDIA's Nemotron reward endpoint does (reply content ``"reward:<value>"``).

Nothing is mocked on the client side: the real ``openai`` client sends real HTTP requests. Checked:
scores equal the local scorer's; 429s are retried with backoff; an interrupted evaluation resumes from
the JSONL cache without re-scoring (server hits counted); bad replies and non-retryable errors fail
clearly; the API key reaches the server but never the cache file or the logs.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from rlft.rewards.remote import JudgeError, RemoteRewardJudge, cache_key, parse_reward
from rlft.rewards.reward_model import RewardModelScorer

from tests.conftest import make_tiny_rm, save_model_dir

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(120)

API_KEY = "sk-test-DO-NOT-LEAK-8f3a9c"
KEY_ENV = "RLFT_TEST_JUDGE_KEY"
JUDGE_MODEL = "tiny/reward-judge"

PROMPTS = [
    "Name a fruit.",
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."},
     {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again?"}],
    "What colour is the sky?",
    "Count to three.",
    "Is water wet?",
    "Tell a joke.",
]
RESPONSES = ["A banana.", "Hi again.", "Blue, mostly.", "1, 2, 3", "Yes.", "No."]


class RewardServer:
    """An OpenAI-compatible ``POST /v1/chat/completions`` backed by a local reward model.

    Knobs (set by tests): ``fail_429`` answers the next N requests with 429; ``fail_after`` answers
    503 to every request once that many pairs have been scored; ``error_400`` answers 400;
    ``content_format`` formats the reply (default ``"reward:{value!r}"``).
    """

    def __init__(self, scorer: RewardModelScorer):
        self.scorer = scorer
        self.lock = threading.Lock()
        self.reset()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_POST(self):
                server.handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def reset(self):
        self.hits = 0
        self.scored = 0
        self.fail_429 = 0
        self.fail_after: int | None = None
        self.error_400 = False
        self.content_format = "reward:{value!r}"
        self.auth_headers: list[str] = []
        self.conversations: list[list[dict]] = []

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def _send(self, handler, status: int, body: dict, headers: dict | None = None):
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            handler.send_header(k, v)
        handler.end_headers()
        handler.wfile.write(data)

    def handle(self, handler):
        length = int(handler.headers.get("Content-Length", 0))
        request = json.loads(handler.rfile.read(length) or b"{}")
        if handler.path != "/v1/chat/completions":
            return self._send(handler, 404, {"error": {"message": f"no route {handler.path}"}})
        with self.lock:
            self.hits += 1
            self.auth_headers.append(handler.headers.get("Authorization", ""))
            if self.fail_429 > 0:
                self.fail_429 -= 1
                return self._send(handler, 429,
                                  {"error": {"message": "rate limited", "type": "rate_limit_error", "code": "429"}},
                                  {"Retry-After": "0"})
            if self.error_400:
                return self._send(handler, 400, {"error": {"message": "bad request", "type": "invalid_request_error"}})
            if self.fail_after is not None and self.scored >= self.fail_after:
                return self._send(handler, 503, {"error": {"message": "overloaded", "type": "server_error"}})
            messages = request["messages"]
            self.conversations.append(messages)
            assert request["model"] == JUDGE_MODEL and messages[-1]["role"] == "assistant"
            value = self.scorer.score([messages[:-1]], [messages[-1]["content"]])[0]
            self.scored += 1
        content = self.content_format.format(value=value)
        self._send(
            handler, 200, {
                "id": f"chatcmpl-{self.hits}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": request["model"],
                "choices": [{
                    "index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop",
                    "logprobs": None
                }],
                "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
            })


@pytest.fixture(scope="module")
def scorer(tmp_path_factory, smol_tokenizer) -> RewardModelScorer:
    folder = save_model_dir(tmp_path_factory.mktemp("tiny-rm-server"), make_tiny_rm(smol_tokenizer, seed=2),
                            smol_tokenizer)
    return RewardModelScorer(str(folder), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def server(scorer):
    srv = RewardServer(scorer)
    yield srv
    srv.close()


@pytest.fixture
def fresh_server(server):
    server.reset()
    return server


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, API_KEY)


@pytest.fixture
def all_logs(rlft_log):
    """Capture DEBUG logs of rlft, openai and httpx (``rlft_log`` sees the rlft logger even if it does not
    propagate)."""
    for name in ("rlft", "openai", "httpx", "httpcore"):
        rlft_log.set_level(logging.DEBUG, logger=name)
    return rlft_log


def make_judge(server: RewardServer, cache: Path | None = None, **kwargs) -> RemoteRewardJudge:
    options = dict(api_key_env=KEY_ENV, max_concurrency=3, max_retries=4, backoff_s=0.01, timeout_s=20,
                   cache_path=cache)
    options.update(kwargs)
    return RemoteRewardJudge(server.base_url, JUDGE_MODEL, **options)


# --------------------------------------------------------------------------- end to end


def test_scores_match_the_local_scorer(fresh_server, scorer):
    judge = make_judge(fresh_server)
    remote = judge.score(PROMPTS, RESPONSES)
    local = scorer.score(PROMPTS, RESPONSES)
    assert remote == pytest.approx(local, abs=1e-5)
    assert fresh_server.hits == len(PROMPTS) and judge.requests_sent == len(PROMPTS)
    # multi-turn prompts are sent as the prompt messages followed by the assistant reply
    assert [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again?"},
            {"role": "assistant", "content": "Hi again."}] in fresh_server.conversations
    assert [{"role": "user", "content": "Name a fruit."}, {"role": "assistant",
                                                           "content": "A banana."}] in fresh_server.conversations
    # a repeated pair within one call, and a second call, are not sent again (in-memory cache)
    assert judge.score(PROMPTS[:2] * 2, RESPONSES[:2] * 2) == pytest.approx(local[:2] * 2, abs=1e-5)
    assert fresh_server.hits == len(PROMPTS)


def test_429_is_retried_then_succeeds(fresh_server, scorer):
    fresh_server.fail_429 = 3
    judge = make_judge(fresh_server, max_concurrency=1)
    assert judge.score(PROMPTS[:2], RESPONSES[:2]) == pytest.approx(scorer.score(PROMPTS[:2], RESPONSES[:2]), abs=1e-5)
    assert fresh_server.hits == 3 + 2
    assert judge.requests_sent == 5


def test_retries_are_bounded(fresh_server):
    fresh_server.fail_429 = 100
    judge = make_judge(fresh_server, max_concurrency=1, max_retries=2)
    with pytest.raises(JudgeError, match="after 2 retries"):
        judge.score(PROMPTS[:1], RESPONSES[:1])
    assert fresh_server.hits == 3  # the first attempt + 2 retries


def test_non_retryable_error_fails_at_once(fresh_server):
    fresh_server.error_400 = True
    with pytest.raises(JudgeError, match="HTTP 400"):
        make_judge(fresh_server, max_concurrency=1).score(PROMPTS[:1], RESPONSES[:1])
    assert fresh_server.hits == 1


def test_reply_without_reward_field(fresh_server):
    fresh_server.content_format = "helpfulness:{value!r},correctness:1.0"
    with pytest.raises(JudgeError, match="no 'reward' field"):
        make_judge(fresh_server, max_concurrency=1).score(PROMPTS[:1], RESPONSES[:1])
    assert fresh_server.hits == 1  # not retried: a malformed reply will not improve
    fresh_server.content_format = "helpfulness:{value!r},correctness:1.0"
    judge = make_judge(fresh_server, reward_key="helpfulness")
    assert len(judge.score(PROMPTS[:1], RESPONSES[:1])) == 1


def test_connection_errors_are_retried(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    judge = RemoteRewardJudge(f"http://127.0.0.1:{port}/v1", JUDGE_MODEL, api_key_env=KEY_ENV, max_retries=2,
                              backoff_s=0.01, timeout_s=5)
    with pytest.raises(JudgeError, match="after 2 retries"):
        judge.score(["hi"], ["there"])
    assert judge.requests_sent == 3


# --------------------------------------------------------------------------- cache and resume


def test_interrupted_evaluation_resumes_from_cache(fresh_server, scorer, tmp_path):
    cache = tmp_path / "judge_cache.jsonl"
    local = scorer.score(PROMPTS, RESPONSES)

    # 1. the server dies (503 forever) after 2 scored pairs: the evaluation stops with an error
    fresh_server.fail_after = 2
    with pytest.raises(JudgeError):
        make_judge(fresh_server, cache, max_concurrency=1, max_retries=1).score(PROMPTS, RESPONSES)
    lines = cache.read_text().splitlines()
    assert len(lines) == 2  # appended and flushed per scored pair
    assert {json.loads(line)["key"]
            for line in lines} == {
                cache_key(fresh_server.base_url, JUDGE_MODEL, [{"role": "user", "content": PROMPTS[0]}], RESPONSES[0]),
                cache_key(fresh_server.base_url, JUDGE_MODEL, PROMPTS[1], RESPONSES[1])
            }

    # 2. a new judge (a new process, say) with the same cache only sends the 4 missing pairs
    fresh_server.reset()
    judge = make_judge(fresh_server, cache)
    assert judge.score(PROMPTS, RESPONSES) == pytest.approx(local, abs=1e-5)
    assert fresh_server.hits == len(PROMPTS) - 2
    assert len(cache.read_text().splitlines()) == len(PROMPTS)

    # 3. a third run sends nothing; a torn last line (killed mid-write) is ignored and re-scored
    fresh_server.reset()
    assert make_judge(fresh_server, cache).score(PROMPTS, RESPONSES) == pytest.approx(local, abs=1e-5)
    assert fresh_server.hits == 0
    text = cache.read_text().splitlines()
    cache.write_text("\n".join(text[:-1]) + "\n" + text[-1][: len(text[-1]) // 2])
    fresh_server.reset()
    assert make_judge(fresh_server, cache).score(PROMPTS, RESPONSES) == pytest.approx(local, abs=1e-5)
    assert fresh_server.hits == 1


def test_first_run_with_a_limit_then_the_rest(fresh_server, tmp_path):
    cache = tmp_path / "cache.jsonl"
    first = make_judge(fresh_server, cache).score(PROMPTS[:3], RESPONSES[:3])
    assert fresh_server.hits == 3
    everything = make_judge(fresh_server, cache).score(PROMPTS, RESPONSES)
    assert fresh_server.hits == len(PROMPTS)  # only the 3 new pairs were sent
    assert everything[:3] == first
    # another judge model is another key: nothing is reused across judges
    other = RemoteRewardJudge(fresh_server.base_url, "other-model", api_key_env=KEY_ENV, backoff_s=0.01,
                              cache_path=cache)
    assert other.cached(PROMPTS[0], RESPONSES[0]) is None


# --------------------------------------------------------------------------- the API key


def test_api_key_is_sent_but_never_written_or_logged(fresh_server, tmp_path, all_logs, capfd):
    cache = tmp_path / "cache.jsonl"
    fresh_server.fail_429 = 1  # a retry warning gets logged too
    judge = make_judge(fresh_server, cache)
    judge.score(PROMPTS, RESPONSES)
    fresh_server.error_400 = True
    with pytest.raises(JudgeError) as failure:
        judge.score(["a new prompt"], ["a new response"])

    assert set(fresh_server.auth_headers) == {f"Bearer {API_KEY}"}  # the key did reach the server
    assert API_KEY not in cache.read_text()
    assert API_KEY not in repr(judge) and API_KEY not in str(failure.value)
    assert any("retry" in r.getMessage() for r in all_logs.records)  # logs were captured at all,
    assert any(r.name.startswith("openai") for r in all_logs.records)  # the client's debug logs included
    assert API_KEY not in all_logs.text
    assert all(API_KEY not in r.getMessage() for r in all_logs.records)
    out, err = capfd.readouterr()
    assert API_KEY not in out and API_KEY not in err


def test_missing_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ValueError, match=KEY_ENV):
        RemoteRewardJudge("http://127.0.0.1:9/v1", JUDGE_MODEL, api_key_env=KEY_ENV)


# --------------------------------------------------------------------------- parsing


def test_parse_reward():
    assert parse_reward("reward:-7.5") == -7.5
    assert parse_reward(" helpfulness:1.6, reward : 2.25 ,verbosity:0.5") == 2.25
    assert parse_reward("helpfulness:1.6,correctness:1.65", key="correctness") == 1.65
    for bad, message in (("", "empty"), ("score=3", "no 'reward'"), ("reward:abc", "not a number"), (None, "empty")):
        with pytest.raises(JudgeError, match=message):
            parse_reward(bad)
