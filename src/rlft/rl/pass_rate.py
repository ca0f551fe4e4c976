"""Prompts the model half-solves (``--curriculum pass-rate``): buckets drawn by their chance of a group with signal.

A group of k samples carries a GRPO / RLOO signal only when its rewards differ. With binary success at pass rate
``p``, the chance of that is

    s(p, k) = 1 - p^k - (1 - p)^k                                          (signal_probability)

which is 0 at p = 0 and p = 1 and largest at p = 1/2: prompts the model always fails or always solves are wasted
samples (Reinforce-Rej, Xiong et al. 2025; DAPO's dynamic sampling, Yu et al. 2025; "RL at the edge of competence",
arXiv 2512.07783). This sampler keeps, per difficulty bucket (``--curriculum-buckets``, e.g. ``count_rank``: number
count by the solver's search rank), an estimate ``p_b`` of the model's pass rate, from the step's own groups (no
extra sampling): each tried group's share of samples that succeed (raw reward >= 1.0, the rule's full score; a group
resampled by ``--hint solver`` counts its own samples, which all failed: 0), averaged per bucket; a bucket's first
measurement replaces the prior 0.5, later ones move in by an exponential average,
``p_b <- alpha * mean + (1 - alpha) * p_b`` (``--curriculum-alpha``: the estimate follows the model's recent pass rate;
a bias-corrected average, so no step reads the prior of a bucket already measured).
Buckets are then drawn with probability

    P(b) = n_b * max(s(p_b, k), FLOOR) / sum_c n_c * max(s(p_c, k), FLOOR)

(``n_b`` the bucket's prompts): before any estimate, and whenever all buckets are alike, this is the uniform
order's distribution over prompts; a bucket the model never (or always) solves keeps ``FLOOR`` of its weight, so
it is tried again now and then and its estimate can move. Within a bucket prompts come as under SEC
(:class:`rlft.rl.curriculum.CurriculumSampler`: a seeded order without replacement); the state resumes from
``metrics.jsonl`` the same way (``curriculum/q_<bucket>`` holds ``p_b``).

Where this differs from SEC (Chen et al. 2025, ``--curriculum sec``): SEC's value is the mean ``|advantage|`` and
its draw a softmax over buckets (buckets equally likely at the start, whatever their size); here the value is the
pass rate, which the signal probability turns into a weight on each prompt. With ``--filter-groups`` the two work
together: the filter drops the groups that came out all alike, the sampler makes fewer of them.

The saving (each step, :meth:`PassRateSampler.learn`): with ``u`` the share of groups without signal that the
uniform order would give at the estimates the step drew with (``sum_b n_b / N * (1 - s(p_b, k))``) and ``S`` the
step's tried groups with signal (pass rate strictly between 0 and 1) of ``G``, the uniform order would have needed
``S / (1 - u)`` groups for as many: ``curriculum/groups_saved = S / (1 - u) - G`` (negative when the draw was
unlucky), and ``curriculum/flops_saved`` = that times a group's sampling FLOPs, ``2 N`` per generated token (``N``
the policy's parameters; the prompts' prefill left out). Also logged: ``curriculum/no_signal_uniform`` (``u``),
``curriculum/no_signal_drawn`` (the same expectation under the step's draw) and ``curriculum/signal_groups`` (S).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from rlft import distributed
from rlft.rl.curriculum import BUCKETINGS, CurriculumSampler, draw_buckets, moving_values
from rlft.rl.records import RLPrompt, StepSamples

FLOOR = 0.05
"""The least weight of a bucket (as a share of its prompts): one whose estimate is 0 or 1 is still drawn now and
then, so its estimate follows the model."""
PRIOR = 0.5
"""A bucket's pass-rate estimate before its first group (the most signal: the uniform order until measured)."""
SOLVED = 1.0
"""A sample succeeds when its raw reward is at least this (the rule rewards' full score)."""


