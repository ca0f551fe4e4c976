"""W-REINFORCE (rlft.losses.wreinforce, ``--positive-weight``): positive samples' loss weights times lambda.

Hand-derived (lambda 0.1, N = 4 samples, ``--loss reinforce`` at ratio 1, ``seq_sum``):

- weights ``A = [0.6, -0.2, -0.4, 0.0] -> w = [0.06, -0.2, -0.4, 0.0]`` (only A > 0 is scaled);
- completion lengths ``[2, 1, 3, 2]``: per token ``l_t = -w_i * ratio_t = -w_i``; ``seq_sum`` averages the sequences'
  sums, so the loss is ``-(0.06*2 - 0.2*1 - 0.4*3 + 0*2) / 4 = -(0.12 - 0.2 - 1.2) / 4 = 1.28 / 4 = 0.32``;
- ``d loss / d logp_t = -w_i * ratio_t / 4 = -w_i / 4``: ``-0.015`` (sample 0), ``0.05`` (1), ``0.1`` (2), ``0`` (3) on
  each completion token, 0 off the mask.
"""

from __future__ import annotations

import pytest
import torch

from rlft.losses.pg import PolicyObjective, make_objective
from rlft.losses.wreinforce import positive_weighting

A = torch.tensor([0.6, -0.2, -0.4, 0.0])
LENGTHS = [2, 1, 3, 2]


def mask(lengths, width=3):
    return torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-7 * float(expected.abs().max().clamp(min=1.0)))


def test_positive_weighting_by_hand():
    close(positive_weighting(A, 0.1), torch.tensor([0.06, -0.2, -0.4, 0.0]))
    close(positive_weighting(A, 0.0), torch.tensor([0.0, -0.2, -0.4, 0.0]))  # NSR: negative samples only
    assert positive_weighting(A, 1.0) is A  # off
    for bad in (-0.1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="positive-sample weight"):
            positive_weighting(A, bad)
    with pytest.raises(ValueError, match="positive-sample weight"):
        PolicyObjective(positive_weight=-1.0)


def test_objective_loss_and_gradient_by_hand():
    objective = PolicyObjective(positive_weight=0.1)
    logprobs = torch.log(torch.full((4, 3), 0.5)).requires_grad_()
    weights = objective.weights(A)
    close(weights, torch.tensor([0.06, -0.2, -0.4, 0.0]))
    loss, _ = objective.loss(logprobs, logprobs.detach(), weights, mask(LENGTHS))
    close(loss.detach(), torch.tensor(0.32))
    loss.backward()
    per_sample = torch.tensor([-0.015, 0.05, 0.1, 0.0]).unsqueeze(1)
    close(logprobs.grad, per_sample * mask(LENGTHS))
    # without the option the positive sample's gradient is 10x larger: -0.6 / 4
    plain = torch.log(torch.full((4, 3), 0.5)).requires_grad_()
    PolicyObjective().loss(plain, plain.detach(), PolicyObjective().weights(A), mask(LENGTHS))[0].backward()
    close(plain.grad[0, :2], torch.tensor([-0.15, -0.15]))


def test_matches_the_papers_objective_on_a_plus_minus_one_reward():
    """With the paper's reward (+1 correct, -1 wrong; ``--advantage reinforce``) the loss's gradient is that of the
    sampled ``lambda * L_PSR + L_NSR``: ``-1/N (lambda sum_correct log pi(y_i) - sum_wrong log pi(y_i))``."""
    torch.manual_seed(0)
    base = torch.randn(4, 3) - 2.0
    reward = torch.tensor([1.0, -1.0, 1.0, -1.0])
    m = mask([3, 2, 1, 3])
    ours = base.clone().requires_grad_()
    objective = PolicyObjective(positive_weight=0.1)
    objective.loss(ours, ours.detach(), objective.weights(reward), m)[0].backward()
    paper = base.clone().requires_grad_()
    seq = (paper * m).sum(dim=1)  # log pi(y_i | x)
    correct = reward > 0
    (-(0.1 * seq[correct].sum() - seq[~correct].sum()) / 4).backward()
    close(ours.grad, paper.grad)


def test_make_objective_reads_the_option_and_nsr_skips_positive_rows():
    from rlft.rl.batch import gradient_rows
    from rlft.rl.config import RLConfig

    def objective(cfg):
        return make_objective(cfg.policy, cfg.kl, cfg.importance)

    assert objective(RLConfig()).positive_weight == 1.0
    assert objective(RLConfig(positive_weight=0.1)).positive_weight == 0.1
    nsr = objective(RLConfig(positive_weight=0.0))
    assert gradient_rows(nsr.weights(A), nsr).tolist() == [1, 2]  # weight 0: no forward, no backward
