"""The options of ``rlft demo``, both tracks: :class:`DemoConfig`, a sum of one option block per stage.

- :class:`DemoSFTOptions`: the SFT stage (Countdown solver traces) and the filtered SFT stage after it;
- :class:`DemoRLOptions`: the RL stage (``--rl-*``; checked at parse time as ``rlft rl`` would check it, in the demo's
  option names: :data:`RL_OPTIONS`);
- :class:`DemoPreferenceOptions`: on-policy pairs and DPO (``--pairs-*``, ``--dpo-*``);
- :class:`DemoEvalOptions`: the greedy and sampled evaluations;
- :class:`DemoUltraFeedbackOptions`: the UltraFeedback track (``--data``, ``--uf-*``);
- :class:`~rlft.lab.demo_env.DemoEnvOptions`: the Countdown track's environment (``--env countdown|countdown-calc``)
  and the bounds of its rollouts with tool calls.

``--quick`` applies the small sizes of :data:`QUICK` to every option left at its default; an option set to another
value (a flag or ``--config`` YAML) is kept, so ``--quick --rl-steps 0`` skips RL; ``--env countdown-calc`` applies
its prompt template and trace style (``calc``) the same way. The config holds the values that run (and ``--dry-run``
shows them), and every check runs on them.

The Countdown track (:mod:`rlft.lab.demo_countdown`) and the UltraFeedback track
(:mod:`rlft.lab.demo_ultrafeedback`) both read this config; ``rlft demo`` (:func:`rlft.lab.demo.run_demo`)
picks the track from ``--track``. Neither track imports the other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from rlft.lab.demo_env import DemoEnvOptions
from rlft.models import DEFAULT_MODEL
from rlft.options import MAX_NEW_TOKENS
from rlft.rl.options import AdvantageName, LossMode, PolicyLossName
from rlft.tasks.countdown.options import check_countdown_names
from rlft.validation import (AT_LEAST_2, NON_NEGATIVE, POSITIVE, POSITIVE_INT, PROBABILITY, OptionError, Range, require,
                             validate_options)

QUICK: dict[str, object] = dict(num_train=64, num_rows=2400, sft_steps=4, filtered_steps=2, batch_size=8,
                                micro_batch_size=8, eval_limit=8, base_eval_limit=8, max_new_tokens=32, rl_steps=2,
                                rl_k=4, rl_prompts_per_step=2, rl_max_prompt_batches=2, rl_eval_every=1,
                                rl_eval_limit=4, pairs_prompts=8, pairs_samples=2, dpo_batch_size=2, passk_limit=4,
                                uf_train_pairs=16, uf_eval_prompts=6, uf_max_length=96, uf_max_new_tokens=16,
                                uf_sft_steps=2, uf_pref_steps=2, uf_rm_steps=2, uf_rloo_steps=2)
"""``--quick``: the few-minute smoke sizes, each applied where the option is left at its default."""

RL_OPTIONS: dict[str, str] = {
    "prompt_template": "prompt_template",
    "advantage": "rl_advantage",
    "loss": "rl_loss",
    "loss_mode": "rl_loss_mode",
    "filter_groups": "rl_filter_groups",
    "max_prompt_batches": "rl_max_prompt_batches",
    "curriculum": "rl_curriculum",
    "mask_truncated": "rl_mask_truncated",
    "overlong_buffer": "rl_overlong_buffer",
    "repetition_limit": "rl_repetition_limit",
    "repetition_penalty": "rl_repetition_penalty",
    "lora_r": "rl_lora_r",
    "lora_alpha": "rl_lora_alpha",
    "k": "rl_k",
    "prompts_per_step": "rl_prompts_per_step",
    "max_steps": "rl_steps",
    "lr": "rl_lr",
    "beta": "rl_beta",
    "temperature": "rl_temperature",
    "max_new_tokens": "max_new_tokens",
    "micro_batch_size": "update_micro_batch_size",
    "gen_batch_size": "eval_batch_size",
    "eval_every": "rl_eval_every",
    "eval_limit": "rl_eval_limit",
    "seed": "seed",
    "device": "device",
    "dtype": "dtype",
}
"""``rlft rl`` option -> the demo option that sets it in the Countdown track's RL stage (its evaluation also generates
``max_new_tokens`` tokens, on the rows' validation part)."""


