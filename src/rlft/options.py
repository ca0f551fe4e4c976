"""Option blocks several commands share, as dataclass mixins (their fields come first in ``--help``).

- :class:`MemoryOptions`: ``--gradient-checkpointing``, ``--logits-chunk-size`` (sft, dpo, rl/rloo; the reward
  model has no LM head to chunk and takes :class:`CheckpointingOptions`);
- :class:`PackingOptions`: ``--packing``, ``--pack-length`` (sft, dpo, rm);
- :class:`SpeedOptions`: ``--compile``, ``--max-tokens-per-micro-batch`` (sft, dpo, rm; rl/rloo take
  :class:`CompileOptions`, ``--compile`` alone: its micro-batches are counted in sequences);
- :class:`TrackingOptions`: ``--report-to`` (sft, dpo, rm, rl/rloo);
- :class:`DistributedOptions`: ``--distributed auto|ddp|fsdp2`` (sft, dpo, rm, rl/rloo under torchrun; auto: fsdp2,
  or ddp with LoRA, see :func:`resolved_strategy`);
- :class:`RolloutOptions`: ``--rollout-engine``, ``--rollout-url`` (eval countdown, pairs countdown; the RL loop
  has its own ``--rollout-engine hf|vllm``: a server's weights cannot follow the policy);
- :class:`DeviceOptions`: ``--device``, ``--dtype`` (every command that loads a model);
- :class:`OptimizerOptions`: ``--lr``, ``--optimizer``, ``--weight-decay``, ``--warmup-ratio``, ``--schedule``,
  ``--max-grad-norm`` (sft, dpo, rm, rl/rloo; each recipe overrides the defaults it needs, e.g. its ``lr``);
- :class:`RunOptions`: ``--save-every``, ``--keep-checkpoints``, ``--resume``, ``--overwrite``,
  ``--resume-override`` and the device options (sft, dpo, rm, rl/rloo: the training recipes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from rlft.validation import NON_NEGATIVE, POSITIVE, POSITIVE_INT, PROBABILITY, OptionError, require

MAX_NEW_TOKENS = 256
"""The default token budget of one completion, EOS included: the samplers' (``SamplingParams``, ``rlft rl``'s
``--max-new-tokens`` and ``--eval-max-new-tokens``, the demo's), and on a CPU that of the commands whose budget follows
the device (``eval countdown``, ``pairs countdown``). Declared once here."""
MAX_NEW_TOKENS_CUDA = 1024
"""The default token budget of one completion on CUDA for the commands whose budget follows the device."""


@dataclass(frozen=True)
class DeviceOptions:
    """``--device``, ``--dtype``: where a command runs and in what precision (see :func:`rlft.models.pick_device`)."""

    device: str = "auto"
    """'auto' (CUDA if present, else CPU), 'cpu', 'cuda', 'cuda:1', ..."""
    dtype: str = "auto"
    """'auto': bfloat16 on CUDA; on a CPU with native bfloat16 (avx512_bf16 or AMX, detected at run time) float32
    weights and optimizer state with bfloat16 compute (autocast), generation from bfloat16 weights; else float32.
    'float32' forces float32 everywhere; 'bfloat16', 'float16': weights in that dtype (training commands refuse
    float16 weights: no float32 master copy and no loss scaling, so their loss turns NaN)."""


@dataclass(frozen=True)
class RunOptions(DeviceOptions):
    """A training run's folder: checkpoints, resuming, replacing (and ``--device``, ``--dtype``)."""

    save_every: Annotated[int, NON_NEGATIVE] = 50
    """Write a resumable checkpoint every this many steps and after the last one, which --resume with a longer
    --max-steps continues (0: only the final model)."""
    keep_checkpoints: Annotated[int, POSITIVE_INT] = 2
    """How many recent checkpoints to keep."""
    resume: bool = False
    """Continue from the latest checkpoint in --output-dir: model, optimizer, scheduler, RNG state and data position
    (DPO also reads its cached reference log-probs back)."""
    overwrite: bool = False
    """Replace a run already in --output-dir: it is moved aside to <output-dir>.replaced-<time> (logged) once the
    inputs are validated. Without it (or --resume) a folder holding a run is refused."""
    resume_override: tuple[str, ...] = ()
    """With --resume: options allowed to differ from the run's saved config.yaml (e.g. lr batch_size); any other
    difference is refused. A longer --max-steps needs no override."""


