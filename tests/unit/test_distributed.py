"""Data-parallel training under torchrun (gloo, CPU): a 2-process run equals the 1-process run with the
same global batch (per-step metrics and final weights), for SFT, DPO and the reward model with DDP and
with FSDP2, and a 2-process SFT run stopped after a checkpoint resumes (with 2 processes or with 1, and
across strategies) to the same final weights. The RL loop with 2 processes (DDP and FSDP2) equals 1 process
given the same samples (a hashing engine stands in for generation), and the HF engine on an FSDP2-sharded
model samples what it samples unsharded, whatever each rank's number of prompts. Also the sharding helpers,
what ``--distributed auto`` resolves to, and the refusal of torchrun or FSDP2 where they are not supported.

The 2-process runs are ``python -m torch.distributed.run --nproc-per-node 2 -m rlft.cli <command> ...``
subprocesses on 127.0.0.1 and a free port (about 10 s each on 2 CPU cores)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlft import distributed
from rlft.checkpoint import read_metrics
from rlft.recipes.sft import SFTConfig, train_sft

from tests.conftest import load_weights

torch.set_num_threads(1)

SRC = Path(__file__).resolve().parents[2] / "src"
EXACT = ("step", "tokens", "epoch", "lr")
"""Metrics that must agree exactly (the others to 1e-5)."""
NOISE = 1e-4
"""DPO implicit rewards below this are rounding noise (beta x a log-ratio of a policy that has not moved)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _flags(cfg) -> list[str]:
    """``--option value`` flags reproducing ``cfg`` (fields left at their defaults are skipped)."""
    from rlft.composed import option_values  # flat option names, also of a composed config (RLConfig)

    default = type(cfg)(**{k: v for k, v in option_values(cfg).items() if k in ("model",)})
    out = []
    for name, value in option_values(cfg).items():
        if value == getattr(default, name) and name not in ("model", "output_dir"):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else f"--no-{name.replace('_', '-')}")
        elif value is None:
            out += [flag, "None"]
        else:
            out += [flag, str(value)]
    return out


def _launch(args_for_port, env: dict, timeout: int) -> subprocess.CompletedProcess:
    """Run a torchrun command line built by ``args_for_port(port)``; a launch that fails because another
    process took the just-freed port (the one race of ``_free_port``) is retried with a new port."""
    for _ in range(3):
        port = str(_free_port())
        args = args_for_port(port)
        # a process group of its own (start_new_session), so a timeout kills the workers too
        # (killing torchrun alone leaves them behind)
        with subprocess.Popen(args, env={**env, "MASTER_PORT": port}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) as proc:
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise
        done = subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)
        if done.returncode == 0 or "address already in use" not in (done.stdout + done.stderr).lower():
            return done
    return done


