"""A curriculum prompt sampler (``--curriculum sec``): SEC's bandit over difficulty buckets.

Self-Evolving Curriculum (Chen et al. 2025, "Self-Evolving Curriculum for LLM Reasoning", arXiv 2505.14970):
the training prompts are split into buckets (arms); each step's prompts are drawn bucket by bucket from a
Boltzmann (softmax) distribution over the buckets' values, ``p(c) = exp(Q(c) / tau) / sum_c' exp(Q(c') / tau)``;
after the step each drawn bucket's value moves towards the step's learning signal from it, the mean absolute
advantage of its samples, by TD(0) / an exponential moving average (a non-stationary bandit):
``Q(c) <- alpha * r(c) + (1 - alpha) * Q(c)``. Values start at 0 (uniform over buckets). The defaults are the
paper's Countdown setting (tau 1.0, alpha 0.5; its math runs use tau 0.4).

Here:

- :class:`SECBandit`: the bandit alone, immutable and deterministic (``probabilities()``, ``draw(n, rng)``,
  ``update(bucket_ids, abs_adv_means) -> SECBandit``);
- :func:`count_target_buckets`: Countdown buckets, (number count, target band 10-39 / 40-69 / 70-100);
- :class:`CurriculumSampler`: the loop's prompt order (``sampler(virtual_step) -> prompt indices``): buckets
  drawn by the bandit with a generator seeded by (seed, virtual step), then within a bucket its prompts in a
  seeded order without replacement (a fresh seeded permutation of the bucket each time it is used up).

Its state (the values and how many prompts each bucket has given) is rebuilt on ``--resume`` from the run's
``metrics.jsonl`` (:meth:`CurriculumSampler.restore`): each step logs ``curriculum/q_<bucket>`` (the values
after its update, floats that JSON round-trips exactly) and ``curriculum/n_<bucket>`` (prompts drawn), so a
resumed run continues the same sequence without a checkpoint format change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from rlft.rl.records import RLPrompt, StepSamples


class Bandit(Protocol):
    """What :class:`CurriculumSampler` asks of its bandit (:class:`SECBandit`, or
    :class:`rlft.rl.pass_rate.PassRateBandit`): one value per bucket, draw probabilities, an update from the groups
    of a step, and a copy with given values (a resumed run's)."""

    q: tuple[float, ...]

    def probabilities(self) -> list[float]: ...

    def draw(self, n: int, generator: torch.Generator) -> list[int]: ...

    def update(self, bucket_ids: Sequence[int], signals: Sequence[float]) -> Bandit: ...

    def with_values(self, q: Sequence[float]) -> Bandit: ...


@dataclass(frozen=True)
class SECBandit:
    """SEC's non-stationary bandit over ``len(q)`` buckets (arms): Boltzmann draws, TD(0) value updates."""

    q: tuple[float, ...]
    """Each bucket's value: an exponential moving average of its mean absolute advantage."""
    tau: float = 1.0
    """Temperature of the softmax (> 0): small = greedy on the values, large = near uniform."""
    alpha: float = 0.5
    """Step size of the value update, in (0, 1]."""

    def __post_init__(self) -> None:
        if not self.q:
            raise ValueError("a bandit needs at least one bucket")
        if not self.tau > 0:
            raise ValueError(f"the softmax temperature tau must be > 0, got {self.tau}")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"the value step size alpha must lie in (0, 1], got {self.alpha}")

    @classmethod
    def fresh(cls, buckets: int, tau: float = 1.0, alpha: float = 0.5) -> SECBandit:
        """All values 0: every bucket equally likely."""
        return cls((0.0,) * buckets, tau, alpha)

    def probabilities(self) -> list[float]:
        """``softmax(q / tau)``, one probability per bucket (python floats, summing to 1 up to rounding)."""
        top = max(self.q)
        weights = [math.exp((v - top) / self.tau) for v in self.q]  # shifted by the max: no overflow
        total = sum(weights)
        return [w / total for w in weights]

    def draw(self, n: int, generator: torch.Generator) -> list[int]:
        """``n`` bucket ids drawn from :meth:`probabilities` with ``generator`` (:func:`draw_buckets`)."""
        return draw_buckets(self.probabilities(), n, generator)

    def update(self, bucket_ids: Sequence[int], abs_adv_means: Sequence[float]) -> SECBandit:
        """The bandit after one step: each bucket among ``bucket_ids`` gets ``r`` = the mean of the
        ``abs_adv_means`` listed with it (one per prompt group: the mean ``|A|`` of its k samples) and
        ``Q <- alpha * r + (1 - alpha) * Q`` (:func:`moving_values`); the other buckets keep their value.

        Raises:
            ValueError: the lists differ in length, or a bucket id is out of range.
        """
        return self.with_values(moving_values(self.q, self.alpha, bucket_ids, abs_adv_means, "advantage means"))

    def with_values(self, q: Sequence[float]) -> SECBandit:
        """The same bandit with the values ``q`` (a resumed run's logged ones)."""
        return SECBandit(tuple(q), self.tau, self.alpha)


