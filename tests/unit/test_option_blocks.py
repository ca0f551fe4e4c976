"""RLConfig by composition (rlft.composed): no loss, advantage, reward or shaping function takes an RLConfig (the
factories take their own option blocks), and the saved config.yaml keeps the flat option names, so a run folder
written before the blocks became fields resumes."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import yaml

import rlft.losses
import rlft.rewards
from rlft.checkpoint import config_dict, write_run_config
from rlft.composed import option_fields
from rlft.rl.config import RLConfig
from rlft.run_folder import RunFolderError, claim_run_dir, config_differences

MODULES = sorted({m.name for m in pkgutil.walk_packages(rlft.losses.__path__, "rlft.losses.")}
                 | {m.name for m in pkgutil.walk_packages(rlft.rewards.__path__, "rlft.rewards.")}
                 | {"rlft.rl.shaping", "rlft.rl.rewards", "rlft.losses.pg", "rlft.losses.advantages"})
"""Every module of losses/ and rewards/, the shaping and the RL reward factory."""


def _functions():
    for name in MODULES:
        module = importlib.import_module(name)
        for fname, fn in vars(module).items():
            if inspect.isfunction(fn) and fn.__module__ == name:
                yield f"{name}.{fname}", fn
            elif inspect.isclass(fn) and fn.__module__ == name:
                for mname, method in vars(fn).items():
                    if inspect.isfunction(method):
                        yield f"{name}.{fname}.{mname}", method


def test_no_loss_advantage_reward_or_shaping_function_takes_a_config():
    functions = dict(_functions())
    for needed in ("rlft.losses.pg.make_objective", "rlft.losses.advantages.advantage_function",
                   "rlft.rl.rewards.make_reward", "rlft.rl.shaping.shaped_rewards", "rlft.rl.shaping.shaping_metrics"):
        assert needed in functions  # the factories and shaping are among those checked
    offenders = []
    for name, fn in functions.items():
        for parameter in inspect.signature(fn).parameters.values():
            annotation = str(parameter.annotation)
            if parameter.name in ("cfg", "config") or "RLConfig" in annotation or "Config" in annotation:
                offenders.append(f"{name}({parameter.name}: {annotation})")
    assert offenders == []
    assert "ShapingOptions" in str(inspect.signature(functions["rlft.rl.shaping.shaped_rewards"]).parameters["shaping"])
    assert "RewardOptions" in str(inspect.signature(functions["rlft.rl.rewards.make_reward"]).parameters["scoring"])


def test_the_factories_work_from_the_blocks_alone():
    from rlft.losses.advantages import advantage_function
    from rlft.losses.pg import make_objective
    from rlft.rl.rewards import make_reward
    from rlft.rl.shaping import shaped_rewards

    cfg = RLConfig(advantage="rloo", loss="ppo", clip_high=0.28, beta=0.1, kl_mode="loss", kl_estimator="k3",
                   reward="uppercase_start", truncation_penalty=-0.5)
    objective = make_objective(cfg.policy, cfg.kl, cfg.importance)
    assert (objective.clip_low, objective.clip_high, objective.kl_coef, objective.kl_estimator) == (0.2, 0.28, 0.1,
                                                                                                  "k3")
    import torch

    rewards = torch.tensor([[1.0, 0.0, 0.0]])
    assert advantage_function(cfg.policy)(rewards).tolist() == [[1.0, -0.5, -0.5]]  # leave-one-out: r - mean(others)
    assert make_reward(cfg.scoring).kind == "rule"
    truncated = torch.tensor([[0.0, 1.0, 0.0]])
    assert shaped_rewards(cfg.shaping, cfg.max_new_tokens, rewards, truncated, torch.ones(1, 3)).tolist() == [
        [1.0, -0.5, 0.0]]


# the keys of config.yaml as the flat RLConfig (inheriting its blocks) wrote them, in its order
FLAT_KEYS = """data_split preset split_seed heldout_size prompt_template data data_heldout k prompts_per_step
temperature top_p max_new_tokens stop_repeats rollout_engine gen_batch_size advantage loss loss_mode ppo_epochs
clip_low clip_high entropy_coef raft_threshold positive_weight ref_model beta kl_mode kl_estimator is_correction
is_cap replay_size max_staleness filter_groups max_prompt_batches curriculum curriculum_buckets curriculum_tau
curriculum_alpha truncation_penalty mask_truncated overlong_buffer overlong_penalty repetition_limit
repetition_penalty eval_every eval_at_start eval_limit eval_max_new_tokens eval_rows prompts_data prompts_split
prompts_limit max_prompt_tokens chat_template eval_split eval_prompts reward reward_model base_url judge_model
api_key_env judge_timeout judge_max_retries distributed compile max_tokens_per_micro_batch report_to
gradient_checkpointing logits_chunk_size lora_r lora_alpha lora_dropout lora_target_modules lr optimizer
weight_decay warmup_ratio schedule max_grad_norm device dtype save_every keep_checkpoints resume overwrite
resume_override model num_train output_dir max_steps micro_batch_size seed time_limit max_flops
env max_turns max_observation_tokens tool_timeout hint hint_fraction""".split()  # last line: --env, --hint (2026-12-06)


def test_saved_config_keeps_the_flat_names_in_their_order():
    saved = config_dict(RLConfig(k=3, beta=0.2))
    assert list(saved) == FLAT_KEYS == [f.name for f in option_fields(RLConfig)]
    assert (saved["k"], saved["beta"]) == (3, 0.2) and not any(isinstance(v, dict) for v in saved.values())


def test_a_run_folder_of_the_flat_config_resumes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg = RLConfig(output_dir=str(run), k=3, beta=0.2, lr=1e-4)
    # config.yaml as written before the blocks became fields: a flat mapping (here: the same values, written flat)
    old = {name: config_dict(cfg)[name] for name in FLAT_KEYS}
    (run / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    claim_run_dir(RLConfig(output_dir=str(run), k=3, beta=0.2, lr=1e-4, resume=True))  # same options: resumes
    assert config_differences(old, cfg) == {}
    with pytest.raises(RunFolderError, match=r"--k 3 -> 4.*--resume-override k"):
        claim_run_dir(RLConfig(output_dir=str(run), k=4, beta=0.2, lr=1e-4, resume=True))
    claim_run_dir(RLConfig(output_dir=str(run), k=4, beta=0.2, lr=1e-4, resume=True, resume_override=("k", )))
    write_run_config(run, cfg)  # and what is written now reads back flat
    assert yaml.safe_load((run / "config.yaml").read_text()) == old
