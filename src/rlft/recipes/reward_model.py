"""Reward-model training (``rlft rm``): a Bradley-Terry loss on chosen/rejected pairs, one linear loop.

1. Read preference pairs with :func:`rlft.data.preferences.load_preference_pairs` (a local
   ``.jsonl``/``.json``/``.parquet`` file or a Hub dataset id such as
   ``HuggingFaceH4/ultrafeedback_binarized``, split ``train_prefs``; prompts are message lists).
   Ties (``score_chosen == score_rejected``) are dropped by default: a tied pair carries no
   preference, and a Bradley-Terry loss would still push one response above the other.
2. Hold out evaluation pairs: ``--eval-data`` (another file / Hub id), or ``--eval-split`` (another
   split of ``--data``, e.g. ``test_prefs``), or else a seeded ``--eval-fraction`` of ``--data``.
3. Tokenize each side as ``[*prompt, {"role": "assistant", "content": response}]`` with the chat
   template (:func:`rlft.data.chat.tokenize_preference_pair`; too-long responses cut at the end,
   pairs whose prompt alone does not fit dropped; both counted). The scorer
   (:class:`rlft.rewards.reward_model.RewardModelScorer`) renders conversations the same way.
4. The model is ``AutoModelForSequenceClassification(num_labels=1)`` loaded from a causal LM (or an
   existing reward model); a new score head is initialised N(0, 1/(d+1)) or to zero (``--head-init``)
   (:func:`rlft.rewards.reward_model.init_score_head`). The reward is read at each sequence's last
   real token from the attention mask (:func:`rlft.rewards.reward_model.sequence_rewards`), never
   via ``pad_token_id`` (which breaks when pad == EOS).
5. Train: every micro-batch puts its B chosen and B rejected sequences through ONE forward pass
   (a ``(2B, T)`` batch) and :func:`rlft.losses.reward.bradley_terry_loss` (optional margin
   ``--margin-scale * (score_chosen - score_rejected)``, optional ``--center-coef``); micro-batch losses
   are weighted to add up to the full-batch mean. Checkpoints and ``--resume`` as in SFT.
6. Evaluate pairwise accuracy (fraction of held-out pairs with ``r_chosen > r_rejected``, strictly)
   every ``--eval-every`` steps and at the end: logged in ``metrics.jsonl`` as ``eval/accuracy``,
   ``eval/loss``, ``eval/margin``; the final numbers go to ``eval.json`` (``step``, ``accuracy``,
   ``loss``, ``margin``, ``chosen``, ``rejected``, ``n``: null without held-out pairs; ``data``: the
   loaders' counts (rows, kept, skipped_invalid, ties, dropped_ties) and tokenization counts).

Output: ``output_dir/model`` is a standard HF folder: ``AutoModelForSequenceClassification.from_pretrained``
loads it (config ``num_labels=1`` and ``pad_token_id`` set; the tokenizer, with the chat template used,
saved alongside).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from rlft import distributed
from rlft.console import console, training_progress
from rlft.data.packing import default_pack_length, pack_examples
from rlft.data.tokenize import TokenizedExample, collate
from rlft.fsio import atomic_write_json
from rlft.losses.reward import bradley_terry_loss
from rlft.models import DEFAULT_MODEL
from rlft.lora import LoRAOptions
from rlft.options import (CheckpointingOptions, DistributedOptions, PackingOptions, OptimizerOptions, RunOptions,
                          SpeedOptions)
from rlft.recipes.common import (batch_indices, begin_run, checkpoint_if_due, micro_batch_label, optimizer_step,
                                 save_final, start_training, step_micro_batches, step_order, step_plan, TrainingSetup,
                                 write_run_config)
from rlft.recipes.memory import packed_tokens, padded_tokens
from rlft.validation import require, validate_options
from rlft.rewards.reward_model import (freeze_lower_layers, load_reward_model, packed_sequence_rewards, score_head,
                                       sequence_rewards)
from rlft.tracking import Tracker

log = logging.getLogger("rlft")


@dataclass(frozen=True)
class RMConfig(RunOptions, OptimizerOptions, LoRAOptions, CheckpointingOptions, PackingOptions, SpeedOptions,
               DistributedOptions):
    """Train a scalar reward model on preference pairs with a Bradley-Terry loss."""

    model: str = DEFAULT_MODEL
    """Base model: a causal LM (built-in name, local HF folder, or Hub id; usually the SFT model) whose
    LM head is replaced by a new scalar score head, or an existing reward-model folder to continue."""
    data: str = "HuggingFaceH4/ultrafeedback_binarized"
    """Preference pairs: a .jsonl/.json/.parquet file or Hub dataset id with prompt (text or message list),
    chosen, rejected (text or message lists) and optionally score_chosen/score_rejected."""
    data_split: str = "train_prefs"
    """Split to read when --data is a Hub dataset id."""
    limit: int | None = None
    """Use at most this many pairs of --data (before holding out evaluation pairs)."""
    skip_invalid: bool = False
    """Skip malformed rows (counted and reported) instead of stopping with an error."""
    drop_ties: bool = True
    """Drop pairs whose score_chosen equals score_rejected (counted): a tie states no preference, yet the
    Bradley-Terry loss would still push one response above the other. On by default for reward models."""
    eval_data: str | None = None
    """Held-out pairs from another file or Hub id. None: --eval-split of --data if set, else
    --eval-fraction of --data."""
    eval_split: str | None = None
    """Split of the evaluation pairs (e.g. test_prefs): of --eval-data, or of --data when --eval-data is None."""
    eval_fraction: float = 0.05
    """Fraction of --data held out for evaluation (seeded by --seed) when neither --eval-data nor
    --eval-split is given; 0 disables evaluation."""
    eval_limit: int | None = 500
    """Evaluate on at most this many held-out pairs (None: all)."""
    chat_template: str | None = None
    """Chat template for rendering conversations: a name (chatml, llama3) or a path to a .jinja file; None: the
    tokenizer's own.
    Saved with the model, so the scorer renders exactly as training did."""
    output_dir: str = "runs/rm"
    """Run directory: checkpoints/, model/, metrics.jsonl, eval.json, config.yaml."""
    max_length: int = 1024
    """Longest prompt + response in tokens; longer responses are cut at the end (counted), pairs whose
    prompt alone does not fit are dropped (counted)."""
    max_prompt_length: int | None = None
    """Cut longer prompts to this many tokens, keeping their end (counted as truncated), so pairs with long prompts
    are trained on instead of dropped; None: keep whole prompts. Applies to the held-out pairs too. Must
    be < --max-length."""
    margin_scale: float = 0.0
    """Llama-2 style margin: require r_chosen - r_rejected >= margin_scale * (score_chosen - score_rejected).
    0 turns it off; pairs without scores get margin 0."""
    center_coef: float = 0.0
    """Reward centering: add center_coef * mean((r_chosen + r_rejected)^2) to keep rewards near 0 (e.g. 0.01)."""
    batch_size: int = 16
    """Pairs per optimizer step."""
    micro_batch_size: int = 4
    """Pairs per forward/backward pass (2x as many sequences: chosen and rejected go through together);
    replaced by --max-tokens-per-micro-batch when that is set."""
    eval_batch_size: int = 8
    """Pairs per forward pass during evaluation."""
    epochs: float = 1.0
    """Passes over the training pairs (fractions allowed); ignored when --max-steps is set."""
    max_steps: int | None = None
    """Total optimizer steps (overrides --epochs)."""
    lr: float = 1e-5
    """Peak learning rate (AdamW) of the backbone."""
    head_lr: float | None = None
    """Peak learning rate of the score head (None: --lr). A new head trained at a body rate of ~1e-5 barely moves in
    a short run (its weights are ~1/sqrt(d)), so the body has to fit a random direction; a head rate ~100x
    higher (e.g. 1e-3) lets the head become a linear probe of the body's features first."""
    head_init: Literal["normal", "zero"] = "normal"
    """Init of a new score head: 'normal' N(0, 1/(d+1)) (Stiennon et al. 2020: initial rewards of std ~1, so early
    gradients reach the body), or 'zero' (every initial reward 0, the loss starts at exactly log 2; the body gets
    gradients once the head has moved, so pair it with --head-lr). An existing reward model keeps its head."""
    train_layers: int | None = None
    """Train only the top N transformer blocks (plus the final norm and the score head); embeddings and lower blocks
    stay frozen, which makes a step about one forward plus N/L of a backward. None: train everything."""
    warmup_ratio: float = 0.03
    """Fraction of optimizer steps spent warming the learning rate up linearly from 0."""
    eval_every: int = 50
    """Evaluate held-out pairwise accuracy every this many steps (0: only at the end)."""
    seed: int = 0
    """Seed for the score-head init, the held-out split and data order."""
    def __post_init__(self) -> None:
        validate_options(self)
        self._check_lora()
        self._check_distributed()
        self._check_micro_batches()
        require(self.max_prompt_length is None or self.max_prompt_length < self.max_length,
                f"--max-prompt-length must be < --max-length ({self.max_length}), got {self.max_prompt_length}")


