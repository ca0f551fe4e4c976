"""The options of ``rlft demo``, both tracks: :class:`DemoConfig`.

The Countdown track (:mod:`rlft.recipes.demo_countdown`) and the UltraFeedback track
(:mod:`rlft.recipes.demo_ultrafeedback`) both read this config; ``rlft demo`` (:func:`rlft.recipes.demo.run_demo`)
picks the track from ``--track``. Neither track imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from rlft.models import DEFAULT_MODEL
from rlft.rl.config import AdvantageName, LossMode, PolicyLossName
from rlft.validation import require, validate_options


@dataclass(frozen=True)
class DemoConfig:
    """Base model -> SFT on Countdown solver traces -> RL and DPO from SFT -> evaluation -> Markdown report with plots."""

    output_dir: str = "runs/demo"
    """Run folder: every stage's folder, the evaluations and report.md go here (the ultrafeedback track uses
    runs/demo-ultrafeedback while this is left at its default)."""
    model: str = DEFAULT_MODEL
    """Base model: built-in name, local HF folder or Hub id."""
    quick: bool = False
    """A few-minute smoke version: tiny data, a handful of steps, short evaluations."""
    preset: str = "medium3"
    """Countdown preset for training and the held-out evaluation (medium3: 3 numbers in 1-25, targets 10-75, 18,644
    distinct solvable tasks, distinct held-out tasks; see docs/results/countdown-medium3)."""
    heldout_size: int = 1000
    """Generated held-out tasks (distinct for medium3) that no stage trains on: SFT, RL and the pair prompts draw
    their tasks from the training split of make_splits(preset, ..., heldout_size, split_seed); every evaluation
    uses a prefix of them."""
    prompt_template: str = "short"
    """Prompt template for training and evaluation: short (compact, CPU-friendly), base (TinyZero), chat."""
    trace_style: str = "direct"
    """SFT trace style: direct (solution steps), search (dead ends, backtracking, check) or bounded (a ranked
    search that may give up and answer its closest attempt; ~48% of the traces are correct, like the spec's
    cog_behav_all_strategies; generations need ~144 tokens: see docs/results/countdown-bounded)."""
    give_up: float = 0.6
    """Bounded traces: probability of giving up after each dead end."""
    max_tries: int = 6
    """Bounded traces: candidates tried at most before giving up."""
    max_dead_ends: int = 2
    """Dead ends shown per search trace."""
    num_train: int = 3000
    """SFT's fixed dataset: one solver trace for each of the first num_train training tasks."""
    sft_steps: int = 125
    """SFT optimizer steps (the documented medium3 curve of 300 cosine steps rises to ~200 steps: 0.375 at 150, 0.415
    at 200 and 300 on 200 tasks; 125 steps of a 125-step schedule keep the demo within its time budget, so the
    demo's SFT start is not the converged one of docs/results/countdown-medium3)."""
    batch_size: int = 16
    """SFT examples per step."""
    micro_batch_size: int = 16
    """SFT examples per forward/backward pass."""
    lr: float = 2e-4
    """SFT peak learning rate (cosine decay, 5% warmup)."""
    rl_steps: int = 12
    """RL steps on the SFT model (`rlft rl`; 0 skips RL)."""
    rl_num_train: int = 20000
    """Training tasks the RL prompts are drawn from (the training split; its first num_train are SFT's)."""
    rl_k: int = 8
    """RL samples per prompt."""
    rl_prompts_per_step: int = 8
    """RL prompt groups trained on per step."""
    rl_advantage: AdvantageName = "grpo"
    """RL advantage estimator (see `rlft rl --advantage`)."""
    rl_loss: PolicyLossName = "ppo"
    """RL policy loss (see `rlft rl --loss`)."""
    rl_loss_mode: LossMode = "seq_mean"
    """RL loss aggregation (see `rlft rl --loss-mode`)."""
    rl_filter_groups: bool = True
    """Drop groups whose k rewards are all equal and refill the step from further prompts (see `rlft rl --filter-groups`)."""
    rl_max_prompt_batches: int = 3
    """With rl_filter_groups: at most this many batches of rl_prompts_per_step prompts are sampled per step."""
    rl_lora_r: int = 16
    """RL LoRA rank (0: full fine-tuning)."""
    rl_lora_alpha: float = 32.0
    """RL LoRA alpha."""
    rl_lr: float = 2e-4
    """RL learning rate (constant; 2e-4 is the best LoRA rate of docs/results/countdown-bounded, full fine-tuning
    wants ~1e-6 to 5e-6)."""
    rl_beta: float = 0.0
    """RL KL coefficient (0: no reference model and no KL)."""
    rl_temperature: float = 1.0
    """RL sampling temperature (log-probs are taken at the same temperature)."""
    update_micro_batch_size: int = 32
    """Sequences per forward/backward pass of the RL and DPO updates (gradient accumulation is exact, so this trades
    memory for speed only; 8 keeps 144-token runs such as --trace-style bounded within 24 GB)."""
    rl_eval_every: int = 5
    """Greedy evaluation on the first rl_eval_limit held-out tasks every N RL steps and at the end: the points of the
    samples-vs-score plot, which starts from the SFT model's score on the same tasks (no step-0 evaluation; 0: none)."""
    rl_eval_limit: int = 100
    """Held-out tasks of the in-loop RL evaluation."""
    pairs_prompts: int = 480
    """Training prompts (after SFT's num_train) sampled for on-policy DPO pairs (0 skips pairs and DPO)."""
    pairs_samples: int = 2
    """Samples per prompt from the SFT model; the pair is best vs worst score, ties dropped."""
    pairs_temperature: float = 1.0
    """Sampling temperature of the on-policy pairs."""
    dpo_epochs: float = 2.0
    """DPO epochs over the kept pairs."""
    dpo_batch_size: int = 32
    """DPO pairs per step."""
    dpo_lr: float = 1e-4
    """DPO peak learning rate (cosine, 10% warmup)."""
    dpo_optimizer: Literal["adamw", "sgd"] = "adamw"
    """DPO optimizer (see `rlft dpo --optimizer`)."""
    dpo_beta: float = 0.1
    """DPO beta."""
    dpo_loss_type: Literal["dpo", "ipo", "rpo"] = "dpo"
    """Preference loss: dpo, ipo, or rpo (DPO + dpo_rpo_alpha * NLL of the chosen response). dpo: without the NLL
    term DPO scored level with or above RPO on the same pairs (docs/results/countdown-medium3, session 8); in
    docs/results/countdown-bounded the two are level (+0.003 [-0.005, +0.012]), each ~+0.02 above its SFT start."""
    dpo_rpo_alpha: float = 1.0
    """Weight of the chosen-response NLL when dpo_loss_type is rpo."""
    dpo_lora_r: int = 16
    """DPO LoRA rank (0: full fine-tuning)."""
    dpo_lora_alpha: float = 32.0
    """DPO LoRA alpha."""
    passk: int = 4
    """Samples per task of the sampled evaluation on the held-out set (mean score, pass@1, pass@k; 0 skips it)."""
    passk_temperature: float = 0.6
    """Sampling temperature of the sampled evaluation."""
    passk_top_p: float = 0.95
    """Nucleus mass of the sampled evaluation."""
    passk_limit: int = 100
    """Held-out tasks in the sampled evaluation (the first N)."""
    eval_limit: int = 200
    """Held-out tasks of the training preset evaluated greedily (the first N; at most heldout_size)."""
    standard_limit: int = 50
    """Generated standard-distribution tasks to evaluate (0 to skip)."""
    real_data: str | None = "auto"
    """Countdown-Tasks-3to4 file for the real-data evaluation; 'auto' looks for ../shared/data/countdown/train.parquet; None skips."""
    real_limit: int = 50
    """Real tasks to evaluate per number count: the last N 3-number rows and the last N 4-number rows of the file,
    reported as two sets."""
    max_new_tokens: int = 64
    """Most generated tokens per completion (traces are 30-70 tokens; the reference uses >= 1024 on GPU)."""
    eval_batch_size: int = 50
    """Sequences generated together during evaluation."""
    split_seed: int = 1234
    """Seed of the generated train/held-out split."""
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
    """'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16'."""
    track: Literal["countdown", "ultrafeedback"] = "countdown"
    """countdown: the Countdown story above. ultrafeedback: preference data -> SFT (or Pref-FT), DPO, reward model,
    RLOO with that reward model, win-rates judged by it (rlft.recipes.demo_ultrafeedback; output folder
    runs/demo-ultrafeedback unless --output-dir is given). It reads --data and the --uf-* options, plus model, output_dir, quick, dpo_beta,
    eval_batch_size, split_seed, seed, resume, device, dtype; the other options are Countdown's.
    Its small --uf-* defaults fit 36 of 45 minutes (measured) on a 2-core CPU with the 135M model in float32 (the token budget
    of each stage is in that module's docstring); --quick shrinks them to a smoke test."""
    data: str | None = None
    """UltraFeedback track: preference pairs, a .jsonl/.json/.parquet file or Hub id (flattened
    prompt/chosen/rejected strings, H4 message lists, HH-RLHF). None: ../shared/data/ultrafeedback/train_clean.jsonl
    when present, else HuggingFaceH4/ultrafeedback_binarized from the Hub. Only the first 2000 rows are read."""
    uf_data_split: str = "train_prefs"
    """UltraFeedback track: split of --data when it is a Hub id (H4: train_prefs; trl-lib: train)."""
    uf_sft_data: str | None = None
    """UltraFeedback track: SmolTalk (messages rows: a file or Hub id such as HuggingFaceTB/smol-smoltalk) for the
    SFT stage. None, or a source that cannot be read (offline): Pref-FT on the chosen replies of the training pairs."""
    uf_train_pairs: int = 400
    """UltraFeedback track: training pairs (ties included; DPO and the reward model drop them, ~11%), sampled (seeded
    by split_seed) from pairs whose prompts are not held out. The reward model trains on all of them (uf_rm_steps);
    SFT and DPO on the first uf_sft_steps x 8 and uf_pref_steps x 8."""
    uf_eval_prompts: int = 96
    """UltraFeedback track: held-out prompts (disjoint from training) for the win-rates; the reward model's
    held-out accuracy is measured on their non-tie pairs."""
    uf_max_length: int = 192
    """UltraFeedback track: longest prompt + reply in tokens for SFT, DPO and the reward model (UF replies
    are longer: most are truncated, and counted). Only pairs whose rendered prompt is at most
    uf_max_length - uf_max_new_tokens tokens are used (the others are set aside, counted)."""
    uf_max_new_tokens: int = 64
    """UltraFeedback track: most generated tokens per reply (RLOO samples, win-rate responses)."""
    uf_sft_steps: int = 30
    """UltraFeedback track: SFT optimizer steps of 8 conversations."""
    uf_pref_steps: int = 24
    """UltraFeedback track: DPO optimizer steps, each of 8 pairs (one epoch of the first uf_pref_steps x 8 pairs)."""
    uf_rm_steps: int = 45
    """UltraFeedback track: reward-model optimizer steps of 8 pairs (~one epoch of the non-tie training pairs)."""
    uf_rm_train_layers: int | None = 6
    """UltraFeedback track: the reward model trains only its top N blocks, final norm and head (None: all); with 6 of
    SmolLM2-135M's 30 blocks a step costs ~2.6x less, so it sees about twice the pairs of DPO in less time."""
    uf_rm_head_lr: float = 1e-3
    """UltraFeedback track: learning rate of the reward model's new score head (the body uses 5e-5)."""
    uf_rm_head_init: Literal["normal", "zero"] = "normal"
    """UltraFeedback track: init of the new score head: normal N(0, 1/(d+1)) or zero (rewards start at 0)."""
    uf_rloo_steps: int = 10
    """UltraFeedback track: RLOO steps of 4 prompts x uf_rloo_k samples, rewarded by the trained reward model."""
    uf_rloo_k: int = 4
    """UltraFeedback track: RLOO samples per prompt."""
    uf_rloo_beta: float = 0.001
    """UltraFeedback track: RLOO KL coefficient (a learned reward can be gamed, so the KL to SFT stays on)."""
    uf_truncation_penalty: float | None = -1.0
    """UltraFeedback track: added to the reward-model score of RLOO samples that hit uf_max_new_tokens without
    ending their turn (about one Bradley-Terry logit: a reply that finishes beats a cut one unless the reward
    model rates the cut one a logit higher); None: off."""

    def __post_init__(self) -> None:
        validate_options(self)
        require(self.eval_limit <= self.heldout_size and self.rl_eval_limit <= self.heldout_size,
                f"--eval-limit ({self.eval_limit}) and --rl-eval-limit ({self.rl_eval_limit}) must be <= --heldout-size "
                f"({self.heldout_size}) so evaluation tasks are never trained on")
        # DPOConfig checks this too, but only once the DPO stage starts: here it fails before SFT and RL run
        require(self.dpo_batch_size % self.dpo_micro_batch_size == 0,
                f"--dpo-batch-size ({self.dpo_batch_size}) must be a multiple of --update-micro-batch-size "
                f"({self.update_micro_batch_size}) when it is the larger")
        require(self.passk_limit <= self.eval_limit,
                f"--passk-limit ({self.passk_limit}) must be <= --eval-limit ({self.eval_limit}): the sampled evaluation uses a prefix of the greedy one's tasks")

    @property
    def dpo_micro_batch_size(self) -> int:
        """Pairs per forward/backward pass of the DPO update: ``update_micro_batch_size``, at most ``dpo_batch_size``."""
        return min(self.update_micro_batch_size, self.dpo_batch_size)

    def effective(self) -> "DemoConfig":
        """This config, with the small sizes of ``--quick`` applied when it is set."""
        if not self.quick:
            return self
        return replace(self, num_train=64, sft_steps=4, batch_size=8, micro_batch_size=8, eval_limit=8,
                       standard_limit=4, real_limit=4, max_new_tokens=32, rl_steps=2, rl_num_train=64, rl_k=4,
                       rl_prompts_per_step=2, rl_max_prompt_batches=2, rl_eval_every=1, rl_eval_limit=4,
                       pairs_prompts=8, pairs_samples=2, dpo_batch_size=2, passk=2, passk_limit=4,
                       uf_train_pairs=16, uf_eval_prompts=6, uf_max_length=96, uf_max_new_tokens=16, uf_sft_steps=2,
                       uf_pref_steps=2, uf_rm_steps=2, uf_rloo_steps=2)