def draw_buckets(probabilities: Sequence[float], n: int, generator: torch.Generator) -> list[int]:
    """``n`` bucket ids drawn independently from ``probabilities`` (with replacement) with ``generator`` (a seeded
    ``torch.Generator``: the same seed and probabilities give the same draws)."""
    if n <= 0:
        return []
    return torch.multinomial(torch.tensor(list(probabilities), dtype=torch.float64), n, replacement=True,
                             generator=generator).tolist()


def moving_values(q: Sequence[float], alpha: float, bucket_ids: Sequence[int], signals: Sequence[float],
                  what: str = "values") -> tuple[float, ...]:
    """Each bucket's value after one step, an exponential moving average: a bucket among ``bucket_ids`` gets ``r`` =
    the mean of the ``signals`` listed with it (one per prompt group) and ``q <- alpha * r + (1 - alpha) * q``; the
    other buckets keep theirs.

    Raises:
        ValueError: the lists differ in length (``what`` names the signals in the message), or a bucket id is out of
            range.
    """
    if len(bucket_ids) != len(signals):
        raise ValueError(f"{len(bucket_ids)} bucket ids for {len(signals)} {what}")
    sums: dict[int, list[float]] = {}
    for b, r in zip(bucket_ids, signals):
        if not 0 <= b < len(q):
            raise ValueError(f"bucket id {b} out of range 0..{len(q) - 1}")
        sums.setdefault(int(b), []).append(float(r))
    out = list(q)
    for b, rs in sums.items():
        out[b] = alpha * (sum(rs) / len(rs)) + (1.0 - alpha) * out[b]
    return tuple(out)


TARGET_BANDS = ((10, 39), (40, 69), (70, 100))
"""Countdown target bands of :func:`count_target_buckets` (a target below 10 counts in the first, above 100 in
the last)."""


def count_target_buckets(prompts: Sequence[RLPrompt]) -> tuple[list[int], list[str]]:
    """Countdown difficulty buckets: (number count, target band of :data:`TARGET_BANDS`).

    Returns:
        ``(bucket_of, names)``: the bucket id of each prompt and the bucket names, e.g. ``n3_t40-69``, sorted by
        count then band; only buckets holding prompts exist.
    Raises:
        ValueError: a prompt without a Countdown ground truth (``target`` and ``numbers``: chat prompts).
    """
    keys = []
    for i, p in enumerate(prompts):
        target, numbers = _countdown_truth(p, i, "count_target")
        band = next((j for j, (_, hi) in enumerate(TARGET_BANDS) if target <= hi), len(TARGET_BANDS) - 1)
        keys.append((len(numbers), band))
    names = {key: f"n{key[0]}_t{TARGET_BANDS[key[1]][0]}-{TARGET_BANDS[key[1]][1]}" for key in keys}
    return _ordered(keys, names)


RANK_BANDS = ((0, 0), (1, 2), (3, 6), (7, None))
"""Bands of the solution's rank in the patient search (:func:`rlft.tasks.countdown.traces.solution_rank`: the dead
ends before the solution) for :func:`count_rank_buckets`; a bounded trace with ``--max-tries 6`` never reaches 7."""


