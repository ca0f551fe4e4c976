"""A reward model behind an OpenAI-compatible chat-completions API (e.g. NVIDIA's
``nvidia/llama-3.1-nemotron-70b-reward`` at ``https://integrate.api.nvidia.com/v1``).

Such an endpoint takes the conversation to judge, ending with the assistant's response, and replies
with a message whose content is ``name:value`` pairs separated by commas, e.g. ``"reward:-7.5"``.
:class:`RemoteRewardJudge` has the same ``score(prompts, responses) -> list[float]`` interface as the
local :class:`rlft.rewards.reward_model.RewardModelScorer`.

- Retries: HTTP 429, 5xx, timeouts, connection errors and bad replies (not JSON, an HTML page, no
  choices, a reward that is not finite: ``nan``, ``inf``) are retried with exponential backoff
  (``backoff_s * 2**attempt``, at most 60 s, or the server's ``Retry-After`` when longer), up to
  ``max_retries`` times, then reported; other errors (400, 401, 404, a reply without the reward
  field) fail at once. Each attempt is limited to ``timeout_s``, so one pair takes at most
  ``(max_retries + 1) * timeout_s`` plus the backoff delays.
- Nothing that is not a finite number is ever returned or cached.
- Concurrency: at most ``max_concurrency`` requests in flight (a thread pool).
- Cache: with ``cache_path``, every scored pair is appended to a JSONL file (and flushed) as soon as
  it is scored, keyed by a SHA-256 of (API root, judge model, prompt messages, response); a later call with the
  same file, e.g. after an interrupted evaluation, only sends the pairs that are not in it. Cache
  lines hold the key, the model name and the reward: no prompt text, no credentials.
- The API key is read from the environment variable ``api_key_env`` and kept only inside the client:
  it is never logged, written to the cache or put in an error message. Error messages carry the HTTP
  status, never the reply body or headers (a server may echo the request's headers), and any text
  quoted from a reply has the key masked.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from rlft.rewards.reward_model import Messages, Prompt, as_messages

log = logging.getLogger("rlft")

MAX_BACKOFF_S = 60.0


class JudgeError(RuntimeError):
    """The judge could not score a pair (bad reply, non-retryable HTTP error, retries exhausted)."""


class BadReplyError(JudgeError):
    """A reply that may be a glitch of the server (not JSON, no choices, a non-finite reward): retried."""


def parse_reward(content: str | None, key: str = "reward") -> float:
    """The value of ``key`` in a reply such as ``"reward:-7.5"`` or ``"helpfulness:1.6,correctness:2"``.

    Raises:
        JudgeError: the content is empty, malformed, lacks ``key`` or its value is not a number.
    """
    if not content or not content.strip():
        raise JudgeError("the judge's reply is empty; expected 'name:value' pairs such as 'reward:-7.5'")
    fields: dict[str, str] = {}
    for part in content.split(","):
        name, sep, value = part.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    if key.lower() not in fields:
        raise JudgeError(f"the judge's reply has no {key!r} field: {content[:200]!r} (fields: {sorted(fields)})")
    try:
        value = float(fields[key.lower()])
    except ValueError:
        raise JudgeError(f"the judge's {key!r} value is not a number: {fields[key.lower()][:60]!r}") from None
    if not math.isfinite(value):
        raise BadReplyError(f"the judge's {key!r} value is not a finite number: {fields[key.lower()][:60]!r}")
    return value


def cache_key(base_url: str, model: str, messages: Messages, response: str) -> str:
    """SHA-256 hex digest identifying one judgement: the API root, the judge model, the prompt messages
    and the response (another server or judge model never reuses a score)."""
    blob = json.dumps([base_url.rstrip("/"), model, messages, response], ensure_ascii=False, separators=(",", ":"),
                      sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class RemoteRewardJudge:
    """Scores (prompt, response) pairs with a reward model served behind an OpenAI-compatible API.

    Args:
        base_url: the API root, e.g. ``https://integrate.api.nvidia.com/v1``.
        model: the judge model name sent with every request.
        api_key_env: environment variable holding the API key (read once, here).
        max_concurrency: most requests in flight at once.
        max_retries: retries per pair after the first attempt (429 / 5xx / connection errors / bad replies).
        backoff_s: first retry delay in seconds; doubles on each retry (capped at 60 s).
        timeout_s: per-attempt timeout in seconds (connect, send, each read).
        cache_path: JSONL cache file (created if missing); None: no cache.
        reward_key: the field of the reply holding the reward.
    Raises:
        ValueError: the API key variable is unset or empty.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "NVIDIA_API_KEY",
        max_concurrency: int = 4,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        timeout_s: float = 60,
        cache_path: str | Path | None = None,
        reward_key: str = "reward",
    ):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0 or backoff_s < 0 or timeout_s <= 0:
            raise ValueError("max_retries and backoff_s must be >= 0 and timeout_s > 0")
        api_key = os.environ.get(api_key_env, "")
        if not api_key:
            raise ValueError(
                f"the remote judge needs an API key in the environment variable {api_key_env} (unset or empty)")
        try:
            import openai
        except ImportError:
            raise ImportError(
                "the remote judge needs the openai client: pip install 'rlft[remote]' (or `pip install openai`)"
            ) from None
        self._openai = openai
        self._mask = api_key
        # The client's own retries are off: ours are explicit, bounded and logged.
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s)
        self.base_url, self.model = base_url, model
        self.max_concurrency, self.max_retries = max_concurrency, max_retries
        self.backoff_s, self.timeout_s = backoff_s, timeout_s
        self.reward_key = reward_key
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self._cache: dict[str, float] = self._read_cache()
        self._lock = threading.Lock()
        self.requests_sent = 0
        """HTTP requests sent by this judge (retries included)."""

    def __repr__(self) -> str:  # never show the client (it holds the key)
        return f"RemoteRewardJudge(base_url={self.base_url!r}, model={self.model!r})"

    # ------------------------------------------------------------------ cache

    def _read_cache(self) -> dict[str, float]:
        cache: dict[str, float] = {}
        if self.cache_path is None or not self.cache_path.is_file():
            return cache
        bad = 0
        for line in self.cache_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
                reward = float(row["reward"])
                if not math.isfinite(reward):
                    raise ValueError("not finite")
                cache[row["key"]] = reward
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                bad += 1  # e.g. a line cut short by a kill, or a non-finite score: that pair is scored again
        if bad:
            log.warning("%s: ignored %d unreadable cache lines", self.cache_path, bad)
        log.info("judge cache %s: %d scored pairs", self.cache_path, len(cache))
        return cache

    def _remember(self, key: str, reward: float) -> None:
        if not math.isfinite(reward):  # parse_reward never lets one through; kept as a guard for the cache
            raise BadReplyError(f"the judge at {self.base_url} returned a non-finite reward {reward!r}")
        with self._lock:
            self._cache[key] = reward
            if self.cache_path is not None:
                self.cache_path.parent.mkdir(parents=True, exist_ok=True)
                with self.cache_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "model": self.model, "reward": reward}) + "\n")
                    f.flush()

    def cached(self, prompt: Prompt, response: str) -> float | None:
        """The cached reward of a pair, or None."""
        return self._cache.get(self._key(as_messages(prompt), response))

    def _key(self, messages: Messages, response: str) -> str:
        return cache_key(self.base_url, self.model, messages, response)

    def _safe(self, text: str) -> str:
        """``text`` with the API key masked (replies may echo the request's headers)."""
        return text.replace(self._mask, "[API key]") if self._mask else text

    # ------------------------------------------------------------------ requests

    def _retryable(self, error: Exception) -> bool:
        o = self._openai
        if isinstance(error, (o.RateLimitError, o.InternalServerError, o.APIConnectionError)):  # timeouts included
            return True
        return isinstance(error, o.APIStatusError) and (error.status_code == 429 or error.status_code >= 500)

    def _delay(self, attempt: int, error: Exception) -> float:
        delay = min(MAX_BACKOFF_S, self.backoff_s * 2**attempt)
        response = getattr(error, "response", None)
        retry_after = response.headers.get("retry-after") if response is not None else None
        if retry_after:
            try:
                delay = max(delay, min(MAX_BACKOFF_S, float(retry_after)))
            except ValueError:
                pass
        return delay * (1.0 + 0.1 * random.random())  # jitter: concurrent retries do not stay in lockstep

    def _reward(self, completion) -> float:
        """The reward in a reply; BadReplyError when the reply is not a chat completion."""
        choices = getattr(completion, "choices", None)
        if not isinstance(choices, list):
            kind = "an HTML page" if isinstance(completion,
                                                str) and "<" in completion[:200] else f"a {type(completion).__name__}"
            raise BadReplyError(f"the judge's reply is not a chat completion (got {kind})")
        if not choices:
            raise BadReplyError("the judge's reply has no choices")
        content = getattr(getattr(choices[0], "message", None), "content", None)
        if content is not None and not isinstance(content, str):
            raise BadReplyError(f"the judge's reply content is a {type(content).__name__}, not text")
        try:
            return parse_reward(content, self.reward_key)
        except JudgeError as e:
            raise type(e)(self._safe(str(e))) from None

    def _score_one(self, messages: Messages, response: str) -> float:
        conversation = [*messages, {"role": "assistant", "content": response}]
        for attempt in range(self.max_retries + 1):
            try:
                with self._lock:
                    self.requests_sent += 1
                completion = self._client.chat.completions.create(model=self.model, messages=conversation)
                return self._reward(completion)
            except BadReplyError as e:
                error, what = e, str(e)
            except JudgeError:
                raise
            except self._openai.OpenAIError as e:
                # Never the body or headers of the reply: a server may echo the request (and its key).
                status = getattr(e, "status_code", None)
                what = f"HTTP {status}" if status else (
                    "not a JSON reply" if isinstance(e, self._openai.APIResponseValidationError) else type(e).__name__)
                if not self._retryable(e) and not isinstance(e, self._openai.APIResponseValidationError):
                    raise JudgeError(f"the judge at {self.base_url} refused a request ({what})") from None
                error = e
            except (ValueError, TypeError,
                    AttributeError) as e:  # a 200 reply the client could not parse (HTML, not JSON)
                error, what = e, f"unreadable reply ({type(e).__name__})"
            if attempt == self.max_retries:
                raise JudgeError(
                    f"the judge at {self.base_url} still failed after {self.max_retries} retries ({what})") from None
            delay = self._delay(attempt, error)
            log.warning("judge request failed (%s); retry %d/%d in %.2fs", what, attempt + 1, self.max_retries, delay)
            time.sleep(delay)
        raise AssertionError("unreachable")

    def score(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[float]:
        """One reward per pair; cached pairs are not sent again and every new score is cached at once.

        ``prompts[i]`` is a message list (sent as is, then the response as the assistant turn) or a
        plain string (sent as one user message).

        Raises:
            JudgeError: a pair could not be scored; pairs scored before the failure stay cached.
        """
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts and {len(responses)} responses")
        items = [(as_messages(p), r) for p, r in zip(prompts, responses)]
        keys = [self._key(m, r) for m, r in items]
        todo: dict[str, tuple[Messages, str]] = {}
        for key, item in zip(keys, items):
            if key not in self._cache and key not in todo:
                todo[key] = item
        if todo:
            log.info("judging %d pairs with %s (%d cached)", len(todo), self.model, len(set(keys)) - len(todo))
            self._run(todo)
        return [self._cache[k] for k in keys]

    def _run(self, todo: dict[str, tuple[Messages, str]]) -> None:
        def task(key: str, messages: Messages, response: str) -> None:
            self._remember(key, self._score_one(messages, response))

        pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="judge")
        try:
            futures = [pool.submit(task, k, m, r) for k, (m, r) in todo.items()]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for future in done:
                if future.exception() is not None:
                    raise future.exception()
        finally:
            # On failure, queued pairs are dropped; requests already in flight finish (and are cached).
            pool.shutdown(wait=True, cancel_futures=True)