def _default(cfg, name: str):
    return type(cfg).__dataclass_fields__[name].default


@dataclass(frozen=True)
class DemoSFTOptions:
    """The SFT stage, solver traces of generated Countdown tasks, and the filtered SFT stage: the same traces, only
    those that reach the target."""

    preset: str = "standard"
    """Countdown preset of SFT's solver traces (standard: 3-4 numbers in 1-99, targets 10-100, the distribution of
    Countdown-Tasks-3to4); a generated task equal to a held-out row is dropped."""
    prompt_template: str = "short"
    """Prompt template for training and evaluation: short (compact, CPU-friendly), base (TinyZero), chat."""
    trace_style: str = "bounded"
    """SFT trace style: bounded (a ranked search that may give up and answer its closest attempt: ~45% of standard
    traces are correct, like the spec's cog_behav_all_strategies' ~43%), search or direct."""
    give_up: Annotated[float, PROBABILITY] = 0.6
    """Bounded traces: probability of giving up after each dead end."""
    max_tries: Annotated[int, POSITIVE_INT] = 6
    """Bounded traces: candidates tried at most before giving up."""
    max_dead_ends: Annotated[int, NON_NEGATIVE] = 2
    """Dead ends shown per search trace."""
    num_train: Annotated[int, POSITIVE_INT] = 8000
    """SFT's fixed dataset: one solver trace for each of num_train generated training tasks (the first sft_steps x
    batch_size of a seeded order are seen)."""
    sft_steps: Annotated[int, POSITIVE_INT] = 40
    """SFT optimizer steps on every trace, give-ups included (~7 min on a 2-core CPU; docs/results/countdown-real
    trains its start for 350)."""
    filtered_steps: Annotated[int, NON_NEGATIVE] = 35
    """Filtered SFT: optimizer steps of SFT continued from the SFT model on only the traces that reach the target
    (rejection sampling by the rule reward, `rlft sft --correct-only`: ~45% of the bounded traces), same batch and
    lr. RL and the pairs for DPO start from its model (0 skips it: they start from the SFT model)."""
    batch_size: Annotated[int, POSITIVE_INT] = 16
    """SFT examples per step."""
    micro_batch_size: Annotated[int, POSITIVE_INT] = 8
    """SFT examples per forward/backward pass."""
    lr: Annotated[float, POSITIVE] = 1e-4
    """SFT peak learning rate (constant after 3% warmup, the countdown-real recipe)."""