def torchrun(command: str, cfg, nproc: int = 2) -> subprocess.CompletedProcess:
    """Run ``rlft <command>`` with ``cfg``'s options under torchrun with ``nproc`` CPU processes (gloo)."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1",
           "MASTER_ADDR": "127.0.0.1", "CUDA_VISIBLE_DEVICES": ""}
    done = _launch(
        lambda port: [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
            str(nproc), "--master-addr", "127.0.0.1", "--master-port", port, "-m", "rlft.cli", *command.split(),
            *_flags(cfg), "--debug"
        ], env, 300)
    assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


NORM_RTOL = 1e-4
"""grad_norm tolerance (relative) of FSDP2 runs and of DDP DPO: the float32 norm of the tiny model's 1.5M-element
embedding gradient is itself ~1e-5 off the float64 norm, one way in one process and another way summed from shards
(measured at step 1: 0.9689792 and 0.9689848 for 0.9689906); DDP DPO's step-3 norm (3 pairs split 2 + 1 over the
ranks) measured 26.22074 against 26.22153 in one process, while losses and final weights agree to 1e-5."""


def assert_same_run(one: Path, two: Path, atol: float = 1e-5, norm_rtol: float | None = None) -> None:
    """Equal per-step metrics (within ``atol``; step/tokens/epoch/lr exactly, timings skipped; ``grad_norm``
    within ``norm_rtol`` relative when given) and final weights."""
    m1, m2 = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [r["step"] for r in m1] == [r["step"] for r in m2] and m1
    for r1, r2 in zip(m1, m2):
        assert set(r1) == set(r2)
        for key in r1:
            if key == "tokens_per_s":
                continue
            if key == "rewards/accuracy" and max(abs(r1["rewards/chosen"]), abs(r1["rewards/rejected"])) < NOISE:
                # policy == reference (DPO's first step): each pair's reward margin is float noise, its sign arbitrary
                continue
            if key in EXACT:
                assert r1[key] == r2[key], (key, r1, r2)
            elif key == "grad_norm" and norm_rtol is not None:
                assert r1[key] == pytest.approx(r2[key], rel=norm_rtol), (key, r1, r2)
            else:
                assert r1[key] == pytest.approx(r2[key], abs=atol, rel=atol), (key, r1, r2)
    w1, w2 = load_weights(one / "model"), load_weights(two / "model")
    assert w1.keys() == w2.keys()
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=atol, rtol=0, msg=name)


# --------------------------------------------------------------------------- helpers, one process


def test_shard_splits_a_batch_into_strided_parts():
    items = list(range(7))
    parts = [distributed.shard(items, r, 3) for r in range(3)]
    assert parts == [[0, 3, 6], [1, 4], [2, 5]]
    assert sorted(sum(parts, [])) == items
    assert distributed.shard(items[:1], 1, 2) == []


def test_one_process_helpers_are_identities(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not distributed.init() and not distributed.active()
    assert distributed.world() == 1 and distributed.rank() == 0 and distributed.is_main()
    assert distributed.shard([1, 2]) == [1, 2]
    parts = {"x": torch.arange(3.0)}
    assert distributed.gather_shards(parts, 3) is parts
    assert distributed.all_reduce_sum(3) == 3.0 and distributed.all_reduce_sums({"a": 1.0}) == {"a": 1.0}
    assert distributed.all_reduce_counted({"loss": 0.5}, 7) == ({"loss": 0.5}, 7)
    distributed.barrier()
    model = torch.nn.Linear(2, 2)
    assert distributed.wrap_model(model, "ddp") is model
    with pytest.raises(ValueError, match="fsdp"):
        distributed.wrap_model(model, "fsdp")


@pytest.mark.parametrize("requested, world, lora_r, expected", [
    ("auto", 1, 0, "ddp"),
    ("auto", 2, 0, "fsdp2"),
    ("auto", 8, 0, "fsdp2"),
    ("auto", 2, 4, "ddp"),
    ("auto", 1, 4, "ddp"),
    ("ddp", 2, 0, "ddp"),
    ("fsdp2", 1, 0, "fsdp2"),
    ("fsdp2", 2, 0, "fsdp2"),
    ("ddp", 2, 4, "ddp"),
])
def test_auto_strategy_is_fsdp2_on_many_ranks_unless_lora(requested, world, lora_r, expected):
    from rlft.options import resolved_strategy
    from rlft.recipes.rl import RLConfig

    for cfg in (SFTConfig(distributed=requested, lora_r=lora_r), RLConfig(distributed=requested, lora_r=lora_r)):
        assert resolved_strategy(cfg, world) == expected
        assert cfg.distributed == requested  # the config is never changed
    assert SFTConfig().distributed == "auto"


def test_filler_passes_run_forwards_with_a_zero_gradient(smol_tokenizer):
    # What a rank of a sharded model runs when it has fewer micro-batches than the busiest rank (here none at
    # all): forwards (and backwards) of the filler batch, with no effect on the log-probs or the gradient.
    from rlft.losses.pg import PolicyObjective
    from rlft.rl.batch import (LossContext, PassPlan, batch_logprobs, filler_batch, micro_batch_rows,
                               policy_loss_backward, rollout_batch, synced_passes)
    from tests.conftest import make_tiny_model

    model = make_tiny_model(len(smol_tokenizer))
    calls = []
    model.get_decoder().register_forward_hook(lambda *_: calls.append(1))  # sequence_logprobs runs the decoder itself
    assert [len(r) for r in micro_batch_rows(torch.ones(7), 3)] == [3, 3, 1] and micro_batch_rows(torch.ones(0),
                                                                                                  3) == []
    assert synced_passes(model, 3) is None  # not sharded: every rank runs its own micro-batches
    filler = filler_batch(smol_tokenizer, "cpu")
    assert filler.input_ids.shape == (1, 2) and filler.loss_mask.tolist() == [[0.0, 1.0]]
    empty = rollout_batch(smol_tokenizer, [], [])
    assert empty.input_ids.shape == (0, 1)
    plan = PassPlan(temperature=1.0, micro_batch_size=3)
    assert batch_logprobs(model, empty, plan).shape == (0, 1) and not calls
    assert batch_logprobs(model, empty, replace(plan, passes=2, filler=filler)).shape == (0, 1) and len(calls) == 2
    metrics, logprobs = policy_loss_backward(model, empty, torch.zeros(0), PolicyObjective(),
                                             replace(plan, passes=3, filler=filler),
                                             LossContext(num_sequences=4, num_tokens=10.0))
    assert len(calls) == 5 and logprobs.shape == (0, 1) and metrics["loss/policy"] == 0.0
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.count_nonzero(g) == 0 for g in grads)  # the backward ran, with a zero loss
    with pytest.raises(ValueError, match="fewer than"):
        batch_logprobs(model, filler, PassPlan(1.0, 1, passes=0, filler=filler))
    with pytest.raises(ValueError, match="filler batch"):
        batch_logprobs(model, empty, replace(plan, passes=1))


def test_torchrun_refused_by_recipes_without_support(monkeypatch, tmp_path):
    from rlft.run_folder import claim_run_dir
    from rlft.validation import UsageError

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match="torchrun"):
        claim_run_dir(SFTConfig(output_dir=str(tmp_path / "run")))


SUM_GRADIENTS_SCRIPT = """
import torch
from rlft import distributed

