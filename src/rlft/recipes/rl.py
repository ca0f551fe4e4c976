"""One RL loop for every policy-gradient recipe: sample -> reward -> advantages -> loss -> update -> log.

The options are :class:`rlft.rl.config.RLConfig`. The advantage estimator (``--advantage``,
:data:`rlft.losses.advantages.ADVANTAGES`) and the objective (``--loss`` of :data:`rlft.losses.pg.POLICY_LOSSES`,
its clip range, the KL placement, the entropy bonus: :func:`rlft.losses.pg.make_objective`) are chosen by name,
once, before the loop, as in verl and OpenRLHF; the prompt source, the reward and the rollout engine are small
objects the loop is given (:mod:`rlft.rl.prompts`, :mod:`rlft.rl.rewards`, :func:`rlft.rollout.engines.make_engine`)
and never looks inside: after every update it calls ``engine.sync_weights(model)``, whatever the engine. The start-up
(model, optimizer, resume, gradient checkpointing, ``--compile``, tracker) is the other recipes'
:func:`rlft.recipes.common.start_training`. The loop's parts live in :mod:`rlft.rl`: the records they pass
(:mod:`rlft.rl.records`), sampling (:mod:`rlft.rl.sampling`), off-policy reuse (:mod:`rlft.rl.reuse`: the replay
buffer's part of a step), the log-probs a step's loss needs (:mod:`rlft.rl.logprobs`), batches and the loss's backward
(:mod:`rlft.rl.batch`), metrics and their sums over ranks (:mod:`rlft.rl.metrics`), the in-loop evaluation
(:mod:`rlft.rl.evaluation`) and the rank helpers (:mod:`rlft.rl.ranks`); this file holds the loop and the update
(:func:`update_policy`: the PPO epochs). The whole step, written plainly for one RLOO step, is
``examples/rloo_minimal.py``. Named combinations:

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
   follow each bucket's mean |advantage| after step 5; with ``--curriculum pass-rate`` buckets drawn by the chance
   that a group of k carries signal at their estimated pass rates, :mod:`rlft.rl.pass_rate`), samples ``k``
   completions for each at ``temperature`` (seeded from seed + step), scores them with the reward (``(B, k)`` raw
   rewards) and shapes them once
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
   group is (:meth:`rlft.rl.reuse.Replay.add_replayed`); the steps below treat them alike (a replayed group's KL in
   the reward and advantages are recomputed; one whose advantages are all 0 gets no forward); after the update the
   step's fresh groups join the buffer. The loss divides by the **behaviour policy's** log-probs (fresh and replayed
   rows, from the first epoch on; also with ``--loss topr``): the sampler's own, stored with each sample, when the
   engine reports them (the HF engine's row-dropping decoders), so the ratio is exact, the sampler's precision part
   included (``mismatch/abs_logp_*`` shows its size); else the trainer's pre-update log-probs of the step that sampled
   it (one more no-grad pass), which leave that part out;
3. teacher-force the sampled sequences (prompt ids exactly as the sampler tokenized them) to get
   log-probs at the sampling temperature under the reference (when ``beta > 0``; with LoRA the
   reference is the same model with its adapters disabled) and, when needed, the pre-update policy; with the
   sampler's own and the behaviour policy's, the KL in the reward and ``--mask-truncated``'s loss rows, they form one
   record (:func:`rlft.rl.logprobs.step_logprobs`);
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
- ``curriculum/p_<bucket>``, ``curriculum/q_<bucket>``, ``curriculum/n_<bucket>`` (``--curriculum sec`` or
  ``pass-rate``): the probabilities the step's draws used, the values after its update (pass-rate: the bucket's
  estimated pass rate), the prompts drawn from each bucket; with ``pass-rate`` also ``curriculum/signal_groups``,
  ``curriculum/no_signal_uniform``, ``curriculum/no_signal_drawn``, ``curriculum/groups_saved`` and
  ``curriculum/flops_saved`` (:mod:`rlft.rl.pass_rate`: the sampling the uniform order would have spent more).
- ``eval/score``, ``eval/accuracy``, ``eval/format_rate`` (Countdown, greedy, first eval_limit held-out
  tasks) or ``eval/reward``, ``eval/truncated_frac`` (chat), every eval_every steps, at step 0 and at the end
  (:class:`rlft.rl.evaluation.InLoopEval`). With ``--eval-rows test`` each evaluation is a look at the test rows,
  told to ``train_rl``'s ``on_test_look``: ``rlft rl`` counts it in ``<output_dir>/test_looks.jsonl``
  (:func:`rlft.lab.test_looks.train_rl_counted`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from functools import partial
from pathlib import Path

import torch

from rlft import distributed
from rlft.checkpoint import read_metrics
from rlft.compute import RunTotals, parameter_count
from rlft.console import training_progress
from rlft.losses.advantages import advantage_function
from rlft.losses.pg import PolicyObjective, make_objective
from rlft.models import load_tokenizer, pick_device
from rlft.recipes.common import (batch_indices, checkpoint_if_due, claim_run_dir, finish_run, optimizer_step,
                                 save_training_checkpoint, start_training)
from rlft.recipes.memory import eager_layers
from rlft.rewards.registry import RewardFunction
from rlft.rl.batch import LossContext, PassPlan, gradient_rows, policy_loss_backward, take_rows
from rlft.rl.config import RLConfig
from rlft.rl.curriculum import CurriculumSampler
from rlft.rl.pass_rate import PassRateSampler
from rlft.rl.environments import environment_reward, environment_source, load_user_env
from rlft.rl.evaluation import InLoopEval, InLoopLookCallback
from rlft.rl.logprobs import LogprobPasses, step_logprobs
from rlft.rl.metrics import NO_UPDATE, progress_line, reduce_loss_metrics, step_record
from rlft.rl.prompts import make_prompt_source
from rlft.rl.ranks import rows_everywhere, start_ranks, zero_gradient
from rlft.rl.records import RLPrompt, StepUpdate
from rlft.rl.reuse import Replay
from rlft.rl.rewards import make_reward
from rlft.rl.sampling import PromptOrder, sample_step
from rlft.rollout.engines import make_engine
from rlft.tasks.countdown.prompts import adds_special_tokens
from rlft.types import TokenBatch
from rlft.validation import OptionError, UsageError

log = logging.getLogger("rlft")

__all__ = ["RLConfig", "train_rl", "update_policy"]


def update_policy(setup, cfg: RLConfig, batch: TokenBatch, weights: torch.Tensor, objective: PolicyObjective,
                  plan: PassPlan, context: LossContext) -> StepUpdate:
    """Step 6 of the loop: ``cfg.ppo_epochs`` optimizer steps on the rows of ``batch`` (``(N, T)``, this rank's)
    whose loss ``weights`` (``(N,)``) carry gradient (:func:`rlft.rl.batch.gradient_rows`: rows without a target
    token, e.g. those ``--mask-truncated`` left out, never do).

    ``context`` holds every row's pre-update log-probs (``old_logprobs``: used from the second epoch on, the
    first is on-policy; with :attr:`~rlft.losses.pg.PolicyObjective.behaviour_ratio`, the behaviour policy's, used
    from the first epoch on) and reference log-probs, and the whole step's normalisers, which the skipped rows keep.
    With no rows anywhere the optimizer steps on a zero gradient (AdamW still applies its momentum, as it
    would). Every optimizer step is given the step's loss (:func:`rlft.recipes.common.optimizer_step`: a NaN or
    infinite loss or gradient norm stops the run before the update). Collective under torchrun.

    Returns:
        The :class:`rlft.rl.records.StepUpdate`: the ``(M,)`` updated rows, one metrics dict per optimizer step
        (losses reduced over ranks, ``grad_norm``, ``lr``), and the first epoch's ``(M, T)`` log-probs of the
        updated rows (the sampling policy's; None when this rank updated none).
    """
    model = setup.model
    rows = gradient_rows(weights, objective, batch.loss_mask)
    sub = take_rows(batch, rows)
    rows_total = rows_everywhere(rows)
    update_plan = plan.synced(model, sub)  # passes: None unless sharded; 0: no rows anywhere
    keep_old = (cfg.ppo_epochs > 1 or objective.behaviour_ratio) and context.old_logprobs is not None
    context = LossContext(context.old_logprobs[rows] if keep_old else None,
                          context.ref_logprobs[rows] if context.ref_logprobs is not None else None,
                          context.sampler_logprobs[rows] if context.sampler_logprobs is not None else None,
                          num_sequences=context.num_sequences, num_tokens=context.num_tokens)
    epoch_metrics: list[dict[str, float]] = []
    first_logprobs = None
    for epoch in range(cfg.ppo_epochs):
        metrics = dict(NO_UPDATE)
        if len(rows) or update_plan.passes:
            metrics, logprobs = policy_loss_backward(model, sub, weights[rows], objective, update_plan, context)
            if epoch == 0:
                first_logprobs = logprobs  # the sampling policy's log-probs of the updated rows
        elif rows_total == 0:  # nothing to learn from: a zero gradient (every rank alike, so the collectives match)
            zero_gradient(model)
        metrics = reduce_loss_metrics(metrics, float(sub.loss_mask.sum()) if len(rows) else 0.0)
        loss = (metrics["loss/policy"] + objective.kl_coef * metrics["loss/kl"]
                - objective.entropy_coef * metrics["loss/entropy"])
        # the optimizer step stops the run on a non-finite loss or gradient norm
        epoch_metrics.append({**metrics, **optimizer_step(setup, cfg.max_grad_norm, loss=loss)})
    return StepUpdate(rows, epoch_metrics, first_logprobs)


# --------------------------------------------------------------------------- the loop


def train_rl(cfg: RLConfig, *, reward_fn: RewardFunction | None = None,
             on_test_look: InLoopLookCallback | None = None) -> Path:
    """Run the RL loop as configured; returns the folder of the final model (``output_dir/model``).

    ``reward_fn`` overrides the configured reward (a rule function ``(prompts, completions,
    ground_truths)``, for programmatic use and tests; see :func:`rlft.rl.rewards.make_reward`).

    Under torchrun each rank samples, scores and trains on its share of every step's groups
    (:func:`rlft.rl.sampling.sample_step`); the advantages come from every rank's rewards, the loss is divided by the
    whole step's sample and token counts, gradients are summed over ranks and metrics are sums over ranks, so given
    the same samples the update is the one-process update (up to float rounding). The samples themselves differ from
    a one-process run's (each rank draws from its own seeded stream, and generation batches other prompts together).
    Every rank evaluates its shard of the held-out prompts (:func:`rlft.rl.prompts.evaluate_sharded`); rank 0 alone
    writes files. With ``--distributed fsdp2`` (the default under torchrun without LoRA,
    :func:`rlft.options.resolved_strategy`) the policy is sharded, and so is a separate reference model (beta > 0):
    every forward and backward is collective, so every rank runs as many as the busiest one (generation:
    :class:`rlft.rollout.hf.HFEngine` with ``synced_gpus``; passes: filler micro-batches,
    :func:`rlft.rl.batch.synced_passes`); checkpoints and the final model are full state dicts gathered on rank 0.

    With ``--replay-size`` (one process only) the buffer is saved in every checkpoint and restored from it on
    ``--resume`` (:class:`rlft.rl.reuse.Replay`), so a resumed run draws the groups the uninterrupted run would have
    drawn. With ``--eval-rows test`` every in-loop evaluation is a look at the test rows, told to ``on_test_look``
    (:data:`rlft.rl.evaluation.InLoopLookCallback`; ``rlft rl`` counts it:
    :func:`rlft.lab.test_looks.train_rl_counted`).

    Raises:
        UsageError: ``--eval-rows test`` with ``--eval-every`` and no ``on_test_look`` (its looks would go uncounted),
            before anything loads.
        UsageError: ``--rollout-engine vllm`` or ``--replay-size`` under torchrun (:func:`rlft.rl.ranks.start_ranks`);
            ``--resume --replay-size`` from a checkpoint holding no buffer, or one of another k.
    """
    _require_look_recorder(cfg, on_test_look)  # --eval-rows test: every look at the test rows is counted
    start_ranks(cfg.device, cfg.rollout_engine, cfg.replay_size)  # torchrun's group; refusals before anything loads
    run = claim_run_dir(cfg)  # refuses a folder holding another run; writes nothing yet
    if cfg.beta > 0 and cfg.kl_mode == "loss" and cfg.kl_estimator == "k1":
        log.warning("--kl-mode loss with the k1 estimator: its expected gradient is zero; consider --kl-estimator k3")
    tokenizer = _tokenizer(cfg)
    # once, each from its own option block: the loop calls reward.fn; a user's --env file gives its own reward
    env = load_user_env(cfg.environment)
    reward = environment_reward(env) if env is not None else make_reward(
        cfg.scoring, reward_fn, chat_prompts=cfg.prompts_data is not None, batch_size=cfg.micro_batch_size,
        device=cfg.device, dtype=cfg.dtype)
    advantage_fn = advantage_function(cfg.policy)  # chosen by name, once
    objective = make_objective(cfg.policy, cfg.kl, cfg.importance, replay=cfg.replay_size > 0)
    torch.manual_seed(cfg.seed)
    spec = pick_device(cfg.device, cfg.dtype)
    source = (environment_source(env, cfg, tokenizer, reward) if env is not None else  # with its tools, if any
              make_prompt_source(cfg, tokenizer, reward))
    prompts = _training_prompts(cfg, source.train)  # before the model loads
    run_dir = run.open()
    # the shared start-up: model (resumed), optimizer over ppo_epochs optimizer steps per step, gradient checkpointing,
    # --compile, the tracker
    setup, tracker = start_training(cfg, run_dir, spec, cfg.max_steps * cfg.ppo_epochs)
    model, start_step = setup.model, setup.start_step
    replay = Replay.for_run(cfg, setup.trainer_state, setup.checkpoint)  # --replay-size: the buffer, as checkpointed
    passes = LogprobPasses.for_run(cfg, spec, model, objective, tokenizer)  # the reference (beta > 0), micro-batches
    engine = _engine(cfg, tokenizer, spec, model)
    # --compile: decoding (with its KV cache) runs the layers eager; the loss passes run them compiled
    generating = partial(eager_layers, model) if getattr(cfg, "compile", False) else contextlib.nullcontext
    history = read_metrics(run_dir / "metrics.jsonl") if start_step else []
    totals = RunTotals.restored(parameter_count(model), history)  # samples, tokens, FLOPs so far
    order, curriculum = _prompt_order(cfg, prompts, history, totals.params)
    evaluation = InLoopEval.for_run(cfg, source, on_test_look)  # on test rows, each evaluation is a counted look
    _log_start(cfg, len(prompts), spec, reward.kind)
    engine.sync_weights(model)  # vLLM after --resume: the checkpoint's weights
    if start_step == 0 and evaluation.due(0):  # every rank: its shard of the held-out prompts
        with generating():
            setup.metrics.log({"step": 0, **totals.current(), **evaluation.evaluate(engine, 0)})

    with training_progress("rl") as progress:
        bar = progress.add_task("rl", total=cfg.max_steps, completed=start_step, info="")
        loop_start = time.perf_counter()  # --time-limit counts from here
        for step in range(start_step, cfg.max_steps):
            spent = cfg.max_flops is not None and totals.flops >= cfg.max_flops  # the same sums on every rank
            if spent or (step > start_step and _time_is_up(loop_start, cfg.time_limit)):
                if step > start_step:  # a resumed run already at its budget stops as it is
                    reason = f"--max-flops {cfg.max_flops:.4g} reached" if spent else "--time-limit passed"
                    _stop_early(setup, run_dir, step, tokenizer, cfg, replay.checkpoint_state, reason)
                break
            t0 = time.perf_counter()
            # 1-2. Sample, score and shape this step's groups (filtered and refilled with --filter-groups): B groups on
            # all ranks together, their (B, k) raw and shaped rewards; this rank's at positions got.local, with their
            # batch. 2b. --replay-size: groups of earlier steps after them, shaped and filtered as fresh ones.
            with generating():
                got = sample_step(cfg, step, prompts, order, engine, reward, tokenizer, source.tool_use)
            got = replay.add_replayed(step, got, prompts, tokenizer, add_special_tokens=engine.add_special_tokens)
            t1 = time.perf_counter()
            # 3-4. Log-probs before the update (sampler, reference, pre-update, behaviour) and what follows from them:
            # the KL in the reward, --mask-truncated's loss rows, the whole step's normalisers.
            got, lp = step_logprobs(got, passes, step)
            # 5. Advantages, per group (or over the whole batch, lite_ppo) from every rank's rewards; SEC's bucket
            # values follow them; the loss weights of this rank's rows (RAFT: its selection).
            advantages = advantage_fn(lp.rewards) if got.groups else torch.zeros(0, cfg.k)  # (B, k)
            learned = curriculum.learn(got, advantages) if curriculum is not None else {}
            weights = objective.weights(advantages[got.local].flatten().to(spec.device))  # (len(local) * k,)
            # 6. Loss and update on the rows that carry gradient; the loss keeps the full step's normalisers.
            update = update_policy(setup, cfg, lp.train, weights, objective, passes.plan, lp.context())
            engine.sync_weights(model)  # the next rollout (and evaluation) samples from the updated policy
            update_s = time.perf_counter() - t1
            # 7. Log: one record (sums over ranks); replay's metrics, after which the fresh groups join the buffer;
            # SEC's; the evaluation when due (a counted look on test rows).
            record = {"step": step + 1, **step_record(got, lp, advantages, update, objective, totals, cfg,
                                                       reward_kind=reward.kind, update_s=update_s)}
            record.update({**replay.after_update(step, got, lp, update), **learned,
                           **evaluation.after_step(engine, step + 1, generating)})
            record["time/step_s"] = time.perf_counter() - t0  # the whole step: sampling, reward, update, evaluation
            setup.metrics.log(record)
            progress.update(bar, advance=1, info=progress_line(record, cfg.filter_groups))
            checkpoint_if_due(setup, run_dir, step + 1, cfg.max_steps, tokenizer, cfg,
                              extra_state=replay.checkpoint_state)
    return finish_run(run_dir, model, tokenizer, cfg, tracker, "RL")


def _time_is_up(loop_start: float, minutes: float | None) -> bool:
    """Whether ``--time-limit`` minutes have passed since ``loop_start`` (``time.perf_counter()``) on any rank, so
    that every rank stops after the same step. False when ``minutes`` is None."""
    if minutes is None:
        return False
    return distributed.most(int(time.perf_counter() - loop_start >= 60.0 * minutes)) > 0


def _stop_early(setup, run_dir: Path, step: int, tokenizer, cfg: RLConfig, extra_state, reason: str) -> None:
    """``--time-limit`` passed or ``--max-flops`` reached after ``step`` (1-based) of ``cfg.max_steps``: a checkpoint
    at ``step`` (unless ``--save-every`` just wrote it) so that ``--resume`` continues the run, and a line saying so."""
    if not (cfg.save_every and step % cfg.save_every == 0):
        save_training_checkpoint(setup, run_dir, step, tokenizer, keep=cfg.keep_checkpoints, config=cfg,
                                 extra_state=extra_state() if extra_state is not None else None)
    if distributed.is_main():
        log.info("%s: stopped after step %d of %d (checkpoint written; --resume continues)", reason, step,
                 cfg.max_steps)


# --------------------------------------------------------------------------- the loop's start-up


def _require_look_recorder(cfg: RLConfig, on_test_look: InLoopLookCallback | None) -> None:
    """UsageError when the run would evaluate on test rows with nobody to count the looks."""
    if cfg.eval_rows == "test" and cfg.eval_every and on_test_look is None:
        raise UsageError("--eval-rows test: every look at the test rows must be counted, and train_rl was given no "
                         "on_test_look recorder; run `rlft rl` (rlft.lab.test_looks.train_rl_counted) or pass one")


def _tokenizer(cfg: RLConfig):
    """The policy's tokenizer; with ``--chat-template`` or on the chat track, with its chat template
    (:func:`rlft.data.chat.ensure_chat_template`: None, the tokenizer's own, is required on the chat track)."""
    tokenizer = load_tokenizer(cfg.model)
    if cfg.chat_template is not None or cfg.prompts_data is not None:
        from rlft.data.chat import ensure_chat_template

        ensure_chat_template(tokenizer, cfg.chat_template)
    return tokenizer


def _training_prompts(cfg: RLConfig, prompts: list[RLPrompt]) -> list[RLPrompt]:
    """``prompts``, checked against ``--prompts-per-step`` (generated tasks are checked by RLConfig already); a warning
    when the last step of each epoch trains on fewer groups.

    Raises:
        OptionError: more prompts per step than training prompts.
    """
    if cfg.prompts_per_step > len(prompts):
        raise OptionError(f"--prompts-per-step ({cfg.prompts_per_step}) is more than the {len(prompts)} training "
                          "prompts")
    if len(prompts) % cfg.prompts_per_step:
        log.warning("%d training prompts are not a multiple of --prompts-per-step %d: the last step of each epoch "
                    "trains on %d groups", len(prompts), cfg.prompts_per_step, len(prompts) % cfg.prompts_per_step)
    return prompts


def _engine(cfg: RLConfig, tokenizer, spec, model):
    """The rollout engine: hf samples from the policy or, faster, from a plain copy of it (LoRA merged; bfloat16 under
    CPU mixed precision); vLLM from its own copy. ``engine.sync_weights(model)`` after every update makes either follow
    the policy. Chat-template text carries its own BOS: the tokenizer must not add another (generation and training
    alike)."""
    templated = cfg.prompts_data is not None or not adds_special_tokens(cfg.prompt_template)
    return make_engine(cfg.rollout_engine, cfg.model, tokenizer, spec, model=model, batch_size=cfg.gen_batch_size,
                       add_special_tokens=not templated,
                       copy_weights=cfg.lora_settings() is not None or spec.compute_dtype is not None,
                       copy_dtype=spec.compute_dtype)


CURRICULA: dict[str, type[CurriculumSampler]] = {"sec": CurriculumSampler, "pass-rate": PassRateSampler}
"""``--curriculum``'s samplers (each built by its ``for_config``)."""


def _prompt_order(cfg: RLConfig, prompts: list[RLPrompt], history: list[dict], params: int
                  ) -> tuple[PromptOrder, CurriculumSampler | None]:
    """``(order, curriculum)``: a seeded permutation of the training prompts per epoch
    (:func:`rlft.recipes.common.batch_indices`), or with ``--curriculum sec`` / ``pass-rate`` its sampler
    (:data:`CURRICULA`; ``params``, the policy's parameter count, prices its saving), continued from the logged
    ``history`` of a resumed run (then also the second value; else None)."""
    if cfg.curriculum == "none":
        return (lambda virtual_step: batch_indices(virtual_step, len(prompts), cfg.prompts_per_step, cfg.seed)), None
    curriculum = CURRICULA[cfg.curriculum].for_config(cfg, prompts, params)
    curriculum.restore(history)  # a resumed run continues the bandit from its logged values
    return curriculum, curriculum


def _log_start(cfg: RLConfig, prompts: int, spec, reward_kind: str) -> None:
    """One log line naming the run: the estimator, loss, sizes, device, KL and reward."""
    lora = cfg.lora_settings()
    log.info("RL (%s advantages, %s loss, %s): %d training %s, %d steps of %d prompts x %d samples on %s, %s "
             "(KL %s, beta %g; %s reward%s%s)", cfg.advantage, cfg.loss, cfg.loss_mode, prompts,
             "chat prompts" if cfg.prompts_data is not None else "tasks", cfg.max_steps, cfg.prompts_per_step, cfg.k,
             spec.device, spec.label, cfg.kl_mode, cfg.beta, reward_kind,
             "; group filtering" if cfg.filter_groups else "", f"; LoRA r={lora.r}" if lora else "")