@dataclass(frozen=True)
class DemoRLOptions:
    """The RL stage (`rlft rl` on the filtered SFT model, or the SFT model with ``--filtered-steps 0``; ``--rl-steps
    0`` skips it)."""

    rl_steps: Annotated[int, NON_NEGATIVE] = 5
    """RL steps from the filtered SFT model (`rlft rl`; 0 skips RL)."""
    rl_k: Annotated[int, POSITIVE_INT] = 8
    """RL samples per prompt."""
    rl_prompts_per_step: Annotated[int, POSITIVE_INT] = 8
    """RL prompt groups trained on per step."""
    rl_advantage: AdvantageName = "grpo"
    """RL advantage estimator (see `rlft rl --advantage`)."""
    rl_loss: PolicyLossName = "ppo"
    """RL policy loss (see `rlft rl --loss`)."""
    rl_loss_mode: LossMode = "seq_mean"
    """RL loss aggregation (see `rlft rl --loss-mode`)."""
    rl_filter_groups: bool = True
    """Drop groups whose k rewards are all equal and refill the step from further prompts (see `rlft rl
    --filter-groups`)."""
    rl_max_prompt_batches: Annotated[int, POSITIVE_INT] = 3
    """With rl_filter_groups: at most this many batches of rl_prompts_per_step prompts are sampled per step."""
    rl_curriculum: Literal["none", "sec"] = "none"
    """RL prompt order: none (uniform, seeded) or sec (the self-evolving curriculum, `rlft rl --curriculum`)."""
    rl_mask_truncated: bool = False
    """Leave RL samples cut at max_new_tokens out of the loss (`rlft rl --mask-truncated`)."""
    rl_overlong_buffer: Annotated[int | None, NON_NEGATIVE] = None
    """DAPO's soft overlong penalty over the last N of max_new_tokens (`rlft rl --overlong-buffer`; None: off)."""
    rl_repetition_limit: Annotated[int | None, AT_LEAST_2] = None
    """Repetition-aware reward: an RL sample that writes one identical line N or more times scores as no answer
    (`rlft rl --repetition-limit`; None: off)."""
    rl_repetition_penalty: float | None = None
    """With rl_repetition_limit: added to a repeating sample's reward instead (<= 0; `rlft rl --repetition-penalty`)."""
    rl_lora_r: Annotated[int, NON_NEGATIVE] = 16
    """RL LoRA rank (0: full fine-tuning)."""
    rl_lora_alpha: Annotated[float, POSITIVE] = 32.0
    """RL LoRA alpha."""
    rl_lr: Annotated[float, POSITIVE] = 2e-4
    """RL learning rate (constant; 2e-4 is the best LoRA rate of docs/results/countdown-bounded, full fine-tuning
    wants ~1e-6 to 5e-6)."""
    rl_beta: Annotated[float, NON_NEGATIVE] = 0.0
    """RL KL coefficient (0: no reference model and no KL)."""
    rl_temperature: Annotated[float, NON_NEGATIVE] = 1.0
    """RL sampling temperature (log-probs are taken at the same temperature)."""
    rl_eval_every: Annotated[int, NON_NEGATIVE] = 5
    """Greedy evaluation on the first rl_eval_limit held-out validation rows every N RL steps and at the end: the
    points of the samples-vs-score plot, which starts from the RL start's score on them (0: none)."""
    rl_eval_limit: Annotated[int, POSITIVE_INT] = 100
    """Validation rows of the in-loop RL evaluation."""

    def rl_options(self) -> dict[str, object]:
        """The ``rlft rl`` options this config sets for the RL stage (:data:`RL_OPTIONS`)."""
        return {rl: getattr(self, demo) for rl, demo in RL_OPTIONS.items()}

    def _check_rl_stage(self) -> None:
        """What ``rlft rl`` would refuse once the RL stage starts (after SFT and two evaluations), refused now in the
        demo's option names: ``--rl-k 1``, ``--rl-temperature 0``, an ``--rl-overlong-buffer`` above
        ``--max-new-tokens``, ...

        Raises:
            OptionError: the RL stage's options, ``--rl-*`` (and the shared ``--max-new-tokens`` etc.) named.
        """
        if not self.rl_steps or self.track != "countdown":
            return
        from rlft.rl.config import RLConfig

        try:
            RLConfig(**self.rl_options(), **self.env_options(), data="rows", eval_rows="validation",
                     eval_max_new_tokens=self.max_new_tokens)
        except ValueError as e:
            names = {"--" + rl.replace("_", "-"): "--" + demo.replace("_", "-") for rl, demo in RL_OPTIONS.items()}
            raise OptionError(re.sub(r"--[a-z0-9-]+", lambda m: names.get(m.group(0), m.group(0)), str(e))) from None