@dataclass(frozen=True)
class OptimizerOptions:
    """The optimizer and its learning-rate schedule (:func:`rlft.recipes.common.prepare_training`)."""

    lr: Annotated[float, POSITIVE] = 1e-5
    """Peak learning rate."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """'adamw', or 'sgd' (plain SGD: each update is lr x the clipped gradient). AdamW moves every weight by ~lr per
    step whatever its gradient (its first steps are sign descent), which for a handful of steps on a sparse,
    noisy gradient spreads the update over all weights; SGD's update follows the gradient's direction
    and size. With SGD, lr is the length of a step whose gradient norm reaches max_grad_norm = 1 (try ~1e-2)."""
    weight_decay: Annotated[float, NON_NEGATIVE] = 0.0
    """Weight decay."""
    warmup_ratio: Annotated[float, PROBABILITY] = 0.0
    """Fraction of optimizer steps spent warming the learning rate up linearly from 0."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Learning-rate decay after warmup."""
    max_grad_norm: Annotated[float, NON_NEGATIVE] = 1.0
    """Gradient clipping threshold (global L2 norm); 0 disables clipping."""


@dataclass(frozen=True)
class TrackingOptions:
    """``--report-to``: an experiment tracker that gets every metrics record."""

    report_to: Literal["none", "tensorboard", "wandb", "trackio"] = "none"
    """Also send every metrics.jsonl record, under the same names, to TensorBoard (output_dir/tensorboard),
    Weights & Biases or Trackio (optional extras: pip install 'rlft[tensorboard]' etc.)."""


@dataclass(frozen=True)
class CheckpointingOptions(TrackingOptions):
    """``--gradient-checkpointing`` (and ``--report-to``)."""

    gradient_checkpointing: bool = False
    """Recompute each block's activations in the backward pass instead of storing them (less memory,
    about one more forward per step)."""


@dataclass(frozen=True)
class MemoryOptions(CheckpointingOptions):
    """``--logits-chunk-size`` (and ``--gradient-checkpointing``, ``--report-to``)."""

    logits_chunk_size: Annotated[int, NON_NEGATIVE] = 0
    """Compute the LM head over this many target tokens at a time, recomputed in the backward pass, so
    the full (tokens, vocab) logits never exist at once (large vocabularies, e.g. Qwen2.5's 151,936);
    0: all at once. Same values and gradients."""


@dataclass(frozen=True)
class PackingOptions:
    """``--packing``, ``--pack-length``: padding-free batches."""

    packing: bool = False
    """Padding-free packing: each micro-batch's sequences are concatenated into rows with no padding
    (position_ids restart at every sequence, attention stays inside each; see rlft.data.packing). Same
    loss and gradients as padding, up to float rounding."""
    pack_length: Annotated[int | None, POSITIVE_INT] = None
    """With --packing: most tokens per packed row (a longer sequence gets a row of its own). None: one row
    per micro-batch with flash-attention (its varlen kernel wants that); with SDPA/eager (CPU), whose
    block-diagonal mask costs the square of the row, rows as long as the micro-batch's longest sequence,
    so never more rows nor longer ones than padding."""


@dataclass(frozen=True)
class CompileOptions:
    """``--compile``: torch.compile of the decoder layers (:func:`rlft.recipes.common.start_training`)."""

    compile: bool = False
    """torch.compile each decoder layer's forward (inductor, dynamic shapes: one compiled graph serves every
    layer and every batch shape; a batch of one row compiles once more). The first steps pay the compilation
    (tens of seconds, minutes on a CPU); same values and gradients up to float rounding. Off by default."""


@dataclass(frozen=True)
class SpeedOptions(CompileOptions):
    """``--compile``, ``--max-tokens-per-micro-batch``: throughput on a GPU (:mod:`rlft.recipes.memory`)."""

    max_tokens_per_micro_batch: Annotated[int | None, POSITIVE_INT] = None
    """Cut each step's examples (length-sorted) into micro-batches by size instead of --micro-batch-size:
    as many as fit N padded tokens (rows x longest row; DPO and rm: 2 rows per pair) or, with --packing, N
    real tokens (a pair counts chosen + rejected); a longer example gets a micro-batch of its own. Steps and
    loss normalisers are unchanged (whole-step token and pair counts), so the gradient is the same up to
    float rounding. DPO's reference pass is cut the same way, and RL cuts its sampled sequences so in every pass
    (reference, pre-update and update). None: --micro-batch-size examples each."""

    def _check_micro_batches(self) -> None:
        """Refuse a step that micro-batches of ``micro_batch_size`` examples do not tile (call from ``__post_init__``
        of a config with ``batch_size`` and ``micro_batch_size``).

        Raises:
            OptionError: ``batch_size`` is not a multiple of ``micro_batch_size`` and no token budget is set.
        """
        from rlft.validation import require

        require(self.max_tokens_per_micro_batch is not None or self.batch_size % self.micro_batch_size == 0,
                f"--batch-size {self.batch_size} must be a multiple of --micro-batch-size {self.micro_batch_size}")