@dataclass(frozen=True)
class RMExample:
    """One tokenized preference pair."""

    chosen: TokenizedExample
    rejected: TokenizedExample
    margin: float
    """margin_scale * (score_chosen - score_rejected), 0 without scores."""


# --------------------------------------------------------------------------- data


def _load(source: str, split: str, cfg: RMConfig, limit: int | None, loaded: dict) -> list:
    from rlft.data.preferences import load_preference_pairs

    pairs, counts = load_preference_pairs(source, split=split, limit=limit, skip_invalid=cfg.skip_invalid,
                                          drop_ties=cfg.drop_ties)
    log.info("%s (%s): %d pairs; %s", source, split, len(pairs), counts)
    loaded[f"{source}:{split}"] = counts
    return list(pairs)


def split_pairs(cfg: RMConfig, loaded: dict | None = None) -> tuple[list, list]:
    """``(train_pairs, eval_pairs)`` as configured (see the --eval-* options). The loaders' counts
    (rows, kept, skipped_invalid, ties, dropped_ties) are stored in ``loaded`` by ``"source:split"``."""
    loaded = {} if loaded is None else loaded
    train = _load(cfg.data, cfg.data_split, cfg, cfg.limit, loaded)
    if cfg.eval_data is not None or cfg.eval_split is not None:
        heldout = _load(cfg.eval_data or cfg.data, cfg.eval_split or cfg.data_split, cfg, cfg.eval_limit, loaded)
    elif cfg.eval_fraction > 0 and len(train) >= 2:
        n_eval = min(len(train) - 1, max(1, round(cfg.eval_fraction * len(train))))
        perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
        eval_idx = set(perm[:n_eval])
        heldout = [train[i] for i in sorted(eval_idx)]
        train = [p for i, p in enumerate(train) if i not in eval_idx]
    else:
        heldout = []
    if cfg.eval_limit is not None:
        heldout = heldout[: cfg.eval_limit]
    if not train:
        raise ValueError(f"no training pairs in {cfg.data}")
    return train, heldout