@dataclass(frozen=True)
class DemoPreferenceOptions:
    """On-policy pairs from the filtered SFT model (the SFT model with ``--filtered-steps 0``), and DPO on them
    (``--pairs-prompts 0`` skips both)."""

    pairs_prompts: Annotated[int, NON_NEGATIVE] = 128
    """Training rows sampled for on-policy DPO pairs (0 skips pairs and DPO)."""
    pairs_samples: Annotated[int, POSITIVE_INT] = 2
    """Samples per prompt from DPO's start; the pair is best vs worst score, ties dropped."""
    pairs_temperature: Annotated[float, NON_NEGATIVE] = 1.0
    """Sampling temperature of the on-policy pairs."""
    dpo_epochs: Annotated[float, POSITIVE] = 2.0
    """DPO epochs over the kept pairs."""
    dpo_batch_size: Annotated[int, POSITIVE_INT] = 32
    """DPO pairs per step."""
    dpo_lr: Annotated[float, POSITIVE] = 1e-4
    """DPO peak learning rate (cosine, 10% warmup)."""
    dpo_optimizer: Literal["adamw", "sgd"] = "adamw"
    """DPO optimizer (see `rlft dpo --optimizer`)."""
    dpo_beta: Annotated[float, NON_NEGATIVE] = 0.5
    """DPO beta (0.5: the RPO recipe that cleared the DPO bar in docs/results/countdown-bounded; at 0.1 DPO pushed the
    give-up answers down until the searches stopped stopping)."""
    dpo_loss_type: Literal["dpo", "ipo", "rpo"] = "rpo"
    """Preference loss: dpo, ipo, or rpo (DPO + dpo_rpo_alpha * NLL of the chosen response: on self-generated pairs
    the NLL term is what keeps the chosen searches likely; docs/results/countdown-bounded)."""
    dpo_rpo_alpha: Annotated[float, NON_NEGATIVE] = 1.0
    """Weight of the chosen-response NLL when dpo_loss_type is rpo."""
    dpo_lora_r: Annotated[int, NON_NEGATIVE] = 16
    """DPO LoRA rank (0: full fine-tuning)."""
    dpo_lora_alpha: Annotated[float, POSITIVE] = 32.0
    """DPO LoRA alpha."""

    @property
    def dpo_micro_batch_size(self) -> int:
        """Pairs per forward/backward pass of the DPO update: ``update_micro_batch_size``, at most
        ``dpo_batch_size``."""
        return min(self.update_micro_batch_size, self.dpo_batch_size)

    def _check_preference_stage(self) -> None:
        """What ``rlft pairs countdown`` and ``rlft dpo`` would refuse once their stages start."""
        if not self.pairs_prompts or self.track != "countdown":
            return
        require(self.pairs_temperature > 0, f"--pairs-temperature must be > 0 to sample different responses, got "
                f"{self.pairs_temperature} (greedy samples of one prompt are identical and always tie)")
        require(self.pairs_samples >= 2, f"--pairs-samples must be >= 2 to form a pair, got {self.pairs_samples}")
        # DPOConfig checks this too, but only once the DPO stage starts: here it fails before SFT and RL run
        require(self.dpo_batch_size % self.dpo_micro_batch_size == 0,
                f"--dpo-batch-size ({self.dpo_batch_size}) must be a multiple of --update-micro-batch-size "
                f"({self.update_micro_batch_size}) when it is the larger")


