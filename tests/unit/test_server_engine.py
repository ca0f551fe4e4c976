"""OpenAICompletionsEngine against a real HTTP server on 127.0.0.1 that speaks vLLM's /v1/completions protocol:
request fields, choice order, ids/text/log-probs/finish reasons round-trip, and agreement with HFEngine when
the server is backed by the same tiny model."""

from __future__ import annotations

import json
from dataclasses import replace
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

pytest.importorskip("openai")

from rlft.ops import sequence_logprobs
from rlft.rollout.base import SamplingParams
from rlft.rollout.hf import HFEngine
from rlft.rollout.server import OpenAICompletionsEngine

from tests.conftest import make_scaled_tiny_model

torch.set_num_threads(1)


class FakeVLLM:
    """A ThreadingHTTPServer on a free port: GET /v1/models, POST /v1/completions answered by ``backend(body)``
    (a list of choice dicts). Records every request body."""

    def __init__(self, backend, model_name: str = "tiny"):
        self.backend, self.model_name, self.requests = backend, model_name, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._reply(
                        200, {
                            "object": "list",
                            "data": [{"id": outer.model_name, "object": "model", "created": 0, "owned_by": "rlft"}]
                        })
                else:
                    self._reply(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/completions":
                    return self._reply(404, {"error": {"message": "not found"}})
                outer.requests.append(body)
                try:
                    choices = outer.backend(body)
                except Exception as e:  # noqa: BLE001 - reported to the client as a server error
                    return self._reply(500, {"error": {"message": str(e), "type": "server_error"}})
                self._reply(
                    200, {
                        "id": "cmpl-1", "object": "text_completion", "created": 0, "model": body["model"],
                        "choices": choices, "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
                    })

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def choice(index: int, ids: list[int], logprobs: list[float], finish: str, text: str, *, as_token_ids=True,
           with_ids=False) -> dict:
    out = {
        "index": index, "text": text, "finish_reason": finish, "stop_reason": None, "logprobs": {
            "tokens": [f"token_id:{i}" if as_token_ids else f"t{i}" for i in ids], "token_logprobs": logprobs,
            "top_logprobs": [{f"token_id:{i}": lp} for i, lp in zip(ids, logprobs)],
            "text_offset": list(range(len(ids)))
        }
    }
    if with_ids:
        out["token_ids"] = ids
    return out


# --------------------------------------------------------------------------- protocol, canned replies


def test_request_fields_choice_order_and_round_trip(smol_tokenizer):
    tok = smol_tokenizer
    eos = tok.eos_token_id

    def backend(body):
        base = sum(body["prompt"]) % 1000
        out = []
        for j in range(body["n"]):  # choice j: 3 + j tokens; even j stop with EOS, odd j hit the length limit
            ids = [base + j + t for t in range(2 + j)] + ([eos] if j % 2 == 0 else [base])
            lps = [-0.25 * (t + 1) - j for t in range(len(ids))]
            out.append(
                choice(j, ids, lps, "stop" if j % 2 == 0 else "length", tok.decode(ids, skip_special_tokens=True),
                       with_ids=(j == 1)))
        return out[::-1]  # out of order on purpose: the engine sorts by index

    prompts = ["Using 1 2 3, make 6.", "Hello there", "x"]
    with FakeVLLM(backend) as server:
        engine = OpenAICompletionsEngine(server.url, tok, eos_token_ids={7}, max_retries=0)
        assert engine.model == "tiny" and engine.base_url == server.url + "/v1"
        params = SamplingParams(k=3, temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=9, seed=11)
        result = engine.generate(prompts, params)
        requests = sorted(server.requests, key=lambda r: r["seed"])
    prompt_ids = tok(prompts)["input_ids"]
    assert len(requests) == 3
    for b, req in enumerate(requests):
        assert req["prompt"] == prompt_ids[b] and req["model"] == "tiny"
        assert (req["n"], req["temperature"], req["top_p"], req["top_k"], req["max_tokens"],
                req["seed"]) == (3, 0.7, 0.9, 5, 9, 11 + b)
        assert req["logprobs"] == 0 and req["return_tokens_as_token_ids"] is True and req["skip_special_tokens"] is True
        assert req["stop_token_ids"] == sorted({eos, 7})
    assert [len(r) for r in result] == [3, 3, 3]
    for b, samples in enumerate(result):
        base = sum(prompt_ids[b]) % 1000
        for j, s in enumerate(samples):
            ids = [base + j + t for t in range(2 + j)] + ([eos] if j % 2 == 0 else [base])
            assert s.completion_ids == ids
            assert s.logprobs == [-0.25 * (t + 1) - j for t in range(len(ids))]
            assert s.finish_reason == ("stop" if j % 2 == 0 else "length")
            assert s.text == tok.decode(ids, skip_special_tokens=True)


def test_greedy_request_and_stop_without_eos(smol_tokenizer):
    tok = smol_tokenizer

    def backend(body):
        return [choice(0, [5, 6], [-1.0, -2.0], "stop", "ab")]  # "stop" but no EOS id in the ids (a stop string)

    with FakeVLLM(backend) as server:
        engine = OpenAICompletionsEngine(server.url + "/v1/", tok, model="served", max_retries=0)
        [[sample]] = engine.generate(["hi"], SamplingParams(temperature=0.0, max_new_tokens=4))
        [req] = server.requests
    assert req["temperature"] == 0.0 and "top_p" not in req and "top_k" not in req and "seed" not in req
    assert req["model"] == "served"
    assert sample.completion_ids == [5, 6, tok.eos_token_id
                                     ] and sample.logprobs is None and sample.finish_reason == "stop"


def test_protocol_errors_are_reported(smol_tokenizer):
    import openai

    replies = {"tokens": lambda body: [choice(0, [5], [-1.0], "stop", "a", as_token_ids=False)],
               "finish": lambda body: [choice(0, [5], [-1.0], "abort", "a")],
               "count": lambda body: [choice(0, [5], [-1.0], "length", "a")],
               "crash": lambda body: 1 / 0}
    with FakeVLLM(lambda body: replies[body["model"]](body)) as server:
        def run(name, k=1):
            return OpenAICompletionsEngine(server.url, smol_tokenizer, model=name, max_retries=0).generate(
                ["hi"], SamplingParams(k=k, max_new_tokens=2))

        with pytest.raises(RuntimeError, match="return_tokens_as_token_ids"):
            run("tokens")
        with pytest.raises(RuntimeError, match="finish_reason 'abort'"):
            run("finish")
        with pytest.raises(RuntimeError, match="1 choices .* expected n=2"):
            run("count", k=2)
        with pytest.raises(openai.InternalServerError, match="division by zero"):
            run("crash")
        engine = OpenAICompletionsEngine(server.url, smol_tokenizer, model="count", max_retries=0)
        assert engine.generate([], SamplingParams()) == []
        with pytest.raises(ValueError, match="top_p"):
            engine.generate(["hi"], SamplingParams(top_p=0.0))


# --------------------------------------------------------------------------- a server backed by a model


def model_backend(model, tokenizer):
    """Greedy decoding without a KV cache (a full forward per token), log-prob of each chosen token."""

    @torch.no_grad()
    def backend(body):
        assert body["temperature"] == 0.0
        ids = list(body["prompt"])
        out, lps, finish = [], [], "length"
        for _ in range(body["max_tokens"]):
            logits = model(input_ids=torch.tensor([ids + out])).logits[0, -1].float()
            token = int(logits.argmax())
            out.append(token)
            lps.append(float(torch.log_softmax(logits, -1)[token]))
            if token in body["stop_token_ids"]:
                finish = "stop"
                break
        text = tokenizer.decode(out, skip_special_tokens=body["skip_special_tokens"])
        return [choice(j, out, lps, finish, text) for j in range(body["n"])]

    return backend


def test_server_backed_by_a_model_matches_hf_engine(smol_tokenizer):
    tok = smol_tokenizer
    model = make_scaled_tiny_model(len(tok), seed=3).eval()
    prompts = ["Using the numbers 3, 5, 7", "Hello", "Q: what is 2 + 2?\nA:"]
    greedy = SamplingParams(k=2, temperature=0.0, max_new_tokens=10)
    first = HFEngine(model, tok).generate(prompts, greedy)
    extra_eos = first[0][0].completion_ids[4]  # make prompt 0 (at least) stop early with an EOS id
    model.generation_config.eos_token_id = [tok.eos_token_id, extra_eos]
    expected = HFEngine(model, tok).generate(prompts, greedy)
    assert any(s.finish_reason == "stop" for r in expected for s in r)
    assert any(s.finish_reason == "length" for r in expected for s in r)

    with FakeVLLM(model_backend(model, tok)) as server:
        engine = OpenAICompletionsEngine(server.url, tok, eos_token_ids={extra_eos}, max_retries=0)
        got = engine.generate(prompts, greedy)
    prompt_ids = tok(prompts)["input_ids"]
    for b in range(len(prompts)):
        for s, e in zip(got[b], expected[b]):
            assert (s.completion_ids, s.text, s.finish_reason) == (e.completion_ids, e.text, e.finish_reason)
            ids = torch.tensor([prompt_ids[b] + s.completion_ids])
            mask = torch.zeros_like(ids, dtype=torch.float32)
            mask[0, len(prompt_ids[b]):] = 1
            recomputed = sequence_logprobs(model, ids, torch.ones_like(ids), mask)[0, len(prompt_ids[b]):]
            torch.testing.assert_close(torch.tensor(s.logprobs), recomputed, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- --rollout-engine


def test_make_engine_rejects_unknown_kind_and_server_without_url(smol_tokenizer):
    from rlft.models import pick_device
    from rlft.rollout.engines import make_engine

    spec = pick_device("cpu", "float32")
    with pytest.raises(ValueError, match="unknown rollout engine"):
        make_engine("tgi", "x", smol_tokenizer, spec)
    with pytest.raises(ValueError, match="--rollout-url"):
        make_engine("server", "x", smol_tokenizer, spec)


def test_eval_countdown_with_the_server_engine_matches_hf(tmp_path, smol_tokenizer):
    """`rlft eval countdown --rollout-engine server` against a server backed by the same tiny model as
    `--rollout-engine hf`."""
    from rlft.eval.countdown_command import EvalCountdownConfig, run_eval_countdown

    from tests.conftest import save_model_dir

    model = make_scaled_tiny_model(len(smol_tokenizer), seed=5).eval()
    model_dir = save_model_dir(tmp_path / "tiny", model, smol_tokenizer)
    base = EvalCountdownConfig(model=str(model_dir), limit=3, max_new_tokens=5, device="cpu", dtype="float32")
    hf = run_eval_countdown(base)
    with FakeVLLM(model_backend(model, smol_tokenizer), model_name=str(model_dir)) as server:
        served = run_eval_countdown(replace(base, rollout_engine="server", rollout_url=server.url + "/v1"))
        assert len(server.requests) == 3 and all(r["model"] == str(model_dir) for r in server.requests)
    assert served.examples == hf.examples
    assert (served.accuracy, served.mean_completion_tokens) == (hf.accuracy, hf.mean_completion_tokens)


def test_stop_repeats_cuts_whole_samples_where_the_decoders_stop(smol_tokenizer):
    """A server (like vLLM) generates each sample whole; with stop_repeats=3 a sample that writes one line 3 times is
    cut right after that line's newline, as rlft's decoders stop it: ids, log-probs and text cut, "length", looped.
    A sample that does not loop, and every sample without stop_repeats, comes back whole."""
    tok = smol_tokenizer
    looping = tok("1+2=3, no.\n1+2=3, no.\n1+2=3, no.\n1+2=3, no.\n")["input_ids"] + [tok.eos_token_id]
    fine = tok("1+2=3, no.\n2*3=6\n")["input_ids"] + [tok.eos_token_id]
    expected_cut = len(tok("1+2=3, no.\n1+2=3, no.\n1+2=3, no.\n")["input_ids"])

    def backend(body):
        return [choice(j, ids, [-0.5] * len(ids), "stop", tok.decode(ids, skip_special_tokens=True))
                for j, ids in enumerate((looping, fine))]

    with FakeVLLM(backend) as server:
        engine = OpenAICompletionsEngine(server.url, tok, max_retries=0)
        [[cut, whole]] = engine.generate(["p"], SamplingParams(k=2, temperature=1.0, max_new_tokens=64, stop_repeats=3))
        [[uncut, _]] = engine.generate(["p"], SamplingParams(k=2, temperature=1.0, max_new_tokens=64))
    assert cut.completion_ids == looping[:expected_cut] and cut.logprobs == [-0.5] * expected_cut
    assert cut.text == "1+2=3, no.\n1+2=3, no.\n1+2=3, no.\n" and cut.finish_reason == "length" and cut.looped
    assert whole.completion_ids == fine and whole.finish_reason == "stop" and not whole.looped
    assert uncut.completion_ids == looping and not uncut.looped
