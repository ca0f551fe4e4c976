"""Policy-gradient losses of the RL loop: REINFORCE, PPO-clip with clip-higher, RAFT/RAFT++, TOPR, KL, entropy.

Pure functions of tensors; none of them sees a model. :class:`PolicyObjective` bundles the chosen loss, its
clip range, the KL placement, the entropy bonus and RAFT's selection; :func:`make_objective` builds it once
from a config, before the loop. Shape legend: B prompts (or sequences), k samples per prompt, T tokens.

References:
- Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
  Human Feedback in LLMs" (RLOO): the leave-one-out baseline and the sequence-level estimator
  ``1/k sum_i [R(y_i) - 1/(k-1) sum_{j!=i} R(y_j)] grad log pi(y_i | x)``.
- Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7 (clipped surrogate).
- Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html): the k1/k3
  estimators.
- Yu et al. 2025, "DAPO" (arXiv 2503.14476), eq. 10: asymmetric clipping ``clip(ratio, 1 - eps_low,
  1 + eps_high)`` ("clip-higher", eps_high 0.28) and token-level aggregation.
- Xiong et al. 2025 (arXiv 2504.11343): RAFT (likelihood of the selected samples) and RAFT++
  (the same with the importance ratio and clipping).
- Le Roux, Bellemare et al. 2025, "Tapered Off-Policy REINFORCE" (arXiv 2503.14286): TOPR, in
  :mod:`rlft.losses.topr` (no ratio on positive samples, the sequence ratio truncated to [0, 1] on negative ones).
- Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning" (arXiv 2506.01347):
  W-REINFORCE, ``lambda * L_PSR + L_NSR``, in :mod:`rlft.losses.wreinforce` (``PolicyObjective.positive_weight``).

Advantage estimators live in :mod:`rlft.losses.advantages`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch

from rlft.losses.importance import IS_MODES, importance_weights
from rlft.losses.topr import topr_loss
from rlft.losses.wreinforce import positive_weighting
from rlft.ops import AggregationMode, aggregate, masked_mean, masked_sum

KLEstimator = Literal["k1", "k3"]
KL_ESTIMATORS = ("k1", "k3")
"""The per-token KL estimators of :func:`kl_penalty` (``--kl-estimator``)."""
KL_PLACEMENTS = ("reward", "loss")
"""Where the KL goes (``--kl-mode``): subtracted from the reward before the advantages, or added to the loss."""
LOSS_MODES = ("seq_sum", "seq_mean", "token_mean")
"""The aggregations of :func:`rlft.ops.aggregate` the RL loop offers (``--loss-mode``)."""


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman 2020).

    With ``log_r = ref_logprobs - logprobs`` (log pi_ref/pi of the sampled token):

    - ``k1 = -log_r = logprobs - ref_logprobs``: unbiased, high variance, can be negative per token.
      Its sum over a sequence is the log-ratio of the whole sequence, the quantity the RLOO paper
      subtracts from the reward.
    - ``k3 = exp(log_r) - log_r - 1``: unbiased, lower variance, always >= 0 (0 iff equal). Used as a
      per-token loss by GRPO/verl ("low_var_kl").

    No clamping is applied: a huge ``log_r`` gives a huge (possibly inf) k3.

    Args:
        logprobs, ref_logprobs: ``(B, T)`` log-probs of the sampled tokens under the policy and the
            reference, at the same temperature.
    Returns:
        ``(B, T)`` per-token values (not masked: reduce with :func:`rlft.ops.aggregate`).
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        log_r = ref_logprobs - logprobs
        return torch.exp(log_r) - log_r - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; expected 'k1' or 'k3'")


def sequence_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, loss_mask: torch.Tensor,
                estimator: KLEstimator = "k1") -> torch.Tensor:
    """``(B,)`` per-sequence KL estimate ``sum_t kl_t`` over the completion tokens (:func:`kl_penalty`); with k1 the
    log-ratio of the whole sequence, what the RLOO paper subtracts (times beta) from the reward.

    Args:
        logprobs, ref_logprobs, loss_mask: ``(B, T)``.
    """
    return masked_sum(kl_penalty(logprobs, ref_logprobs, estimator), loss_mask, dim=-1)


def policy_gradient_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_eps: float | None = None,
    clip_low: float | None = None,
    clip_high: float | None = None,
    mode: AggregationMode = "seq_sum",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE / PPO-clip policy loss on sampled tokens.

    Per token, ``ratio = exp(logprobs - old_logprobs)`` and, with the sequence's advantage ``A``:

    - unclipped (no clip range given): ``l_t = -A * ratio_t``. Its gradient is ``-A * ratio_t * grad logp_t``;
      at ratio 1 (``old_logprobs = logprobs.detach()``) that is REINFORCE, ``-A * grad logp_t``.
    - clipped (PPO, Schulman et al. 2017, eq. 7; asymmetric "clip-higher", DAPO eq. 10):
      ``l_t = -min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)``
      = ``max(-A * ratio_t, -A * clip(...))``. Where the clipped branch is taken the gradient is 0
      (the ratio has already moved past the range in the direction the advantage favours).
      ``clip_eps`` sets both ends; ``clip_low``/``clip_high`` set one end each (and override it).

    Reduction (:func:`rlft.ops.aggregate`): ``seq_sum`` (default) is the RLOO paper's sequence-level
    estimator, ``mean over sequences of sum_t l_t`` (log pi(y|x) = sum_t logp_t); ``seq_mean`` is
    GRPO's (token mean within each sequence, then mean over sequences); ``token_mean`` averages over
    all target tokens (DAPO's token-level loss: long completions weigh more in total, less per token).

    Args:
        logprobs: ``(B, T)`` log-probs of the sampled tokens under the current policy (with grad).
        old_logprobs: ``(B, T)`` log-probs under the policy that sampled them (no grad).
        advantages: ``(B,)`` one advantage per sequence, broadcast over its tokens.
        loss_mask: ``(B, T)`` 1 on completion tokens (EOS included), 0 elsewhere.
        clip_eps, clip_low, clip_high: PPO clipping range (all None: no clipping).
        mode: any :data:`rlft.ops.AggregationMode`.
        num_sequences, num_tokens: sequence / target-token count of the whole optimisation batch
            when this call sees one micro-batch of it (keeps gradient accumulation exact).
        token_weights: ``(B, T)`` constant per-token factors of ``l_t`` (no grad; the sampler-mismatch
            importance weights of :func:`importance_weights`); None: 1.
    Returns:
        ``(loss, metrics)``; metrics: ``loss/policy`` (this call's loss), ``pg/clipfrac`` (fraction of
        this call's target tokens where the clipped branch is active, i.e. has zero gradient),
        ``pg/ratio_mean`` (token mean of the ratio over this call's target tokens).
    Raises:
        ValueError: ``advantages`` not of shape ``(B,)``; a negative clip range.
    """
    if advantages.dim() != 1 or advantages.shape[0] != logprobs.shape[0]:
        raise ValueError(f"advantages must have shape (B,) = ({logprobs.shape[0]},), got {tuple(advantages.shape)}")
    low = clip_low if clip_low is not None else clip_eps
    high = clip_high if clip_high is not None else clip_eps
    if (low is not None and low < 0) or (high is not None and high < 0):
        raise ValueError(f"clip ranges must be >= 0, got low={low}, high={high}")
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.to(ratio.dtype).unsqueeze(-1)  # (B, 1)
    per_token = -adv * ratio
    if low is not None or high is not None:
        lo = 1.0 - low if low is not None else 0.0
        hi = 1.0 + high if high is not None else float("inf")
        clipped = -adv * torch.clamp(ratio, lo, hi)
        clip_active = (clipped > per_token).float()
        per_token = torch.maximum(per_token, clipped)
        clipfrac = masked_mean(clip_active, loss_mask).item()
    else:
        clipfrac = 0.0
    if token_weights is not None:
        per_token = per_token * token_weights.detach()
    loss = aggregate(per_token, loss_mask, mode, num_tokens=num_tokens, num_sequences=num_sequences)
    metrics = {
        "loss/policy": loss.item(),
        "pg/clipfrac": clipfrac,
        "pg/ratio_mean": masked_mean(ratio.detach(), loss_mask).item(),
    }
    return loss, metrics