@dataclass(frozen=True)
class DemoEvalOptions:
    """The evaluations: greedy on held-out test rows, sampled (pass@k, best-of-N) on a prefix of them."""

    passk: Annotated[int, NON_NEGATIVE] = 0
    """Samples per task of the sampled evaluation of every trained model (mean score, pass@k, and the best-of-N
    selectors majority@k and self-certainty@k; 0, the default, skips it: ~2 min a model on a 2-core CPU at 4)."""
    passk_temperature: Annotated[float, NON_NEGATIVE] = 0.6
    """Sampling temperature of the sampled evaluation."""
    passk_top_p: Annotated[float, Range(gt=0, le=1)] = 0.95
    """Nucleus mass of the sampled evaluation."""
    passk_limit: Annotated[int, NON_NEGATIVE] = 50
    """Held-out test rows in the sampled evaluation (the first N of the greedy ones)."""
    eval_limit: Annotated[int, POSITIVE_INT] = 500
    """Held-out test rows evaluated greedily (the first N of the 500; half 3-number, half 4-number)."""
    base_eval_limit: Annotated[int, POSITIVE_INT] = 100
    """Held-out test rows the base model is evaluated on (greedy, a prefix of eval_limit's): it is paired with
    nothing and rarely writes an answer in the format, so a prefix shows its score at a fraction of the cost."""
    max_new_tokens: Annotated[int, POSITIVE_INT] = MAX_NEW_TOKENS
    """Most generated tokens per completion: rollouts, pairs and evaluation (the SFT start cuts few answers there;
    the reference evaluates with >= 1024 on GPU)."""
    eval_batch_size: Annotated[int, POSITIVE_INT] = 256
    """Sequences generated together during evaluation, pair sampling and RL sampling (on a 2-core CPU a 256-row
    greedy evaluation took 103 s at 256 against 157 s at 64: a decoding step costs about the same however many rows
    run)."""

    def _check_evaluations(self) -> None:
        require(
            self.eval_limit <= 500 and self.rl_eval_limit <= 500,
            f"--eval-limit ({self.eval_limit}) and --rl-eval-limit ({self.rl_eval_limit}) must be <= 500, the held-out "
            "test and validation rows (rlft.tasks.countdown.splits), so evaluation tasks are never trained on")
        require(
            self.base_eval_limit <= self.eval_limit,
            f"--base-eval-limit ({self.base_eval_limit}) must be <= --eval-limit ({self.eval_limit}): a prefix of the "
            "same rows")
        require(
            self.passk_limit <= self.eval_limit,
            f"--passk-limit ({self.passk_limit}) must be <= --eval-limit ({self.eval_limit}): the sampled evaluation "
            "uses a prefix of the greedy one's tasks")
        require(not self.passk or self.passk_temperature > 0,
                f"--passk-temperature must be > 0: the sampled evaluation draws --passk {self.passk} different samples "
                "(0: identical greedy copies); --passk 0 skips it")