def signal_probability(p: float, k: int) -> float:
    """``1 - p^k - (1 - p)^k``: the chance that ``k`` samples at success rate ``p`` are neither all successes nor all
    failures. ``signal_probability(0.5, 2) == 0.5``; 0 at ``p`` 0 or 1.

    Raises:
        ValueError: ``p`` outside [0, 1] or ``k`` < 1.
    """
    if not 0.0 <= p <= 1.0 or k < 1:
        raise ValueError(f"need 0 <= p <= 1 and k >= 1, got p={p}, k={k}")
    return 1.0 - p**k - (1.0 - p) ** k


def group_pass_rates(all_raw: torch.Tensor, hinted: Sequence[int] = ()) -> list[float]:
    """Each tried group's share of samples with raw reward >= :data:`SOLVED`: ``(G, k) -> G`` floats; the groups at
    positions ``hinted`` (resampled with a solver prefix after all k of their own samples failed) count 0."""
    rates = (all_raw >= SOLVED).to(torch.float64).mean(dim=1)
    if len(hinted):
        rates[list(hinted)] = 0.0
    return rates.tolist()


@dataclass(frozen=True)
class PassRateBandit:
    """Per-bucket pass-rate estimates, drawn by signal probability (see the module docstring)."""

    q: tuple[float, ...]
    """Each bucket's pass-rate estimate ``p_b`` in [0, 1]."""
    sizes: tuple[int, ...]
    """Each bucket's prompts ``n_b`` (> 0)."""
    k: int
    """Samples per group."""
    alpha: float = 0.5
    """Step size of the estimates' exponential average, in (0, 1]."""
    seen: tuple[bool, ...] = ()
    """Each bucket measured at least once (its estimate no longer the prior); empty: none yet."""

    def __post_init__(self) -> None:
        if self.seen and len(self.seen) != len(self.q):
            raise ValueError(f"{len(self.seen)} measured flags for {len(self.q)} buckets")
        if not self.q or len(self.q) != len(self.sizes):
            raise ValueError(f"{len(self.q)} estimates for {len(self.sizes)} buckets (need at least one)")
        if any(n <= 0 for n in self.sizes) or self.k < 1:
            raise ValueError(f"bucket sizes must be > 0 and k >= 1, got sizes {self.sizes}, k={self.k}")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"the value step size alpha must lie in (0, 1], got {self.alpha}")
        if not all(0.0 <= p <= 1.0 for p in self.q):
            raise ValueError(f"pass-rate estimates must lie in [0, 1], got {self.q}")

    @classmethod
    def fresh(cls, sizes: Sequence[int], k: int, alpha: float = 0.5) -> PassRateBandit:
        """Every estimate at :data:`PRIOR`."""
        return cls((PRIOR,) * len(sizes), tuple(sizes), k, alpha)

    def probabilities(self) -> list[float]:
        """``P(b)``, proportional to ``n_b * max(s(p_b, k), FLOOR)`` (python floats summing to 1 up to rounding)."""
        weights = [n * max(signal_probability(p, self.k), FLOOR) for n, p in zip(self.sizes, self.q)]
        total = sum(weights)
        return [w / total for w in weights]

    def draw(self, n: int, generator: torch.Generator) -> list[int]:
        """``n`` bucket ids drawn from :meth:`probabilities` (:func:`rlft.rl.curriculum.draw_buckets`)."""
        return draw_buckets(self.probabilities(), n, generator)

    def update(self, bucket_ids: Sequence[int], pass_rates: Sequence[float]) -> PassRateBandit:
        """The estimates after one step: a bucket measured for the first time takes the mean pass rate of its groups,
        one measured before moves towards it (:func:`rlft.rl.curriculum.moving_values`); the others keep theirs.

        Raises:
            ValueError: the lists differ in length, or a bucket id is out of range.
        """
        means = moving_values(self.q, 1.0, bucket_ids, pass_rates, "pass rates")  # a measured bucket's mean
        seen, touched = self.seen or (False,) * len(self.q), set(int(b) for b in bucket_ids)
        q = tuple(self.alpha * m + (1.0 - self.alpha) * p if b in touched and seen[b] else m
                  for b, (m, p) in enumerate(zip(means, self.q)))
        return PassRateBandit(q, self.sizes, self.k, self.alpha, tuple(s or b in touched for b, s in enumerate(seen)))

    def with_values(self, q: Sequence[float], seen: Sequence[bool] | None = None) -> PassRateBandit:
        """The same bandit with the estimates ``q`` (and the measured flags ``seen``; None: as they are)."""
        return PassRateBandit(tuple(q), self.sizes, self.k, self.alpha, self.seen if seen is None else tuple(seen))

    def no_signal_share(self, probabilities: Sequence[float]) -> float:
        """The expected share of groups without signal when buckets are drawn with ``probabilities``:
        ``sum_b P(b) * (1 - s(p_b, k))``."""
        return sum(w * (1.0 - signal_probability(p, self.k)) for w, p in zip(probabilities, self.q))

    def uniform(self) -> list[float]:
        """The uniform order's bucket probabilities, ``n_b / N``."""
        total = sum(self.sizes)
        return [n / total for n in self.sizes]