assert distributed.init("cpu")
rank = distributed.rank()
distributed._BUCKET_ELEMENTS = 5  # several buckets
params = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 4, 2, 6)]
params[0].grad = torch.full((3,), 1.0 + rank)            # on both ranks: summed
if rank == 1:
    params[1].grad = torch.arange(4.0)                   # on rank 1 only: rank 0 counts zeros
params[3].grad = torch.arange(6.0) * (rank + 1)
# params[2] has no gradient anywhere: stays None
distributed.sum_gradients(params)
assert torch.equal(params[0].grad, torch.full((3,), 3.0)), params[0].grad
assert torch.equal(params[1].grad, torch.arange(4.0)), params[1].grad
assert params[2].grad is None
assert torch.equal(params[3].grad, torch.arange(6.0) * 3), params[3].grad
assert distributed.all_reduce_sums({"a": 1.0, **({"b": 2.0} if rank else {})}) == {"a": 2.0, "b": 2.0}
assert distributed.all_reduce_counted({"loss": 0.5 + rank}, 3 + 4 * rank) == ({"loss": 2.0}, 10)
assert distributed.shard(list(range(5))) == list(range(5))[rank::2]
got = distributed.gather_shards({"x": torch.tensor(distributed.shard([0.0, 1.0, 2.0, 3.0, 4.0]))}, 5)
assert torch.equal(got["x"], torch.arange(5.0)), got
positions = [0, 3, 4] if rank == 0 else [1, 2]  # any split, e.g. the RL groups each rank kept
rows = distributed.gather_rows(torch.tensor([[10.0 * p, 1.0] for p in positions]), positions, 5)
assert torch.equal(rows, torch.tensor([[10.0 * p, 1.0] for p in range(5)])), rows
assert distributed.most(3 + 4 * rank) == 7
chunks = distributed.padded_micro_batches(list("abcde"), 2, pad=True)  # shards: a c e | b d
expected = [(["a", "c"], True), (["e"], True)] if rank == 0 else [(["b", "d"], True), (["a"], False)]
assert chunks == expected, chunks
assert distributed.padded_micro_batches(list("abcde"), 2, pad=False) == [c for c in expected if c[1]]
import sys
sys.stdout.write(f"ok {rank}\\n")  # one write per rank: the two lines never interleave
sys.stdout.flush()
torch.distributed.barrier()  # neither rank exits while the other still talks to it (gloo aborts otherwise)
torch.distributed.destroy_process_group()
"""


def test_collective_helpers_over_two_ranks(tmp_path):
    script = tmp_path / "sum_gradients.py"
    script.write_text(SUM_GRADIENTS_SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    done = _launch(
        lambda port: [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2", "--master-addr",
            "127.0.0.1", "--master-port", port,
            str(script)
        ], env, 300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "ok 0" in done.stdout and "ok 1" in done.stdout


# --------------------------------------------------------------------------- SFT


def sft_cfg(model_dir: Path, output_dir: Path, **overrides) -> SFTConfig:
    # 20 tasks, 6 per step: steps of 6, 6, 6, 2 examples; 3 per rank (micro-batches of 2 and 1), the
    # short step 1 each.
    # DDP unless a test asks for FSDP2 (the default, auto, would be FSDP2 under torchrun).
    cfg = SFTConfig(model=str(model_dir), data="countdown", preset="tiny", num_train=20, prompt_template="short",
                    output_dir=str(output_dir), max_length=96, batch_size=6, micro_batch_size=2, max_steps=5,
                    lr=3e-3, warmup_ratio=0.0, save_every=2, device="cpu", dtype="float32", distributed="ddp")
    return replace(cfg, **overrides)


@pytest.fixture(scope="module")
def sft_one(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sft-one") / "run"
    train_sft(sft_cfg(tiny_model_dir, out))
    return out


def test_sft_two_processes_equal_one(sft_one, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    torchrun("sft", sft_cfg(tiny_model_dir, out))
    assert_same_run(sft_one, out)
    assert (out / "config.yaml").is_file() and (out / "checkpoints" / "latest").is_file()


def test_sft_two_processes_equal_one_with_lora_packing_and_checkpointing(tiny_model_dir, tmp_path):
    # LoRA adapters (random init: rank 0's are broadcast), packed micro-batches, recomputed activations.
    options = {"lora_r": 4, "packing": True, "gradient_checkpointing": True, "max_steps": 3, "save_every": 0}
    train_sft(sft_cfg(tiny_model_dir, tmp_path / "one", **options))
    torchrun("sft", sft_cfg(tiny_model_dir, tmp_path / "two", **options))
    assert_same_run(tmp_path / "one", tmp_path / "two")
    assert (tmp_path / "two" / "adapter").is_dir()


def test_sft_fsdp2_two_processes_equal_one(sft_one, tiny_model_dir, tmp_path):
    # FSDP2: per-layer shards and a SUM reduce-scatter give the one-process update (the DPO and RM tests
    # below cover ranks with fewer micro-batches than others). No --distributed flag: the default, auto, is FSDP2.
    out = tmp_path / "run"
    done = torchrun("sft", sft_cfg(tiny_model_dir, out, distributed="auto"))
    assert "FSDP2: 2 decoder layers sharded over 2 ranks" in done.stdout + done.stderr
    assert_same_run(sft_one, out, norm_rtol=NORM_RTOL)
    assert (out / "checkpoints" / "latest").is_file()


def test_sft_two_processes_resume_to_the_same_weights(tiny_model_dir, tmp_path):
    # A constant rate, so that the shorter first leg (--max-steps 3, stopped after its step-2 checkpoint
    # and the final step) has the same schedule as the whole run; the resumed leg redoes step 3 on.
    # The same first leg also resumes in one process: checkpoints do not depend on the world size.
    whole, split, single = tmp_path / "whole", tmp_path / "split", tmp_path / "single"
    train_sft(sft_cfg(tiny_model_dir, whole, schedule="constant"))
    torchrun("sft", sft_cfg(tiny_model_dir, split, schedule="constant", max_steps=3))
    assert (split / "checkpoints" / "step-00000002").is_dir()
    shutil.copytree(split, single)
    torchrun("sft", sft_cfg(tiny_model_dir, split, schedule="constant", resume=True))
    assert_same_run(whole, split)
    train_sft(sft_cfg(tiny_model_dir, single, schedule="constant", resume=True, resume_override=("output_dir",)))
    assert_same_run(whole, single)


def test_sft_fsdp2_two_processes_equal_one_with_packing_checkpointing_and_chunked_head(tiny_model_dir, tmp_path):
    # What the recipe does beside model(...): packed rows through get_decoder(), the LM head in chunks,
    # recomputed layer activations (FSDP2 gathers a layer again for its recomputation).
    options = {
        "packing": True, "gradient_checkpointing": True, "logits_chunk_size": 16, "max_steps": 3, "save_every": 0,
        "distributed": "fsdp2"
    }
    train_sft(sft_cfg(tiny_model_dir, tmp_path / "one", **options))
    torchrun("sft", sft_cfg(tiny_model_dir, tmp_path / "two", **options))
    assert_same_run(tmp_path / "one", tmp_path / "two", norm_rtol=NORM_RTOL)


@pytest.mark.slow
def test_sft_fsdp2_resumes_to_the_same_weights_with_any_world_size(tiny_model_dir, tmp_path):
    # As above, under FSDP2: its checkpoints hold the gathered full weights and an optimizer state keyed by
    # parameter name; they resume under FSDP2 and in one process, and a one-process checkpoint (optimizer
    # state keyed by position) resumes under FSDP2.
    options = {"schedule": "constant", "distributed": "fsdp2"}
    whole, split, single, mixed = (tmp_path / name for name in ("whole", "split", "single", "mixed"))
    train_sft(sft_cfg(tiny_model_dir, whole, **options))
    torchrun("sft", sft_cfg(tiny_model_dir, split, max_steps=3, **options))
    state = torch.load(split / "checkpoints" / "step-00000002" / "trainer_state.pt", weights_only=False)
    assert state["optimizer_by_name"] and "model.embed_tokens.weight" in state["optimizer"]["state"]
    assert load_weights(split / "checkpoints" / "step-00000002").keys() == load_weights(whole / "model").keys()
    shutil.copytree(split, single)
    torchrun("sft", sft_cfg(tiny_model_dir, split, resume=True, **options))
    assert_same_run(whole, split, norm_rtol=NORM_RTOL)
    train_sft(sft_cfg(tiny_model_dir, single, resume=True, resume_override=("output_dir",), **options))
    assert_same_run(whole, single, norm_rtol=NORM_RTOL)
    train_sft(sft_cfg(tiny_model_dir, mixed, max_steps=3, **options))
    torchrun("sft", sft_cfg(tiny_model_dir, mixed, resume=True, **options))
    assert_same_run(whole, mixed, norm_rtol=NORM_RTOL)


def test_fsdp2_refuses_lora():
    from rlft.validation import OptionError

    with pytest.raises(OptionError, match="fsdp2 does not take LoRA"):
        SFTConfig(distributed="fsdp2", lora_r=4)


# --------------------------------------------------------------------------- DPO


@pytest.fixture(scope="module")
def dpo_inputs(tmp_path_factory, smol_tokenizer) -> tuple[Path, Path]:
    """A tiny model whose outputs depend on the context, and 11 text pairs of varied lengths."""
    from tests.conftest import make_scaled_tiny_model, save_model_dir, write_jsonl_rows

    root = tmp_path_factory.mktemp("dpo-inputs")
    model_dir = save_model_dir(root / "model", make_scaled_tiny_model(len(smol_tokenizer), seed=3), smol_tokenizer)
    rows = [{"prompt": f"Q{i}: is {i} + {i} = {2 * i}?\nA:", "chosen": " yes" + ", right" * (i % 4),
             "rejected": " no idea" + "!" * (i % 3 + 1)} for i in range(11)]
    return model_dir, write_jsonl_rows(root / "prefs.jsonl", rows)


def dpo_cfg(model_dir: Path, data: Path, output_dir: Path, **overrides):
    from rlft.recipes.dpo import DPOConfig

    # 11 pairs, 4 per step: steps of 4, 4, 3 pairs; 2 per rank (one micro-batch of 2), then 2 and 1.
    cfg = DPOConfig(model=str(model_dir), data=str(data), data_format="text", output_dir=str(output_dir), max_length=64,
                    batch_size=4, micro_batch_size=2, max_steps=4, loss_type="rpo", beta=0.5, lr=1e-2, optimizer="sgd",
                    warmup_ratio=0.0, save_every=2, device="cpu", dtype="float32", distributed="ddp")
    return replace(cfg, **overrides)


def test_dpo_two_processes_equal_one(dpo_inputs, tmp_path):
    from rlft.recipes.dpo import train_dpo

    model_dir, data = dpo_inputs
    one, two = tmp_path / "one", tmp_path / "two"
    train_dpo(dpo_cfg(model_dir, data, one))
    torchrun("dpo", dpo_cfg(model_dir, data, two))
    assert_same_run(one, two, norm_rtol=NORM_RTOL)
    ref1, ref2 = (torch.load(run / "ref_logps.pt", weights_only=True) for run in (one, two))
    assert ref1["fingerprint"] == ref2["fingerprint"]
    for key in ("chosen_sum", "rejected_sum", "chosen_mean", "rejected_mean"):  # computed in 2 shards, gathered
        torch.testing.assert_close(ref2[key], ref1[key], atol=1e-5, rtol=0)
    moved = load_weights(two / "model")
    start = load_weights(model_dir)
    assert any(not torch.equal(moved[k], start[k]) for k in start)  # training did something


def test_dpo_fsdp2_two_processes_equal_one(dpo_inputs, tmp_path):
    # One pair per micro-batch: the 3-pair step gives rank 1 one pass fewer than rank 0 (a zero-weight filler).
    from rlft.recipes.dpo import train_dpo

    model_dir, data = dpo_inputs
    one, two = tmp_path / "one", tmp_path / "two"
    train_dpo(dpo_cfg(model_dir, data, one, micro_batch_size=1, distributed="fsdp2"))
    torchrun("dpo", dpo_cfg(model_dir, data, two, micro_batch_size=1, distributed="fsdp2"))
    assert_same_run(one, two, norm_rtol=NORM_RTOL)
    moved, start = load_weights(two / "model"), load_weights(model_dir)
    assert any(not torch.equal(moved[k], start[k]) for k in start)


# --------------------------------------------------------------------------- reward model


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_rm_two_processes_equal_one(strategy, tiny_model_dir, tmp_path):
    # fsdp2: 9 pairs, so the last step's one pair leaves rank 1 only a filler pass; every rank evaluates.
    from rlft.recipes.reward_model import RMConfig, train_rm
    from tests.conftest import write_jsonl_rows

    def rows(n: int, offset: int) -> list[dict]:
        out = []
        for i in range(offset, offset + n):
            prompt = [{"role": "user", "content": f"Say something about {i}."}]
            out.append({"chosen": prompt + [{"role": "assistant", "content": "banana " * (1 + i % 3) + f"is {i}"}],
                        "rejected": prompt + [{"role": "assistant", "content": f"no {i}" + "!" * (i % 4)}],
                        "score_chosen": 8.0, "score_rejected": 2.0})
        return out

    n_train = 9 if strategy == "fsdp2" else 10
    train = write_jsonl_rows(tmp_path / "train.jsonl", rows(n_train, 0))  # 10: steps of 4, 4, 2 pairs; 9: 4, 4, 1
    test = write_jsonl_rows(tmp_path / "test.jsonl", rows(4, 100))
    cfg = RMConfig(model=str(tiny_model_dir), data=str(train), eval_data=str(test), output_dir=str(tmp_path / "one"),
                   max_length=64, batch_size=4, micro_batch_size=2, eval_batch_size=4, max_steps=4, lr=3e-3,
                   warmup_ratio=0.0, eval_every=2, save_every=2, device="cpu", dtype="float32", seed=0,
                   distributed=strategy)
    train_rm(cfg)
    torchrun("rm", replace(cfg, output_dir=str(tmp_path / "two")))
    assert_same_run(tmp_path / "one", tmp_path / "two", norm_rtol=NORM_RTOL if strategy == "fsdp2" else None)
    assert "eval/accuracy" in read_metrics(tmp_path / "two" / "metrics.jsonl")[1]
    assert (tmp_path / "two" / "eval.json").is_file()


# --------------------------------------------------------------------------- RL loop

RL_SCRIPT = """
import hashlib, json, logging, sys
from dataclasses import replace
import torch
import rlft.recipes.rl as rl
import rlft.rollout.hf
from rlft.rollout.base import Sample
from rlft.rollout.hf import HFEngine
from rlft.distributed import shutdown