def count_rank_buckets(prompts: Sequence[RLPrompt]) -> tuple[list[int], list[str]]:
    """Countdown difficulty buckets by the solver's search: (number count, band of :data:`RANK_BANDS` of the
    solution's rank among the ranked first steps), e.g. ``n4_r3-6``; unsolvable tasks go to ``n<count>_unsolvable``.
    The rank is what a model imitating the patient search must get through before it reaches the answer.

    Returns and raises as :func:`count_target_buckets`.
    """
    from rlft.tasks.countdown.traces import solution_rank

    keys, names = [], {}
    for i, p in enumerate(prompts):
        target, numbers = _countdown_truth(p, i, "count_rank")
        rank = solution_rank(numbers, target)
        band = len(RANK_BANDS) if rank is None else next(
            j for j, (lo, hi) in enumerate(RANK_BANDS) if rank >= lo and (hi is None or rank <= hi))
        key = (len(numbers), band)
        if key not in names:
            lo, hi = RANK_BANDS[band] if band < len(RANK_BANDS) else (None, None)
            names[key] = f"n{key[0]}_" + ("unsolvable" if lo is None else f"r{lo}" if hi == lo else
                                          f"r{lo}+" if hi is None else f"r{lo}-{hi}")
        keys.append(key)
    return _ordered(keys, names)


def _countdown_truth(prompt: RLPrompt, i: int, bucketing: str) -> tuple[int, list[int]]:
    """``(target, numbers)`` of prompt ``i``; ValueError naming the bucketing when it has no Countdown ground truth."""
    truth = prompt.ground_truth or {}
    if "target" not in truth or "numbers" not in truth:
        raise ValueError(
            f"--curriculum-buckets {bucketing} needs Countdown prompts (a target and numbers); prompt {i} has "
            "none (chat prompts cannot be bucketed by difficulty)")
    return int(truth["target"]), [int(n) for n in truth["numbers"]]


def _ordered(keys: list[tuple[int, int]], names: dict[tuple[int, int], str]) -> tuple[list[int], list[str]]:
    """Bucket ids in sorted key order: ``(bucket_of, names)``."""
    order = sorted(set(keys))
    ids = {key: i for i, key in enumerate(order)}
    return [ids[key] for key in keys], [names[key] for key in order]


BUCKETINGS: dict[str, Callable[[Sequence[RLPrompt]], tuple[list[int],
                                                           list[str]]]] = {"count_target": count_target_buckets,
                                                                         "count_rank": count_rank_buckets}
"""Ways to bucket the training prompts (``--curriculum-buckets``): ``prompts -> (bucket_of, names)``."""


def _seed(*parts: int) -> int:
    """One 63-bit seed from integer parts (distinct parts give distinct seeds in practice)."""
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + int(part)) % (1 << 63)
    return seed