class PassRateSampler(CurriculumSampler):
    """:class:`~rlft.rl.curriculum.CurriculumSampler` drawing buckets with a :class:`PassRateBandit` and learning from
    the step's pass rates, with the saving's metrics (see the module docstring)."""

    def __init__(self, bucket_of: Sequence[int], names: Sequence[str], batch_size: int, seed: int, k: int,
                 alpha: float = 0.5, params: int = 0):
        super().__init__(bucket_of, names, batch_size, seed)
        self.bandit = PassRateBandit.fresh([len(m) for m in self.members], k, alpha)
        self.params = params
        """The policy's parameter count ``N`` (0: ``curriculum/flops_saved`` is not logged)."""

    @classmethod
    def for_config(cls, cfg, prompts: Sequence[RLPrompt], params: int = 0) -> PassRateSampler:
        """The sampler of ``cfg`` (``--curriculum pass-rate``) over ``prompts``; ``params``: the policy's parameters."""
        bucket_of, names = BUCKETINGS[cfg.curriculum_buckets](prompts)
        return cls(bucket_of, names, cfg.prompts_per_step, cfg.seed, cfg.k, cfg.curriculum_alpha, params)

    def restore(self, history: Sequence[dict]) -> None:
        """:meth:`CurriculumSampler.restore`, and each bucket counted as measured when it has given prompts."""
        super().restore(history)
        if any(self.given):
            self.bandit = self.bandit.with_values(self.bandit.q, [n > 0 for n in self.given])

    def learn(self, got: StepSamples, advantages: torch.Tensor) -> dict[str, float]:
        """After the step ``got``: the estimates follow the pass rates of every group it tried (kept or dropped by
        ``--filter-groups``); :meth:`update`'s metrics and the saving's (``advantages`` are not read)."""
        bandit: PassRateBandit = self.bandit  # type: ignore[assignment]
        uniform = bandit.no_signal_share(bandit.uniform())
        drawn = bandit.no_signal_share(bandit.probabilities())
        rates = group_pass_rates(got.all_raw, got.hinted)
        signal = sum(0.0 < r < 1.0 for r in rates)
        tried = len(rates)
        saved = signal / max(1.0 - uniform, 1e-12) - tried
        record = self.update(got.tried, rates)
        record.update({"curriculum/no_signal_uniform": uniform, "curriculum/no_signal_drawn": drawn,
                       "curriculum/signal_groups": float(signal), "curriculum/groups_saved": saved})
        if self.params and tried:
            tokens_per_group = got.generated_tokens * distributed.world() / tried  # each rank sampled its share
            record["curriculum/flops_saved"] = saved * 2.0 * self.params * tokens_per_group
        return record