torch.set_num_threads(1)
logging.basicConfig(level=logging.INFO)  # rank 0 logs what it shards (the other ranks log warnings only)
SAMPLE = len(sys.argv) > 2 and sys.argv[2] == "sample"


class HashEngine(HFEngine):
    # Samples that depend only on (prompt, sample index, the one-process seed of the call), whichever rank
    # draws them: 1-3 tokens of a small alphabet (upper and lower case first letters: varied groups).
    # With "sample": the HF engine also generates first (outputs dropped), as the loop would under FSDP2.
    def __init__(self, model, tokenizer, batch_size=32, add_special_tokens=True, **_):
        super().__init__(model, tokenizer, batch_size=batch_size, add_special_tokens=add_special_tokens)
        self.ids = [tokenizer.convert_tokens_to_ids(t) for t in ("A", "b", "C", "d", "E", "f")]

    def generate(self, prompts, params):
        if SAMPLE:
            super().generate(prompts, replace(params, max_new_tokens=min(params.max_new_tokens, 4)))
        seed = (params.seed or 0) % (1 << 40)  # drop the rank's offset (greedy evaluation: no seed)
        out = []
        for prompt in prompts:
            row = []
            for j in range(params.k):
                h = hashlib.sha256(f"{prompt}|{j}|{seed}".encode()).digest()
                ids = [self.ids[b % len(self.ids)] for b in h[: 1 + h[31] % 3]]
                row.append(Sample(ids, self.tokenizer.decode(ids), "length" if h[30] % 4 == 0 else "stop"))
            out.append(row)
        return out