class CurriculumSampler:
    """The loop's prompt order under ``--curriculum sec``: ``sampler(virtual_step)`` gives the indices of one batch
    of ``batch_size`` training prompts (called once per batch, in step order; the draws of virtual step ``v`` use a
    generator seeded by ``(seed, v)``); :meth:`update` after the step's advantages.

    State: the bandit and, per bucket, how many prompts it has given (its position in its seeded permutations).
    """

    def __init__(self, bucket_of: Sequence[int], names: Sequence[str], batch_size: int, seed: int, tau: float = 1.0,
                 alpha: float = 0.5, *, bandit: Bandit | None = None):
        self.names = list(names)
        self.members: list[list[int]] = [[] for _ in self.names]
        for i, b in enumerate(bucket_of):
            self.members[b].append(i)
        if any(not m for m in self.members):
            raise ValueError("every bucket needs at least one prompt")
        self.bucket_of = list(bucket_of)
        self.batch_size = batch_size
        self.seed = seed
        self.bandit: Bandit = bandit if bandit is not None else SECBandit.fresh(len(self.names), tau, alpha)
        """SEC's (``tau``, ``alpha``), or the one given (:class:`rlft.rl.pass_rate.PassRateBandit`)."""
        self.given = [0] * len(self.names)
        """Prompts each bucket has given so far (all steps)."""
        self.step_given = [0] * len(self.names)
        """... in the current step (logged as ``curriculum/n_<bucket>``, reset by :meth:`update`)."""
        self._passes: dict[int, tuple[int, list[int]]] = {}  # bucket -> (pass, its permutation): a cache

    @classmethod
    def for_config(cls, cfg, prompts: Sequence[RLPrompt], params: int = 0) -> CurriculumSampler:
        """The sampler of ``cfg`` (an :class:`rlft.rl.config.RLConfig` with ``curriculum="sec"``) over ``prompts``
        (``params``, the policy's parameter count, is read by :class:`rlft.rl.pass_rate.PassRateSampler` only)."""
        bucket_of, names = BUCKETINGS[cfg.curriculum_buckets](prompts)
        return cls(bucket_of, names, cfg.prompts_per_step, cfg.seed, cfg.curriculum_tau, cfg.curriculum_alpha)

    def _permutation(self, bucket: int, epoch: int) -> list[int]:
        """The bucket's prompts in the seeded order of its pass ``epoch``."""
        cached = self._passes.get(bucket)
        if cached is None or cached[0] != epoch:
            size = len(self.members[bucket])
            order = torch.randperm(size, generator=torch.Generator().manual_seed(_seed(self.seed, 7, bucket,
                                                                                       epoch))).tolist()
            cached = self._passes[bucket] = (epoch, [self.members[bucket][j] for j in order])
        return cached[1]

    def _next(self, bucket: int) -> int:
        """The bucket's next prompt (without replacement; a new seeded permutation after each pass)."""
        epoch, pos = divmod(self.given[bucket], len(self.members[bucket]))
        self.given[bucket] += 1
        self.step_given[bucket] += 1
        return self._permutation(bucket, epoch)[pos]

    def __call__(self, virtual_step: int) -> list[int]:
        """The prompt indices of one batch: ``batch_size`` buckets drawn by the bandit, each giving its next prompt.
        A bucket drawn more often than it has prompts left in its pass continues into its next pass."""
        buckets = self.bandit.draw(self.batch_size, torch.Generator().manual_seed(_seed(self.seed, 11, virtual_step)))
        return [self._next(b) for b in buckets]

    def update(self, prompt_ids: Sequence[int], abs_adv_means: Sequence[float]) -> dict[str, float]:
        """After a step: update the bandit with each tried group's mean ``|A|`` (``prompt_ids``: the groups' prompt
        indices) and return the step's metrics: ``curriculum/p_<bucket>`` (the probabilities its draws used),
        ``curriculum/q_<bucket>`` (the values after the update) and ``curriculum/n_<bucket>`` (prompts drawn)."""
        record = {f"curriculum/p_{name}": p for name, p in zip(self.names, self.bandit.probabilities())}
        self.bandit = self.bandit.update([self.bucket_of[i] for i in prompt_ids], abs_adv_means)
        record.update({f"curriculum/q_{name}": q for name, q in zip(self.names, self.bandit.q)})
        record.update({f"curriculum/n_{name}": n for name, n in zip(self.names, self.step_given)})
        self.step_given = [0] * len(self.names)
        return record

    def learn(self, got: StepSamples, advantages: torch.Tensor) -> dict[str, float]:
        """:meth:`update` after the step ``got`` with its ``(B, k)`` advantages: the signal of each group its draws
        tried (:func:`group_abs_advantages` of the fresh groups; replayed ones, after them, were drawn before)."""
        return self.update(got.tried, group_abs_advantages(advantages[: got.fresh], got.kept, len(got.tried)))

    def restore(self, history: Sequence[dict]) -> None:
        """Continue a run from its logged steps (``metrics.jsonl`` records up to the resumed step): the values of
        the last step's ``curriculum/q_<bucket>``, and each bucket's prompts given, the sum of its
        ``curriculum/n_<bucket>``. Records without curriculum metrics (the step-0 evaluation) are skipped.

        Raises:
            ValueError: a record names other buckets than this sampler's (another bucketing or other prompts).
        """
        logged = [r for r in history if any(key.startswith("curriculum/q_") for key in r)]
        if not logged:
            return
        for record in logged:
            names = sorted(key.removeprefix("curriculum/q_") for key in record if key.startswith("curriculum/q_"))
            if names != sorted(self.names):
                raise ValueError(
                    f"--resume: the logged curriculum buckets {names} are not this run's {sorted(self.names)}")
        self.bandit = self.bandit.with_values([float(logged[-1][f"curriculum/q_{name}"]) for name in self.names])
        self.given = [int(sum(r[f"curriculum/n_{name}"] for r in logged)) for name in self.names]
        self.step_given = [0] * len(self.names)


def group_abs_advantages(advantages: torch.Tensor, kept: Sequence[int], groups: int) -> list[float]:
    """SEC's learning signal of each of a step's ``groups`` tried groups: the mean ``|A|`` of its k samples for the
    kept ones (``advantages``: ``(B, k)``, row ``i`` at position ``kept[i]``), 0 for the groups ``--filter-groups``
    dropped (all rewards equal: nothing to learn from them)."""
    out = torch.zeros(groups, dtype=torch.float64)
    if len(kept):
        out[list(kept)] = advantages.detach().abs().mean(dim=1).to(torch.float64).cpu()
    return out.tolist()
