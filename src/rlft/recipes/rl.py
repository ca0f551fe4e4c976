"""One RL loop for every policy-gradient recipe: sample -> reward -> advantages -> loss -> update -> log.

The options are :class:`rlft.rl.config.RLConfig`. The advantage estimator (``--advantage``,
:data:`rlft.losses.advantages.ADVANTAGES`) and the objective (``--loss`` of :data:`rlft.losses.pg.POLICY_LOSSES`,
its clip range, the KL placement, the entropy bonus: :func:`rlft.losses.pg.make_objective`) are chosen by name,
once, before the loop, as in verl and OpenRLHF; the prompt source, the reward and the rollout engine are small
objects the loop is given (:mod:`rlft.rl.prompts`, :mod:`rlft.rl.rewards`, :func:`rlft.rollout.engines.make_engine`)
and never looks inside: after every update it calls ``engine.sync_weights(model)``, whatever the engine. The start-up
(model, optimizer, resume, gradient checkpointing, ``--compile``, tracker) is the other recipes'
:func:`rlft.recipes.common.start_training`. The loop's parts live in :mod:`rlft.rl`: the records they pass
(:mod:`rlft.rl.records`), sampling (:mod:`rlft.rl.sampling`), batches and the loss's backward
(:mod:`rlft.rl.batch`), metrics (:mod:`rlft.rl.metrics`). Named combinations:

=====================  ==========================================================================
RLOO                   ``--advantage rloo --loss reinforce --loss-mode seq_sum`` (``rlft rloo``: these defaults)
GRPO                   ``--advantage grpo --loss ppo --loss-mode seq_mean``
Dr. GRPO               ``--advantage dr_grpo --loss ppo --loss-mode seq_sum``
Lite-PPO               ``--advantage lite_ppo --loss ppo --loss-mode token_mean``
DAPO-style             ``--advantage grpo --loss ppo --clip-high 0.28 --loss-mode token_mean --filter-groups``
Reinforce-Rej          ``--advantage reinforce`` or ``rloo`` with ``--filter-groups``
RAFT / RAFT++          ``--advantage raft --loss raft`` / ``--loss raft++``
TOPR with replay       ``--loss topr --loss-mode seq_mean --replay-size P --max-staleness 1`` (P = prompts per step:
                       every sample trained on twice)
=====================  ==========================================================================

Each step:

1-2. :func:`rlft.rl.sampling.sample_step` returns the step as one record (:class:`rlft.rl.records.StepSamples`):
   it takes ``prompts_per_step`` training prompts (a seeded order, so a resumed run sees the same prompts; with
   ``--curriculum sec`` drawn by SEC's bandit over difficulty buckets, :mod:`rlft.rl.curriculum`, whose values
   follow each bucket's mean |advantage| after step 5), samples ``k`` completions for each at ``temperature``
   (seeded from seed + step), scores them with the reward (``(B, k)`` raw rewards) and shapes them once
   (:mod:`rlft.rl.shaping`: with ``truncation_penalty`` set, samples that hit ``max_new_tokens`` without an EOS
   get it added, with ``--overlong-buffer`` DAPO's soft overlong punishment of long completions, and with
   ``--repetition-limit N`` a completion that writes one identical line N or more times scores as no answer (0) or,
   with ``--repetition-penalty``, gets it added: ``reward/repetition_frac``, ``reward/repetition_penalty_mean``). With
   ``--filter-groups`` the groups whose k shaped rewards are all equal are dropped and further batches of prompts
   are sampled, up to ``max_prompt_batches`` per step, until ``prompts_per_step`` varied groups are found
   (``groups/tried``, ``groups/kept``). The record also holds this rank's teacher-forcing batch and the step's
   totals (samples, generated tokens, generation time). With ``--replay-size`` (:mod:`rlft.rl.replay`) up to that
   many of the kept groups of the last ``--max-staleness`` steps are drawn from the buffer (seeded per step, without
   replacement) and added after the fresh ones, each shaped and filtered from its raw rewards and samples as a fresh
   group is (:func:`rlft.rl.sampling.with_replayed`); the steps below treat them alike (a replayed group's KL in the reward
   and advantages are recomputed; one whose advantages are all 0 gets no forward); after the update the step's
   fresh groups join the buffer. The loss divides by the **behaviour policy's** log-probs (fresh and replayed rows,
   from the first epoch on; also with ``--loss topr``): the sampler's own, stored with each sample, when the engine
   reports them (the HF engine's row-dropping decoders), so the ratio is exact, the sampler's precision part
   included (``mismatch/abs_logp_*`` shows its size); else the trainer's pre-update log-probs of the step that
   sampled it (one more no-grad pass), which leave that part out;
3. teacher-force the sampled sequences (prompt ids exactly as the sampler tokenized them) to get
   log-probs at the sampling temperature under the reference (when ``beta > 0``; with LoRA the
   reference is the same model with its adapters disabled) and, when needed, the pre-update policy;
4. KL: ``kl_mode=reward`` subtracts ``beta * sum_t kl_t`` from each shaped reward before the advantages (the
   RLOO paper); ``kl_mode=loss`` adds ``beta * aggregate(kl_t)`` to the loss (OpenRLHF/verl);
5. advantages ``(B, k)`` by the chosen estimator;
6. loss and update: ``ppo_epochs`` optimizer steps on these samples with the objective (the first is
   on-policy: ratio 1, or with ``--loss topr`` or replay the ratio to the behaviour policy; RAFT's losses first
   select the samples with A > 0, weight 1); a non-finite loss or gradient norm stops the run before the update
   (:func:`rlft.recipes.common.optimizer_step`). Samples whose weight
   is exactly 0 add nothing to the loss or its gradient, so unless the KL or an entropy bonus is in the
   loss they are skipped; the loss keeps the full step's normalisers, so the update is the same as with
   them, only cheaper. With ``--mask-truncated`` the samples that hit ``max_new_tokens`` without an EOS are
   left out of the loss and of its normalisers (after counting in their group's advantages); a step whose samples
   are all truncated then trains nothing, and a warning names it. Then ``engine.sync_weights(model)``;
7. log: one metrics record (below).

Log-probs are always computed at the sampling temperature (``logits / T``). With ``top_p < 1`` the
sampler truncates the distribution; the loss uses the untruncated tempered distribution, as TRL and
OpenRLHF do. With ``--compile`` the loss passes run the compiled decoder layers and generation the eager ones
(:func:`rlft.recipes.memory.eager_layers`: a KV cache would recompile every layer).

Metrics (one ``metrics.jsonl`` line per step, :mod:`rlft.rl.metrics`; ``step`` counts steps, not optimizer steps):

- ``reward/mean``, ``reward/std``: raw scores of all samples generated this step (every tried group);
  rule rewards also ``reward/accuracy`` (score == 1.0) and ``reward/format_rate`` (>= 0.1);
  ``reward/shaped_mean``: mean of the rewards the advantages are computed from (trained groups);
  ``reward/overlong_penalty_mean`` (``--overlong-buffer``): the mean overlong punishment of those samples.
- ``groups/tried``, ``groups/kept``: prompt groups sampled and trained on; ``samples/step`` (generated
  this step) and ``samples/total`` (generated so far: the x axis of sample-efficiency plots).
- Compute (:class:`rlft.compute.RunTotals`, cumulative values continued on ``--resume``): ``tokens/generated``
  (completion tokens sampled this step), ``tokens/trained`` (completion tokens through a backward this step, once
  per PPO epoch), ``tokens/generated_total``, ``tokens/trained_total`` and ``flops/estimated`` (cumulative
  ``6 N`` x the prompt + completion tokens of the forward+backward passes ``+ 2 N`` x those of the no-grad
  log-prob passes and the generated tokens; N the parameter count).
- ``kl/mean`` (beta > 0), ``entropy`` (Monte-Carlo estimate from the sampled tokens; with ``--mask-truncated``
  from the samples in the loss),
  ``update/rows_frac``, ``update/masked_frac`` (the share of samples ``--mask-truncated`` left out of the loss),
  ``completion/mean_tokens``, ``completion/truncated_frac``, ``adv/mean``, ``adv/std``.
- ``loss/policy``, ``loss/kl`` (kl_mode=loss), ``loss/entropy`` (entropy_coef > 0), ``pg/clipfrac``,
  ``pg/ratio_mean``, ``grad_norm``, ``lr``; ``time/generate_s``, ``time/update_s``, ``time/step_s``,
  ``tokens_per_s/generate``, ``tokens_per_s/update``, ``time/eval_s``.
- ``mismatch/abs_logp_mean``, ``mismatch/abs_logp_p99`` (the engine reports log-probs): ``|trainer - sampler|``
  log-prob of the fresh samples' tokens, nats; ``pg/topr_truncated_frac``, ``pg/topr_weight_mean`` (``--loss topr``):
  the share of negative samples whose ratio is truncated, and their mean weight.
- ``replay/share`` (``--replay-size``): replayed samples / all samples trained on (``(R-1)/R`` once the buffer is
  full with reuse factor R), ``replay/staleness_mean`` (steps), ``replay/abs_log_ratio_mean`` and
  ``replay/abs_log_ratio_p99``: ``|log pi(y|x) - log mu(y|x)|`` of the replayed sequences under the policy before the
  update (every replayed row when a no-grad pass ran, else the updated ones). With replay, the metrics of the trained
  samples (``reward/shaped_mean``, ``adv/*``, ``completion/*``, ``update/*``, ``entropy``, ``kl/mean``, the loss's)
  count replayed samples too; ``reward/mean``, ``groups/*``, ``samples/*`` and ``tokens/generated`` the fresh ones.
- ``curriculum/p_<bucket>``, ``curriculum/q_<bucket>``, ``curriculum/n_<bucket>`` (``--curriculum sec``): the
  probabilities the step's draws used, the values after its update, the prompts drawn from each bucket.
- ``eval/score``, ``eval/accuracy``, ``eval/format_rate`` (Countdown, greedy, first eval_limit held-out
  tasks) or ``eval/reward``, ``eval/truncated_frac`` (chat), every eval_every steps, at step 0 and at the end.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from rlft import distributed
from rlft.checkpoint import read_metrics
from rlft.compute import RunTotals, parameter_count
from rlft.console import training_progress
from rlft.lora import adapters_disabled
from rlft.losses.advantages import advantage_function
from rlft.losses.pg import PolicyObjective, make_objective, sequence_kl
from rlft.models import load_model, load_tokenizer, pick_device
from rlft.options import resolved_strategy
from rlft.recipes.common import batch_indices, checkpoint_if_due, claim_run_dir, finish_run, optimizer_step, start_training
from rlft.recipes.memory import eager_layers
from rlft.rewards.registry import RewardFunction
from rlft.rl.batch import (LossContext, PassPlan, batch_logprobs, filler_batch, gradient_rows, policy_loss_backward, replay_seed,
                           sampler_logprobs, take_rows, with_logprobs, without_rows)
from rlft.rl.config import RLConfig
from rlft.rl.curriculum import CurriculumSampler, group_abs_advantages
from rlft.rl.metrics import (NO_UPDATE, loss_metrics, mismatch_metrics, reduce_loss_metrics, replay_log_ratios, sample_metrics,
                             step_counts, update_metrics)
from rlft.rl.prompts import make_prompt_source
from rlft.rl.rewards import make_reward
from rlft.rl.replay import ReplayBuffer
from rlft.rl.sampling import fresh_groups, sample_step, with_replayed
from rlft.rl.shaping import shaping_metrics
from rlft.rollout.engines import check_training_engine, make_engine
from rlft.tasks.countdown.prompts import adds_special_tokens
from rlft.types import TokenBatch
from rlft.validation import OptionError, UsageError

log = logging.getLogger("rlft")

__all__ = ["RLConfig", "train_rl", "update_policy"]


def update_policy(setup, cfg: RLConfig, batch: TokenBatch, weights: torch.Tensor, objective: PolicyObjective, plan: PassPlan,
                  context: LossContext) -> tuple[torch.Tensor, list[dict[str, float]], torch.Tensor | None]:
    """Step 6 of the loop: ``cfg.ppo_epochs`` optimizer steps on the rows of ``batch`` (``(N, T)``, this rank's)
    whose loss ``weights`` (``(N,)``) carry gradient (:func:`rlft.rl.batch.gradient_rows`).

    ``context`` holds every row's pre-update log-probs (``old_logprobs``: used from the second epoch on, the
    first is on-policy; with :attr:`~rlft.losses.pg.PolicyObjective.behaviour_ratio`, the behaviour policy's, used
    from the first epoch on) and reference log-probs, and the whole step's normalisers, which the skipped rows keep.
    With no rows anywhere the optimizer steps on a zero gradient (AdamW still applies its momentum, as it
    would). Every optimizer step is given the step's loss (:func:`rlft.recipes.common.optimizer_step`: a NaN or
    infinite loss or gradient norm stops the run before the update). Collective under torchrun.

    Returns:
        ``(rows, epoch_metrics, logprobs)``: the ``(M,)`` updated rows, one metrics dict per optimizer step
        (losses reduced over ranks, ``grad_norm``, ``lr``), and the first epoch's ``(M, T)`` log-probs of the
        updated rows (the sampling policy's; None when this rank updated none).
    """
    model = setup.model
    rows = gradient_rows(weights, objective, batch.loss_mask)
    sub = take_rows(batch, rows)
    rows_total = int(distributed.all_reduce_sum(len(rows)))
    update_plan = plan.synced(model, sub)  # passes: None unless sharded; 0: no rows anywhere
    keep_old = (cfg.ppo_epochs > 1 or objective.behaviour_ratio) and context.old_logprobs is not None
    context = replace(context, old_logprobs=context.old_logprobs[rows] if keep_old else None,
                      ref_logprobs=context.ref_logprobs[rows] if context.ref_logprobs is not None else None,
                      sampler_logprobs=context.sampler_logprobs[rows] if context.sampler_logprobs is not None else None)
    epoch_metrics: list[dict[str, float]] = []
    first_logprobs = None
    for epoch in range(cfg.ppo_epochs):
        metrics = dict(NO_UPDATE)
        if len(rows) or update_plan.passes:
            metrics, logprobs = policy_loss_backward(model, sub, weights[rows], objective, update_plan, context)
            if epoch == 0:
                first_logprobs = logprobs  # the sampling policy's log-probs of the updated rows
        elif rows_total == 0:  # nothing to learn from: a zero gradient (every rank alike, so the collectives match)
            distributed.reshard(model)  # FSDP2: the no-grad passes above left the root group gathered (plain tensors)
            for p in model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        metrics = reduce_loss_metrics(metrics, float(sub.loss_mask.sum()) if len(rows) else 0.0)
        loss = metrics["loss/policy"] + objective.kl_coef * metrics["loss/kl"] - objective.entropy_coef * metrics["loss/entropy"]
        epoch_metrics.append({**metrics, **optimizer_step(setup, cfg.max_grad_norm, loss=loss)})  # stops on a non-finite loss
    return rows, epoch_metrics, first_logprobs


# --------------------------------------------------------------------------- the loop


def train_rl(cfg: RLConfig, *, reward_fn: RewardFunction | None = None) -> Path:
    """Run the RL loop as configured; returns the folder of the final model (``output_dir/model``).

    ``reward_fn`` overrides the configured reward (a rule function ``(prompts, completions,
    ground_truths)``, for programmatic use and tests; see :func:`rlft.rl.rewards.make_reward`).

    Under torchrun each rank samples, scores and trains on its share of every step's groups (:func:`rlft.rl.sampling.sample_step`);
    the advantages come from every rank's rewards, the loss is divided by the whole step's sample and token
    counts, gradients are summed over ranks and metrics are sums over ranks, so given the same samples the
    update is the one-process update (up to float rounding). The samples themselves differ from a one-process
    run's (each rank draws from its own seeded stream, and generation batches other prompts together). Every
    rank evaluates its shard of the held-out prompts (:func:`rlft.rl.prompts.evaluate_sharded`); rank 0 alone
    writes files.

    With ``--distributed fsdp2`` (the default under torchrun without LoRA, :func:`rlft.options.resolved_strategy`)
    the policy is sharded, and so is a separate reference model (beta > 0): every forward and backward is
    collective, so every rank runs as many as the busiest one. Generation: :class:`rlft.rollout.hf.HFEngine`
    with ``synced_gpus`` and filler chunks; log-prob passes and the update: filler micro-batches
    (:func:`rlft.rl.batch.synced_passes`); checkpoints and the final model: full state dicts gathered on rank 0.

    With ``--replay-size`` (one process only) the buffer (:class:`rlft.rl.replay.ReplayBuffer`) is saved in every
    checkpoint (``trainer_state.pt``'s ``replay``) and restored from it on ``--resume``, so a resumed run draws the
    groups the uninterrupted run would have drawn.

    Raises:
        UsageError: ``--rollout-engine vllm`` under torchrun (:func:`rlft.rollout.engines.check_training_engine`);
            ``--replay-size`` under torchrun; ``--resume --replay-size`` from a checkpoint holding no buffer.
    """
    distributed.init(cfg.device)  # under torchrun only
    check_training_engine(cfg.rollout_engine)  # before anything loads
    if cfg.replay_size and distributed.active():
        raise UsageError("--replay-size runs in one process: each rank would hold only its own groups (drop torchrun or --replay-size)")
    run = claim_run_dir(cfg)  # refuses a folder holding another run; writes nothing yet
    if cfg.beta > 0 and cfg.kl_mode == "loss" and cfg.kl_estimator == "k1":
        log.warning("--kl-mode loss with the k1 estimator: its expected gradient is zero; consider --kl-estimator k3")
    chat = cfg.prompts_data is not None
    tokenizer = load_tokenizer(cfg.model)
    if cfg.chat_template is not None or chat:
        from rlft.data.chat import ensure_chat_template

        ensure_chat_template(tokenizer, cfg.chat_template)  # None: the tokenizer's own, required on the chat track
    reward = make_reward(cfg, reward_fn)  # once: the loop calls reward.fn
    advantage_fn = advantage_function(cfg)
    objective = make_objective(cfg)
    torch.manual_seed(cfg.seed)
    spec = pick_device(cfg.device, cfg.dtype)
    source = make_prompt_source(cfg, tokenizer, reward)
    prompts = source.train
    if cfg.prompts_per_step > len(prompts):  # before the model loads; generated tasks are checked by RLConfig already
        raise OptionError(f"--prompts-per-step ({cfg.prompts_per_step}) is more than the {len(prompts)} training prompts")
    if len(prompts) % cfg.prompts_per_step:
        log.warning("%d training prompts are not a multiple of --prompts-per-step %d: the last step of each epoch trains on "
                    "%d groups", len(prompts), cfg.prompts_per_step, len(prompts) % cfg.prompts_per_step)
    run_dir = run.open()
    evaluate_on = bool(cfg.eval_every and source.eval)

    total_steps = cfg.max_steps
    # the shared start-up: model (resumed), optimizer over ppo_epochs optimizer steps per step, gradient checkpointing,
    # --compile, the tracker
    setup, tracker = start_training(cfg, run_dir, spec, total_steps * cfg.ppo_epochs)
    model, start_step, lora = setup.model, setup.start_step, cfg.lora_settings()
    # the kept groups of the last max_staleness steps (all a draw can take), for --replay-size draws per step
    buffer = ReplayBuffer(cfg.max_staleness * cfg.prompts_per_step, cfg.max_staleness) if cfg.replay_size else None
    if buffer is not None and setup.trainer_state is not None:  # resumed: the buffer as the checkpoint left it
        if "replay" not in setup.trainer_state:
            raise UsageError(f"--resume with --replay-size: checkpoint {setup.checkpoint} holds no replay buffer (written by a run "
                             "without --replay-size); resume without it or start a new run")
        buffer.load_state_dict(setup.trainer_state["replay"])
    # The reference is the initial policy, never a checkpoint of this run: with LoRA the same model with its
    # adapters off (no second copy), else a fresh load, sharded like the policy under FSDP2.
    use_ref = objective.beta > 0
    ref_model = None
    if use_ref and (lora is None or cfg.ref_model is not None):
        ref_model = load_model(cfg.ref_model or cfg.model, spec).eval().requires_grad_(False)
        if distributed.sharded(model):
            ref_model = distributed.wrap_model(ref_model, resolved_strategy(cfg, distributed.world()))
    # micro-batches, temperature, chunking; filler passes keep a sharded model's ranks in step
    plan = PassPlan(cfg.temperature, cfg.micro_batch_size, cfg.logits_chunk_size,
                    filler=filler_batch(tokenizer, spec.device), max_tokens=cfg.max_tokens_per_micro_batch)

    def reference_logprobs(batch: TokenBatch, step_plan: PassPlan) -> torch.Tensor:
        if ref_model is not None:
            return batch_logprobs(ref_model, batch, step_plan)
        with adapters_disabled(model):  # LoRA: never sharded
            return batch_logprobs(model, batch, step_plan)

    # Chat-template text carries its own BOS: the tokenizer must not add another (generation and training alike).
    templated = chat or not adds_special_tokens(cfg.prompt_template)
    # hf samples from the policy or, faster, from a plain copy of it (LoRA merged; bfloat16 under CPU mixed precision);
    # vLLM from its own copy. engine.sync_weights(model) after every update makes either follow the policy.
    engine = make_engine(cfg.rollout_engine, cfg.model, tokenizer, spec, model=model, batch_size=cfg.gen_batch_size,
                         add_special_tokens=not templated, copy_weights=lora is not None or spec.compute_dtype is not None,
                         copy_dtype=spec.compute_dtype)
    # --compile: decoding (with its KV cache) runs the layers eager; the loss passes run them compiled
    generating = partial(eager_layers, model) if getattr(cfg, "compile", False) else contextlib.nullcontext

    history = read_metrics(run_dir / "metrics.jsonl") if start_step else []
    totals = RunTotals.restored(parameter_count(model), history)  # samples, tokens, FLOPs so far

    def uniform(virtual_step: int) -> list[int]:  # a seeded permutation of the training prompts per epoch
        return batch_indices(virtual_step, len(prompts), cfg.prompts_per_step, cfg.seed)

    curriculum = CurriculumSampler.for_config(cfg, prompts) if cfg.curriculum == "sec" else None
    if curriculum is not None:
        curriculum.restore(history)  # a resumed run continues the bandit from its logged values
    order = curriculum if curriculum is not None else uniform
    log.info("RL (%s advantages, %s loss, %s): %d training %s, %d steps of %d prompts x %d samples on %s, %s (KL %s, beta %g; "
             "%s reward%s%s)", cfg.advantage, cfg.loss, cfg.loss_mode, len(prompts), "chat prompts" if chat else "tasks",
             total_steps, cfg.prompts_per_step, cfg.k, spec.device, spec.label, cfg.kl_mode,
             cfg.beta, reward.kind, "; group filtering" if cfg.filter_groups else "", f"; LoRA r={lora.r}" if lora else "")

    engine.sync_weights(model)  # vLLM after --resume: the checkpoint's weights
    if evaluate_on and start_step == 0 and cfg.eval_at_start:  # every rank: its shard of the held-out prompts
        with generating():
            setup.metrics.log({"step": 0, **totals.current(), **source.evaluate(engine)})

    with training_progress("rl") as progress:
        bar = progress.add_task("rl", total=total_steps, completed=start_step, info="")
        for step in range(start_step, total_steps):
            t0 = time.perf_counter()
            # 1-2. Sample, score and shape this step's groups (filtered and refilled with --filter-groups): B groups on
            # all ranks together, their (B, k) raw and shaped rewards; this rank's at positions got.local, with their batch.
            with generating():
                got = sample_step(cfg, step, prompts, order, engine, reward, tokenizer)
            fresh, drawn = got.groups, []  # the step's own groups; replayed ones come after them
            if buffer is not None:  # 2b. Replay: groups of earlier steps, shaped and filtered as fresh ones
                buffer.evict(step)
                drawn, _ = buffer.draw(cfg.replay_size, step, torch.Generator().manual_seed(replay_seed(cfg.seed, step)))
                got, drawn = with_replayed(cfg, got, drawn, prompts, tokenizer, add_special_tokens=engine.add_special_tokens)
            B, k, local = got.groups, cfg.k, got.local
            t1 = time.perf_counter()
            # 3. Log-probs before the update: reference, and the sampling policy when needed. A rank with no groups
            # has an empty batch (FSDP2: it still runs the busiest rank's number of passes, on a filler).
            batch = got.batch.to(spec.device)
            sampled = sampler_logprobs(batch, got.samples)  # (N, T) or None: what the sampler itself computed
            step_plan = plan.synced(model, batch)  # passes: None unless sharded
            ref_logprobs = reference_logprobs(batch, step_plan) if use_ref else None
            # the pre-update policy: for later epochs, the KL in the reward, or as the replayed samples' behaviour policy
            # when the engine reports no log-probs
            need_old = cfg.ppo_epochs > 1 or objective.kl_in_reward or (buffer is not None and sampled is None)
            old_logprobs = batch_logprobs(model, batch, step_plan) if need_old else None
            behaviour = None  # the ratio's denominator with objective.behaviour_ratio: the sampler's, else the trainer's
            if objective.behaviour_ratio:
                if sampled is None and old_logprobs is not None:
                    got = replace(got, samples=with_logprobs(got.samples, batch, old_logprobs))
                behaviour = sampler_logprobs(batch, got.samples)  # None only without a pass: ratio 1 at the first epoch
            # 4. KL in the reward (the RLOO paper): R_i - beta * sum_t kl_t, before the advantages (every group's).
            rewards = got.shaped
            if objective.kl_in_reward and B:
                kl_seq = sequence_kl(old_logprobs, ref_logprobs, batch.loss_mask, objective.kl_estimator)  # (len(local) * k,)
                rewards = rewards - distributed.gather_rows(objective.beta * kl_seq.view(len(local), k).cpu(), local, B)
            # 5. Advantages, per group (or over the whole batch, lite_ppo) from every rank's rewards; the loss
            # weights of this rank's rows (RAFT: its selection).
            advantages = advantage_fn(rewards) if B else torch.zeros(0, k)  # (B, k)
            if curriculum is not None:  # SEC: each bucket's value follows its (fresh) groups' mean |A|
                curriculum_metrics = curriculum.update(got.tried, group_abs_advantages(advantages[:fresh], got.kept, len(got.tried)))
            weights = objective.weights(advantages[local].flatten().to(spec.device))  # (len(local) * k,)
            # 6. Loss and update on the rows that carry gradient; the loss keeps the full step's normalisers.
            num_tokens = distributed.all_reduce_sum(float(batch.loss_mask.sum()))  # completion tokens of the whole step
            train, num_sequences, loss_tokens = batch, B * k, num_tokens
            if cfg.mask_truncated:  # truncated samples leave the loss and its normalisers (their rewards counted above)
                train, weights = without_rows(batch, weights, got.truncated[local].flatten())
                num_sequences, loss_tokens = B * k - int(got.truncated.sum()), distributed.all_reduce_sum(float(train.loss_mask.sum()))
                if B and not num_sequences and distributed.is_main():
                    log.warning("step %d: all %d samples hit --max-new-tokens %d without an EOS and --mask-truncated left every "
                                "one out of the loss: this step trains nothing", step + 1, B * k, cfg.max_new_tokens)
            if objective.is_mode != "none" and distributed.all_reduce_sum(float(sampled is None)):
                raise UsageError(f"--is-correction {objective.is_mode} needs the sampler's log-probs, which this engine does not "
                                 "report (the HF engine's row-dropping decoder and vLLM do)")
            context = LossContext(behaviour if objective.behaviour_ratio else old_logprobs, ref_logprobs, sampled,
                                  num_sequences=num_sequences, num_tokens=loss_tokens)
            rows, epoch_metrics, update_logprobs = update_policy(setup, cfg, train, weights, objective, plan, context)
            engine.sync_weights(model)  # the next rollout (and evaluation) samples from the updated policy
            update_s = time.perf_counter() - t1

            # 7. Log (sums over ranks of this rank's counts; the rewards are every rank's already).
            counts = distributed.all_reduce_sums(step_counts(train, rows, old_logprobs, ref_logprobs, update_logprobs,
                                                             objective.kl_estimator, got.generated_tokens, epochs=cfg.ppo_epochs,
                                                             no_grad_passes=(ref_logprobs is not None) + (old_logprobs is not None)))
            record: dict[str, float] = {"step": step + 1, **sample_metrics(got, counts, reward.kind),
                                        **totals.add(got.samples_tried, counts)}  # tokens, FLOPs: this step's and the run's
            if B:
                record.update({**update_metrics(got, rewards, advantages, counts, num_tokens, update_s, cfg.mask_truncated),
                               **shaping_metrics(cfg, got.lengths, got.raw, got.repeated)})
            record.update({**loss_metrics(epoch_metrics, objective), "time/generate_s": got.generate_s, "time/update_s": update_s})
            if distributed.all_reduce_sum(float(sampled is None)) == 0:  # every rank has the sampler's log-probs
                record.update(mismatch_metrics(train, rows, old_logprobs, update_logprobs, sampled,
                                               fresh_rows=fresh * k if buffer is not None else None))
            if buffer is not None:  # then keep this step's groups (with their behaviour log-probs) for later steps
                record.update(ReplayBuffer.metrics(drawn, fresh * k, step,
                                                   replay_log_ratios(train, rows, old_logprobs, update_logprobs, behaviour, fresh * k)))
                buffer.add(fresh_groups(got, fresh), step)
            if curriculum is not None:
                record.update(curriculum_metrics)
            if evaluate_on and ((step + 1) % cfg.eval_every == 0 or step + 1 == total_steps):
                t2 = time.perf_counter()
                with generating():
                    record.update(source.evaluate(engine))  # every rank: its shard of the held-out prompts
                record["time/eval_s"] = time.perf_counter() - t2
            record["time/step_s"] = time.perf_counter() - t0  # the whole step: sampling, reward, update, evaluation
            setup.metrics.log(record)
            info = f"reward {record['reward/mean']:.3f}" + (f"  kl {record['kl/mean']:.4f}" if "kl/mean" in record else "")
            if cfg.filter_groups:
                info += f"  groups {fresh}/{record['groups/tried']}"
            progress.update(bar, advance=1, info=info)
            checkpoint_if_due(setup, run_dir, step + 1, total_steps, tokenizer, cfg,
                              extra_state=(lambda: {"replay": buffer.state_dict()}) if buffer is not None else None)
    return finish_run(run_dir, model, tokenizer, cfg, tracker, "RL")
