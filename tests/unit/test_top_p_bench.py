"""bench/top_p.py's incumbent: rlft's warpers with transformers' TopPLogitsWarper in place of TopPWarper, the rest
(temperature, top-k, their order) unchanged, and the same kept tokens from both."""

from __future__ import annotations

import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from rlft.rollout import SamplingParams
from rlft.rollout.decode import TopPWarper, logits_warpers
from tests.conftest import load_script


def test_the_incumbent_swaps_only_top_p():
    bench = load_script("bench/top_p")
    params = SamplingParams(temperature=0.6, top_k=40, top_p=0.95)
    ours, theirs = logits_warpers(params), bench.transformers_warpers(params)
    assert [type(w) for w in ours] == [TemperatureLogitsWarper, TopKLogitsWarper, TopPWarper]
    assert [type(w) for w in theirs] == [TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper]
    assert theirs[2].top_p == 0.95
    torch.manual_seed(0)
    scores = torch.randn(8, 500) * 5
    ids = torch.empty(8, 0, dtype=torch.long)
    assert torch.equal(ours(ids, scores.clone()), theirs(ids, scores.clone()))
    assert [type(w) for w in bench.transformers_warpers(SamplingParams(temperature=0.6))] == [TemperatureLogitsWarper]