def raft_selection(advantages: torch.Tensor) -> torch.Tensor:
    """RAFT's selection as loss weights: 1.0 where the advantage is > 0, else 0.0, whatever its size.

    The one place the selection is made: :meth:`PolicyObjective.weights` applies it once per step (so the
    rows with weight 0 are skipped before any forward), and :func:`raft_loss` composes it with the loss.
    ``(N,) -> (N,)`` (any shape), same dtype.
    """
    return (advantages > 0).to(advantages.dtype)


def raft_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float | None = None,
    clip_high: float | None = None,
    mode: AggregationMode = "token_mean",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """RAFT / RAFT++ (Xiong et al. 2025, arXiv 2504.11343, Sec. 2): likelihood of the selected samples.

    A sample is selected when its advantage is > 0 (:func:`raft_selection`; with
    :func:`rlft.losses.advantages.raft_advantages`: the best-rewarded samples); selected samples get weight 1,
    the others 0, whatever the advantage's size. Then:

    - without a clip range (RAFT): ``l_t = -w * ratio_t``, whose gradient at ratio 1 is ``-w * grad logp_t``:
      the SFT (negative log-likelihood) gradient on the selected samples;
    - with ``clip_low``/``clip_high`` (RAFT++): the PPO-clipped surrogate with ``A = w``, i.e. the
      importance ratio and clipping of PPO on the same selection.

    The default reduction is ``token_mean`` (RAFT is SFT on the kept samples). Shapes, normalisers and
    metrics as :func:`policy_gradient_loss`. The RL loop does not call it: its objective selects once
    (:meth:`PolicyObjective.weights`) and then applies :func:`policy_gradient_loss` to the 0/1 weights.
    """
    return policy_gradient_loss(logprobs, old_logprobs, raft_selection(advantages), loss_mask, clip_low=clip_low,
                                clip_high=clip_high, mode=mode, num_sequences=num_sequences, num_tokens=num_tokens,
                                token_weights=token_weights)