@dataclass(frozen=True)
class DemoUltraFeedbackOptions:
    """The UltraFeedback track (``--track ultrafeedback``): preference data, and the sizes of its stages."""

    data: str | None = None
    """UltraFeedback track: preference pairs, a .jsonl/.json/.parquet file or Hub id (flattened
    prompt/chosen/rejected strings, H4 message lists, HH-RLHF). None: ../shared/data/ultrafeedback/train_clean.jsonl
    when present, else HuggingFaceH4/ultrafeedback_binarized from the Hub. Only the first 2000 rows are read."""
    uf_data_split: str = "train_prefs"
    """UltraFeedback track: split of --data when it is a Hub id (H4: train_prefs; trl-lib: train)."""
    uf_sft_data: str | None = None
    """UltraFeedback track: SmolTalk (messages rows: a file or Hub id such as HuggingFaceTB/smol-smoltalk) for the
    SFT stage. None, or a source that cannot be read (offline): Pref-FT on the chosen replies of the training pairs."""
    uf_train_pairs: Annotated[int, POSITIVE_INT] = 400
    """UltraFeedback track: training pairs (ties included; DPO and the reward model drop them, ~11%), sampled (seeded
    by split_seed) from pairs whose prompts are not held out. The reward model trains on all of them (uf_rm_steps);
    SFT and DPO on the first uf_sft_steps x 8 and uf_pref_steps x 8."""
    uf_eval_prompts: Annotated[int, NON_NEGATIVE] = 96
    """UltraFeedback track: held-out prompts (disjoint from training) for the win-rates; the reward model's
    held-out accuracy is measured on their non-tie pairs."""
    uf_max_length: Annotated[int, POSITIVE_INT] = 192
    """UltraFeedback track: longest prompt + reply in tokens for SFT, DPO and the reward model (UF replies
    are longer: most are truncated, and counted). Only pairs whose rendered prompt is at most
    uf_max_length - uf_max_new_tokens tokens are used (the others are set aside, counted)."""
    uf_max_new_tokens: Annotated[int, POSITIVE_INT] = 64
    """UltraFeedback track: most generated tokens per reply (RLOO samples, win-rate responses)."""
    uf_sft_steps: Annotated[int, POSITIVE_INT] = 30
    """UltraFeedback track: SFT optimizer steps of 8 conversations."""
    uf_pref_steps: Annotated[int, POSITIVE_INT] = 24
    """UltraFeedback track: DPO optimizer steps, each of 8 pairs (one epoch of the first uf_pref_steps x 8 pairs)."""
    uf_rm_steps: Annotated[int, POSITIVE_INT] = 45
    """UltraFeedback track: reward-model optimizer steps of 8 pairs (~one epoch of the non-tie training pairs)."""
    uf_rm_train_layers: Annotated[int | None, POSITIVE_INT] = 6
    """UltraFeedback track: the reward model trains only its top N blocks, final norm and head (None: all); with 6 of
    SmolLM2-135M's 30 blocks a step costs ~2.6x less, so it sees about twice the pairs of DPO in less time."""
    uf_rm_head_lr: Annotated[float, POSITIVE] = 1e-3
    """UltraFeedback track: learning rate of the reward model's new score head (the body uses 5e-5)."""
    uf_rm_head_init: Literal["normal", "zero"] = "normal"
    """UltraFeedback track: init of the new score head: normal N(0, 1/(d+1)) or zero (rewards start at 0)."""
    uf_rloo_steps: Annotated[int, POSITIVE_INT] = 10
    """UltraFeedback track: RLOO steps of 4 prompts x uf_rloo_k samples, rewarded by the trained reward model."""
    uf_rloo_k: Annotated[int, POSITIVE_INT] = 4
    """UltraFeedback track: RLOO samples per prompt."""
    uf_rloo_beta: Annotated[float, NON_NEGATIVE] = 0.001
    """UltraFeedback track: RLOO KL coefficient (a learned reward can be gamed, so the KL to SFT stays on)."""
    uf_truncation_penalty: float | None = -1.0
    """UltraFeedback track: added to the reward-model score of RLOO samples that hit uf_max_new_tokens without
    ending their turn (about one Bradley-Terry logit: a reply that finishes beats a cut one unless the reward
    model rates the cut one a logit higher); None: off."""

    def _check_ultrafeedback(self) -> None:
        """What the UltraFeedback track's stages would refuse later (its RLOO stage, its prompt budget)."""
        if self.track != "ultrafeedback":
            return
        require(self.uf_max_length - self.uf_max_new_tokens >= 8,
                f"--uf-max-length ({self.uf_max_length}) must exceed --uf-max-new-tokens ({self.uf_max_new_tokens}) "
                "by at least 8 tokens: the difference is the longest prompt used")
        require(self.uf_eval_prompts >= 1,
                f"--uf-eval-prompts must be >= 1 (the win-rates' prompts), got {self.uf_eval_prompts}")
        require(self.uf_rloo_k >= 2,
                f"--uf-rloo-k must be >= 2 (RLOO's baseline is the mean of the other samples), got {self.uf_rloo_k}")