@dataclass(frozen=True)
class DistributedOptions:
    """``--distributed``: the data-parallel strategy under torchrun."""

    distributed: Literal["auto", "ddp", "fsdp2"] = "auto"
    """Data-parallel strategy under torchrun (`torchrun --nproc-per-node N rlft <command> ...`): 'ddp', a full
    replica per rank; 'fsdp2', parameters, gradients and optimizer state sharded over the ranks per decoder
    layer (torch FSDP2 fully_shard; no LoRA); 'auto' (the default), fsdp2 with more than one rank, or ddp with
    LoRA (--lora-r > 0). Either way each step's batch is split across ranks and gradients are summed, so the
    result does not depend on the number of ranks (see rlft.distributed). Ignored in a one-process run."""

    def _check_distributed(self) -> None:
        """Refuse what FSDP2 cannot shard (call from ``__post_init__``).

        Raises:
            OptionError: ``--distributed fsdp2`` (explicit) with LoRA (``lora_r > 0``).
        """
        from rlft.validation import require

        require(self.distributed != "fsdp2" or not getattr(self, "lora_r", 0),
                "--distributed fsdp2 does not take LoRA (--lora-r): the adapters are small, use --distributed ddp "
                "(or auto, which picks ddp with LoRA)")


def resolved_strategy(cfg: DistributedOptions, world_size: int) -> Literal["ddp", "fsdp2"]:
    """The strategy ``cfg.distributed`` means with ``world_size`` ranks: 'ddp' or 'fsdp2' as given, and 'auto' is
    'fsdp2' when ``world_size > 1`` unless the run trains LoRA adapters (``cfg.lora_r > 0``: FSDP2 does not take
    them), then 'ddp'; with one rank 'auto' is 'ddp' (nothing is wrapped either way). A pure function of its
    arguments: the config is never changed. Pass :func:`rlft.distributed.world` in a recipe (after
    :func:`rlft.distributed.init`), any number > 1 for what a torchrun launch would do (the dry-run plan)."""
    if cfg.distributed != "auto":
        return cfg.distributed
    return "fsdp2" if world_size > 1 and not getattr(cfg, "lora_r", 0) else "ddp"


@dataclass(frozen=True)
class RolloutOptions:
    """``--rollout-engine``, ``--rollout-url``: who generates (:func:`rlft.rollout.engines.make_engine`)."""

    rollout_engine: Literal["hf", "vllm", "server"] = "hf"
    """Who generates: 'hf' (transformers generate), 'vllm' (vLLM in this process; pip install rlft[vllm],
    CUDA), or 'server' (an OpenAI-compatible completions server serving --model, e.g. `vllm serve`, at
    --rollout-url)."""
    rollout_url: str | None = None
    """Server base URL for --rollout-engine server, e.g. http://127.0.0.1:8000/v1."""


@dataclass(frozen=True)
class EnvOptions:
    """``--env`` and the bounds of rollouts with tool calls (rl/rloo, eval countdown, eval env, pairs countdown).

    The environment is named here and loaded by the command (:mod:`rlft.environment`); tools run in rollouts of the
    CPU engines and CUDA's static path (:mod:`rlft.rollout.turns`)."""

    env: str | None = None
    """The environment: 'countdown' (Countdown with the rule reward; the default), 'countdown-calc' (Countdown with a
    calculator tool, the 'calc' prompt), 'chat' (the --prompts-data track; its default), or a user's
    path/to/file.py:ClassName (a subclass of rlft.environment.Environment)."""
    max_turns: Annotated[int, POSITIVE_INT] = 8
    """With tools: most model turns per rollout (a call in the last turn gets no answer): 8 answers the 7 calls of a
    patient Countdown search (6 dead ends and the solution). An environment may set its own."""
    max_observation_tokens: Annotated[int, POSITIVE_INT] = 32
    """With tools: most tokens of one tool observation (cut beyond). Observations never count toward
    --max-new-tokens, which bounds the model's own tokens."""
    tool_timeout: Annotated[float, POSITIVE] = 5.0
    """With tools: seconds one tool call may run; a slower call's observation is an error and the rollout goes on."""

    def _check_env(self, prompts_data: str | None = None, rollout_engine: str = "hf") -> None:
        """One-line errors for an env that cannot be loaded or does not fit the other options."""
        from rlft.environment import check_env_spec, is_user_env

        if self.env is None:
            return
        try:
            check_env_spec(self.env)
        except ValueError as exc:
            raise OptionError(str(exc)) from None
        require(self.env != "chat" or prompts_data is not None, "--env chat needs --prompts-data (the chat prompts)")
        require(self.env == "chat" or prompts_data is None,
                f"--env {self.env} brings its own prompts: drop --prompts-data (or use --env chat)")
        require(self.env != "countdown-calc" or rollout_engine == "hf",
                f"--env countdown-calc calls a tool in the middle of a rollout: --rollout-engine {rollout_engine} "
                "cannot pause a row (use hf)")
        require(not is_user_env(self.env) or rollout_engine == "hf",
                f"--env {self.env}: a user's environment runs on --rollout-engine hf (its tools pause rollouts)")