def entropy_bonus(
    entropy: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    mode: AggregationMode = "token_mean",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The entropy term of the loss, to be *subtracted* times a coefficient: ``aggregate(H_t)``.

    Args:
        entropy: ``(B, T)`` per-token entropy ``H_t = -sum_v p_v log p_v`` of the policy's next-token
            distribution at the sampling temperature (with grad; e.g. from
            :func:`rlft.ops.sequence_logprobs` with ``return_entropy=True``).
        loss_mask: ``(B, T)``; normalisers as :func:`policy_gradient_loss`.
    Returns:
        ``(value, {"loss/entropy": float})``. The loop adds ``-entropy_coef * value`` to the loss, so a
        positive coefficient rewards a spread-out sampler (a common guard against entropy collapse).
    """
    value = aggregate(entropy, loss_mask, mode, num_tokens=num_tokens, num_sequences=num_sequences)
    return value, {"loss/entropy": value.item()}


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    estimator: KLEstimator = "k3",
    mode: AggregationMode = "seq_sum",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL to the reference as a loss term (OpenRLHF/verl placement), before multiplying by beta.

    ``aggregate(kl_penalty(logprobs, ref_logprobs, estimator), loss_mask, mode)``; with ``seq_sum`` this
    is the mean over sequences of the summed per-token estimate, on the same scale as the
    sequence-level KL the RLOO paper puts in the reward. Gradients flow through ``logprobs`` only.
    Note: as a *loss*, k1's expected gradient is zero (E_pi[grad log pi] = 0); k3's is not, which is
    why k3 is the usual choice here.

    Returns:
        ``(loss, {"loss/kl": float})``.
    """
    loss = aggregate(kl_penalty(logprobs, ref_logprobs, estimator), loss_mask, mode, num_tokens=num_tokens,
                     num_sequences=num_sequences)
    return loss, {"loss/kl": loss.item()}


PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
"""``(logprobs, old_logprobs, advantages, loss_mask, *, clip_low, clip_high, mode, num_sequences, num_tokens,
token_weights) -> (loss, metrics)``, as :func:`policy_gradient_loss`."""



@dataclass(frozen=True)
class PolicyLoss:
    """An entry of :data:`POLICY_LOSSES`: the loss function and what the loop does around it."""

    fn: PolicyLossFn
    clips: bool
    """It takes the clip range ``[1 - clip_low, 1 + clip_high]``; False: the loop passes none."""
    selects: bool = False
    """RAFT: the loss weights are :func:`raft_selection` of the advantages (1 for A > 0, else 0)."""
    behaviour: bool = False
    """The ratio's denominator is the behaviour policy's log-probs (the sampler's) from the first epoch on, not the
    pre-update policy's (TOPR: made for stale samples)."""


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "reinforce": PolicyLoss(policy_gradient_loss, clips=False),
    "ppo": PolicyLoss(policy_gradient_loss, clips=True),
    "raft": PolicyLoss(policy_gradient_loss, clips=False, selects=True),
    "raft++": PolicyLoss(policy_gradient_loss, clips=True, selects=True),
    "topr": PolicyLoss(topr_loss, clips=False, behaviour=True),
}
"""Policy losses by name (``--loss``; a new loss is one entry): ``reinforce`` (``-A * ratio``: REINFORCE at
ratio 1), ``ppo`` (the ratio clipped to ``[1 - clip_low, 1 + clip_high]``), ``raft`` (the likelihood of the
samples with A > 0, each with weight 1: :func:`raft_loss`), ``raft++`` (raft with ppo's clipping), ``topr``
(:func:`rlft.losses.topr.topr_loss`: REINFORCE on A >= 0, the sequence ratio to the sampler truncated to [0, 1]
on A < 0; for stale, replayed samples)."""

