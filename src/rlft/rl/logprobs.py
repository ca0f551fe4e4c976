"""Steps 3-4 of the RL loop, in one place: every log-prob a step's loss needs, and what follows from them
(:func:`step_logprobs`, which returns one :class:`StepLogprobs` record).

For the step's batch (``(N, T)``, this rank's rows, row ``b * k + j`` = sample j of group b) it gathers:

- **sampled**: the sampler's own log-probs of the sampled tokens, when the engine reports them (the HF engine's
  decoders; fresh and replayed rows alike, :func:`rlft.rl.batch.sampler_logprobs`). An importance-sampling correction
  (``--is-correction``) needs them on every rank, and is refused here without them.
- **ref**: the reference policy's (``beta > 0``): the initial model, with LoRA the same model with its adapters off
  (:class:`LogprobPasses`), one no-grad pass.
- **old**: the pre-update policy's, one more no-grad pass, when needed: for the epochs after the first
  (``--ppo-epochs``), the KL in the reward, and as the behaviour policy of replayed rows when the engine reports no
  log-probs.
- **behaviour**: the ratio's denominator with an off-policy objective
  (:attr:`rlft.losses.pg.PolicyObjective.behaviour_ratio`: ``--loss topr``, or replay): the sampler's, else the
  trainer's pre-update log-probs, which are stored with the samples (so the replay buffer keeps them).
- **rewards**: ``(B, k)`` the shaped rewards, minus ``beta * sum_t kl_t`` with ``--kl-mode reward`` (the RLOO
  paper; every rank's groups).
- **the loss rows** (``--mask-truncated``): the truncated samples leave the loss and its normalisers (after counting
  in their group's advantages); a step whose samples are all truncated trains nothing, and a warning names it.
- the loss's normalisers: the whole step's sequences and completion tokens, every rank's.

Log-probs are at the sampling temperature, computed on the unmasked batch, in micro-batches
(:class:`rlft.rl.batch.PassPlan`). Shape legend: B kept groups of every rank, k samples per prompt, N this rank's rows,
T tokens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from rlft import distributed
from rlft.lora import adapters_disabled
from rlft.losses.pg import PolicyObjective, sequence_kl
from rlft.rl.batch import (LossContext, PassPlan, batch_logprobs, filler_batch, masked_rows, sampler_logprobs,
                           with_logprobs)
from rlft.rl.records import StepSamples
from rlft.types import TokenBatch
from rlft.validation import UsageError

log = logging.getLogger("rlft")


@dataclass(frozen=True)
class LogprobPasses:
    """The models and micro-batching the log-prob passes run with, and the options that say which passes a step
    needs; built once, before the loop (:meth:`for_run`)."""

    model: torch.nn.Module
    """The policy."""
    ref_model: torch.nn.Module | None
    """A separate reference model; None: none is needed (``beta == 0``) or, with LoRA, the policy with its adapters
    off."""
    plan: PassPlan
    """Micro-batches, temperature, LM-head chunks; filler passes keep a sharded model's ranks in step."""
    device: torch.device | str
    """Where the passes run (the batch is moved there)."""
    objective: PolicyObjective
    """The loss: whether it needs the reference, the KL in the reward, a behaviour policy, the sampler's log-probs."""
    ppo_epochs: int = 1
    """Optimizer steps per step: more than one needs the pre-update log-probs."""
    replay: bool = False
    """``--replay-size``: replayed rows need a behaviour policy even when the engine reports no log-probs."""
    mask_truncated: bool = False
    """``--mask-truncated``: truncated samples leave the loss."""
    max_new_tokens: int = 0
    """Named by the warning of a step whose samples were all truncated."""

    @classmethod
    def for_run(cls, cfg, spec, model: torch.nn.Module, objective: PolicyObjective, tokenizer) -> LogprobPasses:
        """The passes of ``cfg`` (an :class:`rlft.rl.config.RLConfig`) over ``model`` on ``spec``'s device. With
        ``beta > 0`` and no LoRA (or with ``--ref-model``) the reference is loaded here: ``--ref-model`` or
        ``--model``, never a checkpoint of this run, frozen, and sharded like the policy under FSDP2."""
        from rlft.models import load_model
        from rlft.options import resolved_strategy

        ref_model = None
        if objective.beta > 0 and (cfg.lora_settings() is None or cfg.ref_model is not None):
            ref_model = load_model(cfg.ref_model or cfg.model, spec).eval().requires_grad_(False)
            if distributed.sharded(model):
                ref_model = distributed.wrap_model(ref_model, resolved_strategy(cfg, distributed.world()))
        plan = PassPlan(cfg.temperature, cfg.micro_batch_size, cfg.logits_chunk_size,
                        filler=filler_batch(tokenizer, spec.device), max_tokens=cfg.max_tokens_per_micro_batch)
        return cls(model, ref_model, plan, spec.device, objective, cfg.ppo_epochs, bool(cfg.replay_size),
                   cfg.mask_truncated, cfg.max_new_tokens)

    def reference(self, batch: TokenBatch, plan: PassPlan) -> torch.Tensor:
        """``(N, T)`` the reference policy's log-probs of ``batch`` (no grad)."""
        if self.ref_model is not None:
            return batch_logprobs(self.ref_model, batch, plan)
        with adapters_disabled(self.model):  # LoRA: never sharded
            return batch_logprobs(self.model, batch, plan)