def _margin(pair, scale: float) -> float:
    sc, sr = getattr(pair, "score_chosen", None), getattr(pair, "score_rejected", None)
    if not scale or sc is None or sr is None:
        return 0.0
    return scale * (float(sc) - float(sr))


def tokenize_pairs(pairs: list, tokenizer, max_length: int, margin_scale: float = 0.0, what: str = "train",
                   max_prompt_length: int | None = None) -> tuple[list[RMExample], dict]:
    """Tokenize preference pairs; returns the examples and counts (kept, dropped, truncated).

    Prompts longer than ``max_prompt_length`` keep their end, responses keep their start
    (:func:`rlft.data.chat.tokenize_preference_pair`)."""
    from rlft.data.chat import tokenize_preference_pair

    examples, dropped = [], 0
    for pair in pairs:
        tokenized = tokenize_preference_pair(tokenizer, pair.prompt, pair.chosen, pair.rejected, max_length=max_length,
                                             max_prompt_length=max_prompt_length)
        if tokenized is None:
            dropped += 1
            continue
        examples.append(RMExample(tokenized[0], tokenized[1], _margin(pair, margin_scale)))
    counts = {
        "pairs": len(examples),
        "dropped_prompt_too_long": dropped,
        "chosen_truncated": sum(e.chosen.truncated for e in examples),
        "rejected_truncated": sum(e.rejected.truncated for e in examples),
    }
    log.info(
        "%s: %d pairs; %d chosen and %d rejected responses truncated to %d tokens; %d dropped (prompt alone too long)",
        what, counts["pairs"], counts["chosen_truncated"], counts["rejected_truncated"], max_length, dropped)
    return examples, counts