CLIPPED_LOSSES = frozenset(name for name, loss in POLICY_LOSSES.items() if loss.clips)
"""The losses that use a clip range."""


@dataclass(frozen=True)
class PolicyObjective:
    """What an RL update minimises, fixed once before the loop (:func:`make_objective`).

    ``loss = loss_fn(...) - entropy_coef * entropy_bonus(...) + kl_coef * kl_loss(...)``, every term
    aggregated with ``loss_mode`` over the whole step's normalisers (:meth:`loss`). The defaults are plain
    REINFORCE with the sequence-level estimator (``seq_sum``), no clipping, no KL, no entropy bonus.
    """

    loss_fn: PolicyLossFn = policy_gradient_loss
    """A policy loss with :data:`PolicyLossFn`'s signature."""
    loss_mode: AggregationMode = "seq_sum"
    """Aggregation of every per-token term (:func:`rlft.ops.aggregate`)."""
    clip_low: float | None = None
    """The ratio is clipped at ``1 - clip_low``; None with ``clip_high`` None: no clipping."""
    clip_high: float | None = None
    """The ratio is clipped at ``1 + clip_high`` (DAPO's clip-higher: larger than ``clip_low``)."""
    select: bool = False
    """RAFT: train on the samples with A > 0, each with weight 1 (:func:`raft_selection`)."""
    positive_weight: float = 1.0
    """W-REINFORCE's lambda: the weight of every sample with weight > 0 is multiplied by it (1: off)."""
    kl_placement: Literal["reward", "loss"] | None = None
    """'reward': ``beta * sum_t kl_t`` is subtracted from each reward before the advantages (the RLOO paper);
    'loss': ``beta * aggregate(kl_t)`` is added to the loss (OpenRLHF/verl); None: no KL (beta 0)."""
    beta: float = 0.0
    """KL coefficient (> 0 when ``kl_placement`` is set)."""
    kl_estimator: KLEstimator = "k1"
    """Per-token estimator of :func:`kl_penalty`."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (0: off, and no entropy is computed)."""
    is_mode: str = "none"
    """Sampler-mismatch correction (:data:`IS_MODES`; :func:`importance_weights`): 'none', or a mode that weights
    each token's policy loss by the trainer/sampler ratio, truncated or masked at ``is_cap``."""
    is_cap: float = 3.0
    """The cap ``C`` of the importance-sampling correction."""
    behaviour_ratio: bool = False
    """The loop passes the behaviour policy's log-probs (those of the sampler that generated each sample, however many
    steps ago) as ``old_logprobs`` from the first epoch on: the loss asks for them (:attr:`PolicyLoss.behaviour`,
    TOPR) or samples are replayed from earlier steps (``--replay-size``). False: ``old_logprobs`` are the pre-update
    policy's (ratio 1 at the first epoch)."""

    def __post_init__(self) -> None:
        if self.kl_placement not in (None, *KL_PLACEMENTS):
            raise ValueError(f"unknown KL placement {self.kl_placement!r}; expected None, 'reward' or 'loss'")
        if (self.kl_placement is not None) != (self.beta > 0):
            raise ValueError("a KL placement needs beta > 0 and beta > 0 a placement, "
                             f"got {self.kl_placement!r} with beta={self.beta}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {self.kl_estimator!r}; expected 'k1' or 'k3'")
        if self.entropy_coef < 0:
            raise ValueError(f"entropy_coef must be >= 0, got {self.entropy_coef}")
        if self.is_mode not in IS_MODES:
            raise ValueError(
                f"unknown importance-sampling mode {self.is_mode!r}; expected one of {', '.join(IS_MODES)}")
        positive_weighting(torch.zeros(0), self.positive_weight)  # ValueError for a negative weight

    @property
    def kl_in_reward(self) -> bool:
        """The KL is subtracted from the rewards (before the advantages)."""
        return self.kl_placement == "reward"

    @property
    def kl_coef(self) -> float:
        """Weight of the KL term in the loss: ``beta`` with ``kl_placement='loss'``, else 0."""
        return self.beta if self.kl_placement == "loss" else 0.0

    @property
    def every_row_has_gradient(self) -> bool:
        """A KL or entropy term is in the loss: every sample carries gradient, whatever its advantage
        (otherwise a sample of weight 0 contributes exactly 0, see :func:`rlft.rl.batch.gradient_rows`)."""
        return self.kl_coef > 0 or self.entropy_coef > 0

    def weights(self, advantages: torch.Tensor) -> torch.Tensor:
        """The per-sample loss weights: the advantages, or RAFT's 0/1 selection of them, those > 0 times
        ``positive_weight`` (W-REINFORCE, :func:`rlft.losses.wreinforce.positive_weighting`). Same shape."""
        return positive_weighting(raft_selection(advantages) if self.select else advantages, self.positive_weight)

    def loss(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        weights: torch.Tensor,
        loss_mask: torch.Tensor,
        *,
        entropy: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        sampler_logprobs: torch.Tensor | None = None,
        num_sequences: float | None = None,
        num_tokens: float | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective on one micro-batch of ``N`` rows.

        Args:
            logprobs: ``(N, T)`` current log-probs (with grad); old_logprobs: ``(N, T)`` the sampling policy's.
            weights: ``(N,)`` from :meth:`weights`.
            loss_mask: ``(N, T)``.
            entropy: ``(N, T)`` per-token entropy (with grad); needed when ``entropy_coef > 0``.
            ref_logprobs: ``(N, T)`` reference log-probs; needed when ``kl_coef > 0``.
            sampler_logprobs: ``(N, T)`` the sampler's log-probs of the tokens; needed when ``is_mode`` is not
                'none' (the weights compare them with ``old_logprobs``, the trainer's pre-update ones).
            num_sequences, num_tokens: the whole step's normalisers (see :func:`policy_gradient_loss`).
        Returns:
            ``(loss, metrics)``: the policy loss's metrics plus ``loss/entropy`` and ``loss/kl`` (0.0 when off), and
            with a correction ``pg/is_weight_mean`` (token mean) and ``pg/is_zero_frac`` (tokens weighted 0).
        Raises:
            ValueError: a term that is on without its input.
        """
        token_weights = None
        if self.is_mode != "none":
            if sampler_logprobs is None:
                raise ValueError(f"the {self.is_mode} correction needs the sampler's log-probs")
            token_weights = importance_weights(old_logprobs, sampler_logprobs, loss_mask, self.is_mode, self.is_cap)
        loss, metrics = self.loss_fn(logprobs, old_logprobs, weights, loss_mask, clip_low=self.clip_low,
                                     clip_high=self.clip_high, mode=self.loss_mode, num_sequences=num_sequences,
                                     num_tokens=num_tokens, token_weights=token_weights)
        metrics = {**metrics, "loss/entropy": 0.0, "loss/kl": 0.0}
        if token_weights is not None:
            metrics.update({"pg/is_weight_mean": masked_mean(token_weights, loss_mask).item(),
                            "pg/is_zero_frac": masked_mean((token_weights == 0).float(), loss_mask).item()})
        if self.entropy_coef > 0:
            if entropy is None:
                raise ValueError("entropy_coef > 0 needs the per-token entropy")
            bonus, entropy_metrics = entropy_bonus(entropy, loss_mask, mode=self.loss_mode, num_sequences=num_sequences,
                                                   num_tokens=num_tokens)
            loss = loss - self.entropy_coef * bonus
            metrics.update(entropy_metrics)
        if self.kl_coef > 0:
            if ref_logprobs is None:
                raise ValueError("kl_coef > 0 needs ref_logprobs")
            kl, kl_metrics = kl_loss(logprobs, ref_logprobs, loss_mask, estimator=self.kl_estimator,
                                     mode=self.loss_mode, num_sequences=num_sequences, num_tokens=num_tokens)
            loss = loss + self.kl_coef * kl
            metrics.update(kl_metrics)
        return loss, metrics


def make_objective(policy, kl, importance, *, replay: bool = False) -> PolicyObjective:
    """The run's objective from its option blocks (read, never changed; never the whole config): ``policy``
    (:class:`rlft.rl.options.PolicyLossOptions`): the loss ``policy.loss`` of :data:`POLICY_LOSSES` aggregated by
    ``loss_mode``, its clip range when it clips (``clip_high`` None: ``clip_low``), ``entropy_coef``,
    ``positive_weight`` (W-REINFORCE); ``kl`` (:class:`~rlft.rl.options.KLOptions`): the KL at ``kl_mode`` when
    ``beta > 0``, else none; ``importance`` (:class:`~rlft.rl.options.ImportanceOptions`): the sampler-mismatch
    correction; the behaviour ratio when the loss asks for it or ``replay`` (``--replay-size > 0``).

    Raises:
        ValueError: an unknown ``policy.loss``.
    """
    if policy.loss not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {policy.loss!r}; expected one of {', '.join(POLICY_LOSSES)}")
    spec = POLICY_LOSSES[policy.loss]
    low, high = policy.clip_low, policy.clip_high if policy.clip_high is not None else policy.clip_low
    clip_low, clip_high = (low, high) if spec.clips else (None, None)
    use_kl = kl.beta > 0
    return PolicyObjective(
        loss_fn=spec.fn, loss_mode=policy.loss_mode, clip_low=clip_low, clip_high=clip_high, select=spec.selects,
        kl_placement=kl.kl_mode if use_kl else None, beta=kl.beta if use_kl else 0.0, kl_estimator=kl.kl_estimator,
        entropy_coef=policy.entropy_coef, is_mode=importance.is_correction, is_cap=importance.is_cap,
        positive_weight=policy.positive_weight, behaviour_ratio=spec.behaviour or replay)
