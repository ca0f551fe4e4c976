"""The RL loop's rank helpers: start the torchrun process group and refuse what runs in one process only
(:func:`start_ranks`), and the two collectives of an update (:func:`rows_everywhere`, :func:`zero_gradient`).

Everything here is a no-op or the one-process value without torchrun. The other collectives of a step sit with what
they reduce: the loss's normalisers and the KL in the reward with the log-probs (:mod:`rlft.rl.logprobs`), the
metrics' sums with the metrics (:mod:`rlft.rl.metrics`), the rewards with sampling (:mod:`rlft.rl.sampling`).
"""

from __future__ import annotations

import torch

from rlft import distributed
from rlft.rollout.engines import check_training_engine
from rlft.validation import UsageError


def start_ranks(device: str, rollout_engine: str, replay_size: int) -> None:
    """Join the torchrun process group (a no-op without torchrun), then refuse, before anything loads, what cannot run
    under it: a rollout engine that cannot follow the policy (:func:`rlft.rollout.engines.check_training_engine`), and
    ``--replay-size`` (each rank would hold only its own groups).

    Raises:
        UsageError: either refusal, naming the option.
    """
    distributed.init(device)  # under torchrun only
    check_training_engine(rollout_engine)
    if replay_size and distributed.active():
        raise UsageError("--replay-size runs in one process: each rank would hold only its own groups "
                         "(drop torchrun or --replay-size)")


def rows_everywhere(rows: torch.Tensor) -> int:
    """How many rows ``rows`` (``(M,)``, this rank's) the ranks hold together. Collective under torchrun."""
    return int(distributed.all_reduce_sum(len(rows)))


def zero_gradient(model: torch.nn.Module) -> None:
    """Give every trainable parameter of ``model`` a zero gradient: an update with nothing to learn from (every rank
    alike, so the optimizer's collectives match). A model sharded by FSDP2 is resharded first (the no-grad passes
    before left its root group gathered, as plain tensors)."""
    distributed.reshard(model)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
