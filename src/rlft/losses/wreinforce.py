"""W-REINFORCE: positive samples' policy-gradient terms down-weighted (``--positive-weight``).

Zhu, Xia, Wei, Chen, Chen, Meng 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning"
(arXiv 2506.01347). With a verifiable reward ``r(x, y) = +1`` (correct) or ``-1`` (wrong) the RLVR objective splits
into Positive and Negative Sample Reinforcement,

    L_PSR(theta) = -E_x[ sum_{y: r(x,y)=+1}  pi_theta(y|x) ],
    L_NSR(theta) = -E_x[ sum_{y: r(x,y)=-1} -pi_theta(y|x) ],

and W-REINFORCE minimises ``L_W-REINFORCE(theta) = lambda * L_PSR(theta) + L_NSR(theta)``, lambda = 0.1 in the
paper (lambda = 0 is NSR alone, 1 plain REINFORCE on the +-1 reward). Its sampled gradient, over N samples
``y_i ~ pi_theta``, is ``-1/N sum_i w_i grad log pi_theta(y_i|x)`` with ``w_i = lambda`` for a correct sample and
``w_i = -1`` for a wrong one (the authors' code: the advantage of a correct sample times lambda, ``r - 1 = -1`` for
a wrong one, r in {0, 1}).

rlft applies lambda to the per-sample loss weights the advantage estimator gave (:func:`positive_weighting`):
``w_i = lambda * A_i`` where ``A_i > 0``, ``A_i`` elsewhere; the loss (``-w_i * ratio``, any ``--loss``) is unchanged.
This is the paper's objective exactly when ``A_i`` is its +-1 reward (``--advantage reinforce`` on a +-1 reward).
Where rlft differs: Countdown's reward is 1 / 0.1 / 0 (never negative), so with ``--advantage reinforce`` no sample
is negative; with a group baseline (``--advantage rloo``, ``dr_grpo``, ``grpo``) the correct samples of a mixed group
have ``A > 0`` and the wrong ones ``A < 0``, and lambda scales the former, but a group whose samples all score alike
has ``A = 0`` and no signal (the paper pushes an all-wrong group down, -1 per sample).

By hand (:func:`positive_weighting`, lambda 0.1): ``A = [0.6, -0.2, -0.4, 0.0] -> [0.06, -0.2, -0.4, 0.0]``; under
``--loss reinforce`` at ratio 1 with ``seq_sum`` the gradient of the loss with respect to each completion token's
log-prob is ``-w_i / N``: ``[-0.015, 0.05, 0.1, 0.0]`` for N = 4 (tests/unit/test_pg_positive_weight.py).
"""

from __future__ import annotations

import torch


def positive_weighting(weights: torch.Tensor, positive_weight: float) -> torch.Tensor:
    """W-REINFORCE's per-sample loss weights: ``positive_weight * w`` where ``w > 0``, ``w`` elsewhere (see the module
    docstring). ``(N,) -> (N,)`` (any shape), same dtype; ``positive_weight == 1`` returns ``weights`` itself.

    Raises:
        ValueError: ``positive_weight`` negative or not finite (a negative weight would push correct samples down).
    """
    if not (0.0 <= positive_weight < float("inf")):
        raise ValueError(f"the positive-sample weight must be a finite number >= 0, got {positive_weight}")
    if positive_weight == 1.0:
        return weights
    return torch.where(weights > 0, weights * positive_weight, weights)
