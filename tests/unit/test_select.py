"""Best-of-N selectors (rlft.eval.select) and the decoder's self-certainty, against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.eval.select import (borda_weights, certainty_vote, choose, majority, most_certain, selected_scores,
                              value_groups)
from rlft.rollout.decode import token_statistics


def test_majority_groups_by_value_not_by_text_and_skips_unparsed():
    # 1 + 2 * 8 and 2 * 8 + 1 both equal 17: one group of two; 17.000001 joins it (within 1e-5); None does not vote
    values = [5.0, None, 17.0, 17.000001, 5.0000001, 17.0]
    assert value_groups(values) == [[0, 4], [2, 3, 5]]
    assert majority(values) == 2  # the first sample of the largest group


def test_majority_ties_go_to_the_group_seen_first_and_no_answer_picks_sample_0():
    assert majority([None, 4.0, 9.0, 9.0, 4.0]) == 1  # 4 and 9 both twice: 4's group starts earlier
    assert majority([9.0, 4.0, 4.0, 9.0]) == 0
    assert majority([None, None]) == 0


def test_self_certainty_of_a_three_token_vocabulary_by_hand():
    # p = (1/2, 1/4, 1/4): KL(U || p) = sum_j 1/3 log((1/3) / p_j) = -log 3 - (log 1/2 + 2 log 1/4) / 3
    expected = -math.log(3) - (math.log(0.5) + 2 * math.log(0.25)) / 3  # 0.0566330...
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]])) + 7.0  # a shift changes nothing
    logprob, certainty = token_statistics(logits, torch.tensor([1, 2]), temperature=1.0)
    assert certainty.tolist() == pytest.approx([expected, 0.0], abs=1e-6)
    assert expected == pytest.approx(0.0566330, abs=1e-6)
    assert logprob.tolist() == pytest.approx([math.log(0.25), math.log(1 / 3)], abs=1e-6)
    # the log-prob is tempered (the sampling distribution), the certainty is not
    tempered, same = token_statistics(logits, torch.tensor([0, 0]), temperature=0.5)
    assert tempered[0].item() == pytest.approx(math.log(0.25 / (0.25 + 2 * 0.0625)), abs=1e-6)
    assert same.tolist() == pytest.approx(certainty.tolist(), abs=1e-6)


def test_most_certain_picks_the_highest_first_on_ties_and_needs_every_value():
    assert most_certain([0.2, 0.9, 0.9, 0.1]) == 1
    with pytest.raises(ValueError, match="self-certainty"):
        most_certain([0.2, None])


def test_borda_weights_by_hand():
    # ranks by certainty: sample 2 (r=1), 0 (r=2), 3 (r=3), 1 (r=4); weight (N - r + 1) ** p
    assert borda_weights([0.5, 0.1, 0.9, 0.3], power=1.0) == [3.0, 1.0, 4.0, 2.0]
    assert borda_weights([0.5, 0.1, 0.9, 0.3]) == pytest.approx([math.sqrt(3), 1.0, 2.0, math.sqrt(2)])
    assert borda_weights([0.4, 0.4]) == pytest.approx([math.sqrt(2), 1.0])  # equal certainty: sample order


def test_certainty_vote_can_overrule_the_plain_majority():
    values = [7.0, 7.0, 3.0, 3.0, 3.0]
    certainty = [0.9, 0.8, 0.1, 0.2, 0.3]  # ranks: 0, 1, 4, 3, 2 -> weights 5, 4, 1, 2, 3 (power 1)
    assert majority(values) == 2
    assert certainty_vote(values, certainty, power=1.0) == 0  # 7: 5 + 4 = 9 votes against 3: 1 + 2 + 3 = 6
    assert certainty_vote([None, None], [0.1, 0.5]) == 1  # nothing parses: the most certain sample


def test_choose_reward_model_and_oracle_and_errors():
    kwargs = dict(scores=[0.1, 1.0, 0.0], values=[3.0, 4.0, None], certainty=[0.3, 0.2, 0.1])
    assert choose("reward-model", rm_scores=[0.2, -1.0, 0.7], **
                  kwargs) == 2  # a stub scorer's choice, whatever the rule says
    assert choose("oracle", **kwargs) == 1
    with pytest.raises(ValueError, match="reward-model scores"):
        choose("reward-model", **kwargs)
    with pytest.raises(ValueError, match="unknown selector"):
        choose("vote", **kwargs)


def test_selected_scores_uses_the_first_n_samples():
    scores = [[0.1, 1.0, 1.0, 0.1], [0.0, 0.1, 1.0, 1.0]]
    values = [[5.0, 9.0, 9.0, 5.0], [None, 2.0, 9.0, 9.0]]
    certainty = [[0.5, 0.1, 0.2, 0.4], [0.1, 0.9, 0.2, 0.3]]
    assert selected_scores("majority", scores, values, certainty, 4) == [0.1, 1.0]  # task 0: 5 and 9 tie, 5 first
    assert selected_scores("majority", scores, values, certainty, 1) == [0.1, 0.0]
    assert selected_scores("oracle", scores, values, certainty, 2) == [1.0, 0.1]  # pass@2 per task
    assert selected_scores("self-certainty", scores, values, certainty, 4) == [0.1, 0.1]
    with pytest.raises(ValueError, match="n=5"):
        selected_scores("majority", scores, values, certainty, 5)