rlft.rollout.hf.HFEngine = HashEngine  # what make_engine builds
rl.train_rl(rl.RLConfig(**json.loads(sys.argv[1])))
shutdown()  # as `rlft rl` ends: a barrier, then destroy (a rank that exits while the other still talks to it aborts)
"""


def run_rl_script(tmp_path: Path, options: dict, nproc: int, sample: bool = False) -> subprocess.CompletedProcess:
    """``train_rl(RLConfig(**options))`` with :data:`RL_SCRIPT`'s engine, in one process or under torchrun;
    ``sample``: the engine runs the HF engine's generation too (its samples dropped)."""
    script = tmp_path / "rl_script.py"
    script.write_text(RL_SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    config = json.dumps(options)
    extra = ["sample"] if sample else []
    if nproc == 1:
        env = {k: v for k, v in env.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
        done = subprocess.run([sys.executable, str(script), config, *extra], env=env, capture_output=True, text=True,
                              timeout=300)
    else:
        done = _launch(
            lambda port: [
                sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                str(nproc), "--master-addr", "127.0.0.1", "--master-port", port,
                str(script), config, *extra
            ], env, 300)
    assert done.returncode == 0, f"{nproc} process(es) failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def assert_same_rl_run(one: Path, two: Path, atol: float = 1e-5, norm_rtol: float | None = None) -> None:
    """:func:`assert_same_run` for RL runs: timings and throughputs skipped, the rest within ``atol`` (``grad_norm``
    within ``norm_rtol`` relative when given)."""
    m1, m2 = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [r["step"] for r in m1] == [r["step"] for r in m2] and m1
    for r1, r2 in zip(m1, m2):
        keys = {k for k in r1 if not k.startswith(("time/", "tokens_per_s/"))}
        assert keys == {k for k in r2 if not k.startswith(("time/", "tokens_per_s/"))}
        for key in keys:
            if key == "grad_norm" and norm_rtol is not None:
                assert r1[key] == pytest.approx(r2[key], rel=norm_rtol), (key, r1, r2)
            else:
                assert r1[key] == pytest.approx(r2[key], abs=atol, rel=atol), (key, r1, r2)
    w1, w2 = load_weights(one / "model"), load_weights(two / "model")
    assert w1.keys() == w2.keys()
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=atol, rtol=0, msg=name)


@pytest.mark.parametrize("options", [
    # RLOO with the KL in the reward and group filtering: the keep decision and the KL-shaped rewards need
    # every rank's groups; 5 prompts per step split 3 + 2.
    {"advantage": "rloo", "loss": "reinforce", "loss_mode": "seq_sum", "beta": 0.05, "kl_mode": "reward",
     "filter_groups": True, "max_prompt_batches": 3},
    # lite_ppo (a batch-wide std), two PPO epochs, the k3 KL in the loss, token-mean: the step's token count.
    {"advantage": "lite_ppo", "loss": "ppo", "loss_mode": "token_mean", "ppo_epochs": 2, "beta": 0.05,
     "kl_mode": "loss", "kl_estimator": "k3"},
], ids=["rloo-kl-reward-filtered", "lite-ppo-kl-loss"])
def test_rl_two_processes_equal_one_given_the_same_samples(options, tiny_model_dir, tmp_path):
    # The same samples whichever rank draws them (a hashing engine stands in for generation, whose
    # batching and random streams do differ with the world size): then metrics and weights are equal.
    base = {
        "model": str(tiny_model_dir), "reward": "uppercase_start", "preset": "tiny", "num_train": 16, "heldout_size": 8,
        "prompt_template": "short", "k": 4, "prompts_per_step": 5, "max_steps": 3, "lr": 1e-2, "optimizer": "sgd",
        "micro_batch_size": 3, "save_every": 2, "device": "cpu", "dtype": "float32", "distributed": "ddp", **options
    }
    run_rl_script(tmp_path, {**base, "output_dir": str(tmp_path / "one")}, 1)
    run_rl_script(tmp_path, {**base, "output_dir": str(tmp_path / "two")}, 2)
    assert_same_rl_run(tmp_path / "one", tmp_path / "two")
    records = read_metrics(tmp_path / "two" / "metrics.jsonl")
    assert any(r["update/rows_frac"] > 0 for r in records)
    if options.get("filter_groups"):
        assert any(r["groups/kept"] < r["groups/tried"] for r in records), records  # some groups were dropped
    moved, start = load_weights(tmp_path / "two" / "model"), load_weights(tiny_model_dir)
    assert any(not torch.equal(moved[k], start[k]) for k in start)
    assert (tmp_path / "two" / "checkpoints" / "step-00000002").is_dir()


def rl_fsdp2_options(model_dir: Path) -> dict:
    # 5 prompts per step split 3 + 2 groups (12 and 8 rows: 4 and 3 micro-batches of 3), generation batches of 4
    # rows (3 and 2 generate calls), filtered groups (further prompt batches; kept groups split unevenly), a sharded
    # reference for the KL in the reward, 2 PPO epochs, evaluation of 5 held-out tasks split 3 + 2.
    return {
        "model": str(model_dir), "reward": "uppercase_start", "preset": "tiny", "num_train": 16, "heldout_size": 8,
        "prompt_template": "short", "k": 4, "prompts_per_step": 5, "max_steps": 3, "lr": 1e-2, "optimizer": "sgd",
        "micro_batch_size": 3, "gen_batch_size": 4, "save_every": 2, "device": "cpu", "dtype": "float32",
        "advantage": "grpo", "loss": "ppo", "loss_mode": "token_mean", "ppo_epochs": 2, "beta": 0.05,
        "kl_mode": "reward", "filter_groups": True, "max_prompt_batches": 3, "eval_every": 2, "eval_limit": 5,
        "eval_max_new_tokens": 4, "distributed": "fsdp2"
    }


@pytest.mark.parametrize("max_tokens", [None, 80], ids=["rows", "token-budget"])
def test_rl_fsdp2_two_processes_equal_one_given_the_same_samples(tiny_model_dir, tmp_path, max_tokens):
    # Every forward is collective under FSDP2: generation (synced_gpus, filler generate calls), the reference
    # and pre-update log-prob passes and the update (filler micro-batches), evaluation (every rank its shard)
    # and the checkpoints (gathered). The HF engine really generates (then the hashing engine's samples are used).
    # With a token budget each rank cuts its own rows into passes by their lengths, so the ranks' counts differ.
    options = {**rl_fsdp2_options(tiny_model_dir), "max_tokens_per_micro_batch": max_tokens}
    run_rl_script(tmp_path, {**options, "output_dir": str(tmp_path / "one")}, 1, sample=True)
    done = run_rl_script(tmp_path, {**options, "output_dir": str(tmp_path / "two")}, 2, sample=True)
    assert (done.stdout +
            done.stderr).count("FSDP2: 2 decoder layers sharded over 2 ranks") == 2  # policy and reference
    assert_same_rl_run(tmp_path / "one", tmp_path / "two", norm_rtol=NORM_RTOL)
    records = read_metrics(tmp_path / "two" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3] and "eval/score" in records[0] and "eval/score" in records[2]
    assert any(r["groups/kept"] < r["groups/tried"] for r in records[1:]), records  # some groups were dropped
    moved, start = load_weights(tmp_path / "two" / "model"), load_weights(tiny_model_dir)
    assert any(not torch.equal(moved[k], start[k]) for k in start)
    assert load_weights(tmp_path / "two" / "checkpoints" / "step-00000002").keys() == start.keys()


HF_ENGINE_SCRIPT = """
import copy, sys
import torch
from rlft import distributed
from rlft.models import load_model, load_tokenizer, pick_device
from rlft.rollout.base import SamplingParams
from rlft.rollout.hf import HFEngine

torch.set_num_threads(1)
assert distributed.init("cpu")
rank = distributed.rank()
tokenizer = load_tokenizer(sys.argv[1])
model = load_model(sys.argv[1], pick_device("cpu", "float32"))
# A third of the vocabulary ends a sample: rows, and ranks, finish after different numbers of tokens.
model.generation_config.eos_token_id = list(range(0, model.config.vocab_size, 3))
full = copy.deepcopy(model)
sharded = distributed.wrap_model(model, "fsdp2")
assert distributed.sharded(sharded)
prompts = [["Count to three:", "Hello there, how are", "x"],
           ["A longer prompt than the others, with more words in it"]][rank]
lengths = set()
# rank 0: 3 prompts x 2 samples in 3 chunks of 2 rows; rank 1: 1 chunk, then 2 filler chunks; then none at all
for mine, params in ((prompts, SamplingParams(k=2, temperature=1.0, max_new_tokens=8, seed=7 + rank)),
                     (prompts if rank == 0 else [], SamplingParams(k=1, temperature=0.0, max_new_tokens=6))):
    got = HFEngine(sharded, tokenizer, batch_size=2).generate(mine, params)
    # this rank alone: no collectives; generate, the path a sharded model takes (decode's row dropping draws
    # its random numbers for fewer rows, so its samples differ from generate's under the same seed)
    want = HFEngine(full, tokenizer, batch_size=2, decoder="generate").generate(mine, params)
    pairs = [[[(s.completion_ids, s.finish_reason) for s in row] for row in out] for out in (got, want)]
    assert pairs[0] == pairs[1], (rank, pairs)
    lengths |= {len(s.completion_ids) for row in got for s in row}
assert rank == 1 or len(lengths) > 1, lengths  # rank 0's samples stopped at different lengths
sys.stdout.write(f"ok {rank}\\n")
sys.stdout.flush()
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""


def test_hf_engine_under_fsdp2_samples_as_unsharded_with_uneven_prompts(tiny_model_dir, tmp_path):
    script = tmp_path / "hf_engine.py"
    script.write_text(HF_ENGINE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    done = _launch(
        lambda port: [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2", "--master-addr",
            "127.0.0.1", "--master-port", port,
            str(script),
            str(tiny_model_dir)
        ], env, 300)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert "ok 0" in done.stdout and "ok 1" in done.stdout


def test_rl_fsdp2_refuses_lora_and_auto_takes_ddp():
    from rlft.options import resolved_strategy
    from rlft.recipes.rl import RLConfig
    from rlft.validation import OptionError

    with pytest.raises(OptionError, match="fsdp2 does not take LoRA"):
        RLConfig(distributed="fsdp2", lora_r=4)
    assert resolved_strategy(RLConfig(lora_r=4), 2) == "ddp" and resolved_strategy(RLConfig(), 2) == "fsdp2"