# --------------------------------------------------------------------------- forward


def pair_batch_tokens(examples: list[RMExample], packing: bool = False) -> int:
    """The size ``--max-tokens-per-micro-batch`` bounds, of a micro-batch of pairs: padded, 2 rows per pair x
    the longest side of any pair; with ``packing``, every chosen and rejected token (:mod:`rlft.recipes.memory`)."""
    if packing:
        return packed_tokens([len(e.chosen.input_ids) + len(e.rejected.input_ids) for e in examples])
    return padded_tokens([max(len(e.chosen.input_ids), len(e.rejected.input_ids)) for e in examples], rows_per_item=2)


def pair_rewards(model, examples: list[RMExample], pad_token_id: int, device, *,
                 packing: bool = False, pack_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen_rewards, rejected_rewards)``, each ``(B,)``, from ONE forward pass over a right-padded
    ``(2B, T)`` batch (rows ``0..B-1`` chosen, ``B..2B-1`` rejected), or with ``packing`` over the 2B
    sequences packed into rows of at most ``pack_length`` tokens (:mod:`rlft.data.packing`; default
    :func:`rlft.data.packing.default_pack_length`)."""
    sequences = [e.chosen for e in examples] + [e.rejected for e in examples]
    if packing:
        lengths = [len(e.input_ids) for e in sequences]
        packed = pack_examples(sequences, pad_token_id, pack_length or default_pack_length(model, lengths)).to(device)
        rewards = packed_sequence_rewards(model, packed.input_ids, packed.position_ids, packed.last_index)
        n = len(examples)
        return rewards[:n], rewards[n:]
    batch = collate(sequences, pad_token_id)
    rewards = sequence_rewards(model, batch.input_ids.to(device), batch.attention_mask.to(device))
    n = len(examples)
    return rewards[:n], rewards[n:]


@torch.no_grad()
def evaluate(model, examples: list[RMExample], pad_token_id: int, device, batch_size: int, *,
             packing: bool = False, pack_length: int | None = None) -> dict[str, float]:
    """Held-out metrics: ``accuracy`` (fraction with r_chosen > r_rejected, strictly), ``loss`` (mean
    Bradley-Terry loss, no margin), ``margin`` (mean r_chosen - r_rejected), ``chosen``, ``rejected``, ``n``."""
    was_training = model.training
    model.eval()
    chosen, rejected = [], []
    try:
        for start in range(0, len(examples), batch_size):
            c, r = pair_rewards(model, examples[start : start + batch_size], pad_token_id, device,
                                packing=packing, pack_length=pack_length)
            chosen.append(c.cpu())
            rejected.append(r.cpu())
    finally:
        model.train(was_training)
    c, r = torch.cat(chosen), torch.cat(rejected)
    loss, m = bradley_terry_loss(c, r)
    return {"accuracy": m["rm/accuracy"], "loss": loss.item(), "margin": m["rm/margin"],
            "chosen": m["rm/chosen"], "rejected": m["rm/rejected"], "n": len(examples)}


# --------------------------------------------------------------------------- training


def _start_training(cfg: RMConfig, run_dir: Path, spec, tokenizer,
                    total_steps: int) -> tuple[TrainingSetup, Tracker | None]:
    """:func:`rlft.recipes.common.start_training` with a reward model (lower blocks frozen with --train-layers)
    and two parameter groups: the body at ``lr``, the score head at ``head_lr`` (the logged lr is the body's)."""

    def load(name: str, spec) -> torch.nn.Module:
        model = load_reward_model(name, spec, pad_token_id=tokenizer.pad_token_id, head_init=cfg.head_init)
        if cfg.train_layers is not None:
            frozen = freeze_lower_layers(model, cfg.train_layers)
            log.info("RM: training the top %d blocks, final norm and head; %.1fM parameters frozen", cfg.train_layers,
                     frozen / 1e6)
        return model

    def groups(model: torch.nn.Module) -> list[dict]:
        head = [p for p in score_head(model).parameters() if p.requires_grad]
        body = [p for p in model.parameters() if p.requires_grad and all(p is not h for h in head)]
        return [{"params": body, "lr": cfg.lr}, {"params": head, "lr": cfg.head_lr or cfg.lr}]

    return start_training(cfg, run_dir, spec, total_steps, load=load, param_groups=groups)


def train_rm(cfg: RMConfig) -> Path:
    """Train a reward model as configured; returns the folder of the final model (``output_dir/model``).

    Under torchrun each rank trains on its :func:`rlft.distributed.shard` of every step's pairs, each
    micro-batch weighted by its share of the *whole* step's pairs, gradients summed over ranks, so the run
    equals the one-process run (up to float rounding); rank 0 alone evaluates (with FSDP2 every rank
    evaluates the whole held-out set with it, as every forward is collective) and writes every file."""
    run, spec, tokenizer = begin_run(cfg)  # refuses a folder holding another run; writes nothing yet
    if cfg.chat_template is not None:
        from rlft.data.chat import ensure_chat_template

        ensure_chat_template(tokenizer, cfg.chat_template)
    loaded: dict[str, dict] = {}
    train_pairs, eval_pairs = split_pairs(cfg, loaded)
    train, train_counts = tokenize_pairs(train_pairs, tokenizer, cfg.max_length, cfg.margin_scale, "train",
                                         cfg.max_prompt_length)
    heldout, eval_counts = (tokenize_pairs(eval_pairs, tokenizer, cfg.max_length, 0.0, "eval", cfg.max_prompt_length)
                            if eval_pairs else ([], {"pairs": 0}))
    if not train:
        raise ValueError(f"every training pair's prompt is longer than max_length={cfg.max_length}")
    if not heldout:
        log.warning(
            "no held-out pairs: pairwise accuracy is not evaluated (set --eval-fraction, --eval-split or --eval-data)")
    pad_id = tokenizer.pad_token_id
    steps_per_epoch, total_steps = step_plan(len(train), cfg)  # refuses an absurd count before the folder is made
    run_dir = run.open()

    setup, tracker = _start_training(cfg, run_dir, spec, tokenizer, total_steps)
    model, start_step = setup.model, setup.start_step
    log.info("RM: %d train / %d held-out pairs, %d steps of %d pairs (%s) on %s (%s)",
             len(train), len(heldout), total_steps, cfg.batch_size, micro_batch_label(cfg), spec.device, spec.label)

    sharded = distributed.sharded(model)  # FSDP2: every forward is collective, so every rank evaluates too
    size = lambda idx: pair_batch_tokens([train[i] for i in idx], cfg.packing)  # noqa: E731

    def run_eval() -> dict[str, float] | None:
        return (evaluate(model, heldout, pad_id, spec.device, cfg.eval_batch_size, packing=cfg.packing,
                         pack_length=cfg.pack_length) if heldout else None)

    last_eval: dict[str, float] | None = None
    with training_progress("rm") as progress:
        bar = progress.add_task("rm", total=total_steps, completed=start_step, info="")
        for step in range(start_step, total_steps):
            t0 = time.perf_counter()
            indices = step_order(batch_indices(step, len(train), cfg.batch_size, cfg.seed),
                                 lambda i: max(len(train[i].chosen.input_ids), len(train[i].rejected.input_ids)), cfg)
            sums: dict[str, float] = {}
            seen = 0
            # This rank's pairs (all of them in one process); FSDP2 adds zero-weight filler passes.
            for idx, real in step_micro_batches(indices, cfg, size, sharded):
                chunk = [train[i] for i in idx]
                weight = len(chunk) / len(
                    indices) if real else 0.0  # weighted micro-batch means add up to the batch mean
                chosen, rejected = pair_rewards(model, chunk, pad_id, spec.device, packing=cfg.packing,
                                                pack_length=cfg.pack_length)
                margin = torch.tensor([e.margin for e in chunk], device=chosen.device) if cfg.margin_scale else None
                loss, metrics = bradley_terry_loss(chosen, rejected, margin=margin, center_coef=cfg.center_coef)
                (loss * weight).backward()
                if not real:
                    continue
                for key, value in {"loss": loss.item(), **metrics}.items():
                    sums[key] = sums.get(key, 0.0) + weight * value
                seen += sum(len(e.chosen.input_ids) + len(e.rejected.input_ids) for e in chunk)
            sums, seen = distributed.all_reduce_counted(sums, seen)
            step_info = optimizer_step(setup, cfg.max_grad_norm,
                                       loss=sums.get("loss"))  # stops on a non-finite loss or gradient
            elapsed = time.perf_counter() - t0
            record = {"step": step + 1, "epoch": (step + 1) / steps_per_epoch, **sums, **step_info,
                      "tokens": seen, "tokens_per_s": seen / elapsed}
            info = f"loss {sums['loss']:.4f}  acc {sums['rm/accuracy']:.2f}"
            is_last = step + 1 == total_steps
            if heldout and (distributed.is_main() or sharded) and (is_last or (cfg.eval_every and
                                                                               (step + 1) % cfg.eval_every == 0)):
                last_eval = run_eval()
                record.update({f"eval/{k}": v for k, v in last_eval.items() if k != "n"})
                info += f"  eval acc {last_eval['accuracy']:.3f}"
            setup.metrics.log(record)
            progress.update(bar, advance=1, info=info)
            checkpoint_if_due(setup, run_dir, step + 1, total_steps, tokenizer, cfg)
    if tracker is not None:
        tracker.close()
    if not distributed.is_main() and not sharded:
        distributed.barrier()  # rank 0 evaluates and writes the model and eval.json
        return run_dir / "model"
    if heldout and last_eval is None:  # resumed a run that had already finished its steps
        last_eval = run_eval()
    final = save_final(run_dir, model, tokenizer)
    if not distributed.is_main():  # FSDP2: this rank took part in the evaluation and the gathering of the weights
        distributed.barrier()
        return final
    write_run_config(run_dir, cfg)
    keys = ("accuracy", "loss", "margin", "chosen", "rejected", "n")
    summary = {
        "step": total_steps, **{k: (last_eval or {}).get(k)
                                for k in keys}, "data": {"loaded": loaded, "train": train_counts, "eval": eval_counts}
    }
    atomic_write_json(run_dir / "eval.json", summary)
    if last_eval is not None:
        console.print(f"[green]RM done[/]: held-out pairwise accuracy {last_eval['accuracy']:.3f} on {last_eval['n']} "
                      f"pairs; model saved to {final}")
    else:
        console.print(f"[green]RM done[/]: model saved to {final} (no held-out pairs)")
    distributed.barrier()
    return final