@dataclass(frozen=True)
class StepLogprobs:
    """The tensors a step's loss and metrics need (:func:`step_logprobs`). ``(N, T)`` tensors are row-aligned with
    ``batch``, on its device; None where the step needs none."""

    batch: TokenBatch
    """This rank's teacher-forcing batch, on the training device."""
    train: TokenBatch
    """The loss's batch: ``batch`` with ``--mask-truncated``'s rows left out of the loss mask (else ``batch``)."""
    sampled: torch.Tensor | None
    """The sampler's log-probs; None when the engine reports none."""
    ref: torch.Tensor | None
    """The reference's log-probs (``beta > 0``)."""
    old: torch.Tensor | None
    """The pre-update policy's log-probs (a no-grad pass), when a later epoch, the KL in the reward or replay needs
    them."""
    behaviour: torch.Tensor | None
    """The behaviour policy's log-probs, with an off-policy objective (the ratio's denominator from the first epoch
    on); None with an on-policy one, or without any (no pre-update pass, no sampler's: ratio 1 at the first epoch)."""
    off_policy: bool
    """The objective divides by ``behaviour`` (:attr:`rlft.losses.pg.PolicyObjective.behaviour_ratio`), else by
    ``old`` from the second epoch on."""
    rewards: torch.Tensor
    """``(B, k)`` the rewards the advantages start from: shaped, minus the KL with ``--kl-mode reward``."""
    num_sequences: int
    """The loss's sequence normaliser: the step's samples (every rank's) in the loss."""
    num_tokens: float
    """The loss's token normaliser: the completion tokens of those samples (every rank's)."""
    step_tokens: float
    """The completion tokens of all the step's samples, every rank's (``completion/mean_tokens``)."""
    sampled_everywhere: bool
    """Every rank has the sampler's log-probs (the mismatch metrics are logged then)."""

    @property
    def no_grad_passes(self) -> int:
        """Forward passes without gradient over every row (the reference's and the pre-update policy's: 0, 1 or 2)."""
        return (self.ref is not None) + (self.old is not None)

    def context(self) -> LossContext:
        """What :func:`rlft.rl.batch.policy_loss_backward` compares with: the behaviour log-probs (an off-policy
        objective) or the pre-update ones, the reference's, the sampler's, and the whole step's normalisers."""
        return LossContext(self.behaviour if self.off_policy else self.old, self.ref, self.sampled,
                           num_sequences=self.num_sequences, num_tokens=self.num_tokens)


def step_logprobs(got: StepSamples, passes: LogprobPasses, step: int = 0) -> tuple[StepSamples, StepLogprobs]:
    """Steps 3-4 of the loop for the sampled step ``got``: the passes before the update and the KL in the reward.

    A rank with no groups has an empty batch (FSDP2: it still runs the busiest rank's number of passes, on a
    filler). Collective under torchrun: every rank must call it.

    Returns:
        ``(got, logprobs)``: the step, whose samples now carry the trainer's pre-update log-probs where the engine
        reported none and an off-policy objective needs a behaviour policy (what the replay buffer keeps), and the
        :class:`StepLogprobs` record.
    Raises:
        UsageError: ``--is-correction`` with an engine that reports no log-probs (on any rank).
    """
    objective, model = passes.objective, passes.model
    B, k, local = got.groups, got.raw.shape[1], got.local
    batch = got.batch.to(passes.device)
    sampled = sampler_logprobs(batch, got.samples)  # (N, T) or None: what the sampler itself computed
    missing = distributed.all_reduce_sum(float(sampled is None))  # ranks without the sampler's log-probs
    if objective.is_mode != "none" and missing:
        raise UsageError(f"--is-correction {objective.is_mode} needs the sampler's log-probs, which this engine does "
                         "not report (the HF engine's row-dropping decoder and vLLM do)")
    plan = passes.plan.synced(model, batch)  # passes: None unless sharded
    ref = passes.reference(batch, plan) if objective.beta > 0 else None
    need_old = passes.ppo_epochs > 1 or objective.kl_in_reward or (passes.replay and sampled is None)
    old = batch_logprobs(model, batch, plan) if need_old else None
    behaviour = None
    if objective.behaviour_ratio:
        if sampled is None and old is not None:
            got = replace(got, samples=with_logprobs(got.samples, batch, old))
        behaviour = sampler_logprobs(batch, got.samples)  # None only without a pass: ratio 1 at the first epoch
    rewards = got.shaped
    if objective.kl_in_reward and B:  # R_i - beta * sum_t kl_t, before the advantages (every group's)
        kl_seq = sequence_kl(old, ref, batch.loss_mask, objective.kl_estimator)  # (len(local) * k,)
        rewards = rewards - distributed.gather_rows(objective.beta * kl_seq.view(len(local), k).cpu(), local, B)
    step_tokens = distributed.all_reduce_sum(float(batch.loss_mask.sum()))  # completion tokens of the whole step
    train, num_sequences, num_tokens = batch, B * k, step_tokens
    if passes.mask_truncated:  # truncated samples leave the loss and its normalisers (their rewards counted above)
        train = masked_rows(batch, got.truncated[local].flatten())  # no target token: no gradient row (gradient_rows)
        num_sequences = B * k - int(got.truncated.sum())
        num_tokens = distributed.all_reduce_sum(float(train.loss_mask.sum()))
        if B and not num_sequences and distributed.is_main():
            log.warning("step %d: all %d samples hit --max-new-tokens %d without an EOS and --mask-truncated left "
                        "every one out of the loss: this step trains nothing", step + 1, B * k, passes.max_new_tokens)
    return got, StepLogprobs(batch, train, sampled, ref, old, behaviour, objective.behaviour_ratio, rewards,
                             num_sequences, num_tokens, step_tokens, missing == 0)