@dataclass(frozen=True)
class DemoConfig(DemoUltraFeedbackOptions, DemoEvalOptions, DemoPreferenceOptions, DemoRLOptions, DemoSFTOptions,
                 DemoEnvOptions):
    """Base model -> SFT on Countdown solver traces -> filtered SFT on the correct ones -> RL and DPO from it ->
    evaluation -> Markdown report with plots."""

    output_dir: str = "runs/demo"
    """Run folder: every stage's folder, the evaluations and report.md go here (the ultrafeedback track uses
    runs/demo-ultrafeedback while this is left at its default)."""
    model: str = DEFAULT_MODEL
    """Base model: built-in name, local HF folder or Hub id."""
    quick: bool = False
    """A few-minute smoke version: tiny data, a handful of steps, short evaluations."""
    rows: str | None = "auto"
    """Countdown-Tasks-3to4 rows (a .parquet/.jsonl file, a Hub id such as Jiayi-Pan/Countdown-Tasks-3to4, or
    countdown-3to4): RL and pair prompts are its training rows, every evaluation its held-out test rows
    (rlft.tasks.countdown.splits: 500 test + 500 validation rows that no stage trains on). 'auto': countdown-3to4, the
    first 10,240 rows that ship with rlft (rlft.tasks.countdown.shipped; the rows of ../shared/data/countdown/
    train.parquet). None: a generated stand-in (--num-rows tasks of the `standard` preset: the same distribution),
    written to <output-dir>/data/rows.jsonl. The report says which."""
    num_rows: Annotated[int, POSITIVE_INT] = 10240
    """Rows of the generated stand-in (--rows None)."""
    update_micro_batch_size: Annotated[int, POSITIVE_INT] = 8
    """Sequences per forward/backward pass of the RL and DPO updates (gradient accumulation is exact, so this trades
    memory for speed only; 8 keeps 256-token runs within 24 GB)."""
    split_seed: int = 1234
    """Seed of SFT's generated tasks and of the held-out rows (rlft.tasks.countdown.splits)."""
    seed: int = 0
    """Training seed."""
    resume: bool = False
    """Reuse finished evaluations, models and pairs, and resume an unfinished stage from its last checkpoint."""
    overwrite: bool = False
    """Start over in an output folder that holds an earlier demo: it is moved aside to <output-dir>.replaced-<time>
    (logged). Without it (or --resume) such a folder is refused."""
    keep_checkpoints: bool = False
    """Keep each stage's resumable checkpoints (weights + optimizer state, ~1.5 GB each for the 135M model) after
    its final model is saved; by default they are deleted then, as a finished stage resumes from its model."""
    device: str = "auto"
    """'auto', 'cpu', 'cuda', ..."""
    dtype: str = "auto"
    """'auto' (bfloat16 on CUDA; bf16 mixed precision on a CPU with native bf16, float32 elsewhere), 'float32',
    'bfloat16'."""
    track: Literal["countdown", "ultrafeedback"] = "countdown"
    """countdown: the Countdown story above. ultrafeedback: preference data -> SFT (or Pref-FT), DPO, reward model,
    RLOO with that reward model, win-rates judged by it (rlft.lab.demo_ultrafeedback; output folder
    runs/demo-ultrafeedback unless --output-dir is given). It reads --data and the --uf-* options, plus model,
    output_dir, quick, dpo_beta,
    eval_batch_size, split_seed, seed, resume, device, dtype; the other options are Countdown's.
    Its small --uf-* defaults fit 36 of 45 minutes (measured) on a 2-core CPU with the 135M model in float32 (the token
    budget
    of each stage is in that module's docstring); --quick shrinks them to a smoke test."""

    def __post_init__(self) -> None:
        validate_options(self)
        check_countdown_names(self)  # --preset, --prompt-template, --trace-style
        self._check_demo_env()
        self._apply_quick()
        self._check_env_options()
        self._check_evaluations()
        self._check_rl_stage()
        self._check_preference_stage()
        self._check_ultrafeedback()

    def _apply_quick(self) -> None:
        """With ``--quick``: :data:`QUICK`'s value for every option still at its default (an option given another
        value is kept); likewise ``--env``'s (:meth:`~rlft.lab.demo_env.DemoEnvOptions.env_defaults`: countdown-calc's
        prompt template and trace style). Runs while the config is built: it is never changed afterwards."""
        for name, value in {**(QUICK if self.quick else {}), **self.env_defaults()}.items():
            if getattr(self, name) == _default(self, name):
                object.__setattr__(self, name, value)

    def effective(self) -> "DemoConfig":
        """The config that runs: itself (``--quick``'s sizes and ``--env``'s prompt and traces are applied when it is
        built)."""
        return self
