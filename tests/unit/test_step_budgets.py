"""Step counts are settled, and an absurd one refused in one line, before a run folder exists.

- ``rlft sft --max-tokens B``: :func:`rlft.recipes.sft.steps_for_tokens` finds the count in closed form (whole epochs
  by division, the last epoch walked), equal to the old batch-by-batch loop (kept here as :func:`naive_steps`) on every
  input; a count over :data:`rlft.validation.MAX_STEPS` is refused before the walk, so ``--max-tokens 10**12`` answers
  at once instead of hanging;
- ``--epochs`` (sft, dpo, rm: :func:`rlft.recipes.common.step_plan`), ``--max-steps`` (every training config) and
  ``--max-steps x --ppo-epochs`` (rl) obey the same limit;
- the refusals come before the output folder is made: after one, ``--output-dir`` does not exist.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlft.recipes.common import batch_indices, step_plan
from rlft.recipes.sft import SFTConfig, load_sft_examples, steps_for_tokens, train_sft
from rlft.rl.config import RLConfig
from rlft.validation import MAX_STEPS, OptionError

from tests.conftest import write_jsonl_rows


def naive_steps(lengths: list[int], batch_size: int, seed: int, budget: int) -> int:
    """The old ``steps_for_tokens``: one batch at a time until the batches hold ``budget`` tokens."""
    steps, tokens = 0, 0
    while tokens < budget:
        tokens += sum(lengths[i] for i in batch_indices(steps, len(lengths), batch_size, seed))
        steps += 1
    return steps


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=12).filter(lambda xs: sum(xs) > 0),
       batch_size=st.integers(1, 13), seed=st.integers(0, 10**6), epochs=st.integers(0, 6), extra=st.integers(-3, 50))
def test_closed_form_equals_the_batch_by_batch_loop(lengths, batch_size, seed, epochs, extra):
    """Budgets around whole epochs (``epochs * sum(lengths) + extra``, extra -3..50, zero and negative included)."""
    budget = epochs * sum(lengths) + extra
    expected = naive_steps(lengths, batch_size, seed, budget)
    assert steps_for_tokens(lengths, batch_size, seed, budget) == expected
    assert steps_for_tokens(lengths, batch_size, seed, budget, capped=True) == expected


def test_whole_epochs_by_hand():
    """Lengths 10..14 (60 tokens an epoch), batches of 2: 3 steps an epoch. 60,000 tokens are exactly 1,000 epochs,
    3,000 steps; one token more needs the first batch of epoch 1,000: step 3,001."""
    lengths = [10, 11, 12, 13, 14]
    assert steps_for_tokens(lengths, 2, 0, 60_000) == 3_000
    assert steps_for_tokens(lengths, 2, 0, 60_001) == 3_001
    first = sum(lengths[i] for i in batch_indices(3_000, 5, 2, 0))  # epoch 1,000's first batch
    assert steps_for_tokens(lengths, 2, 0, 60_000 + first + 1) == 3_002


def test_the_step_limit_is_exact_and_checked_before_the_walk():
    """One example of one token, batches of 1: B tokens are B steps. MAX_STEPS passes, one more is refused; 10**12
    (the old loop's hang) is refused at once, naming --max-tokens and the limit."""
    assert steps_for_tokens([1], 1, 0, MAX_STEPS, capped=True) == MAX_STEPS
    with pytest.raises(OptionError, match=f"--max-tokens {MAX_STEPS + 1} .* makes {MAX_STEPS + 1:,} optimizer steps"):
        steps_for_tokens([1], 1, 0, MAX_STEPS + 1, capped=True)
    with pytest.raises(OptionError, match=r"--max-tokens 1000000000000 \(1.67e\+10 epochs of 60 tokens\) makes "
                                          r"49,999,999,999 optimizer steps, more than the 10,000,000 .*MAX_STEPS"):
        steps_for_tokens([10, 11, 12, 13, 14], 2, 0, 10**12, capped=True)  # (10**12 - 1) // 60 epochs x 3 steps + 1


def test_step_plan_by_hand_and_its_limit():
    """20 examples in batches of 8: 3 steps an epoch; 2.5 epochs -> ceil(7.5) = 8 steps; --max-steps wins."""
    assert step_plan(20, SimpleNamespace(batch_size=8, max_steps=None, epochs=2.5)) == (3, 8)
    assert step_plan(20, SimpleNamespace(batch_size=8, max_steps=5, epochs=1.0)) == (3, 5)
    with pytest.raises(OptionError, match=r"--epochs 1e\+07 \(3 steps an epoch\) makes 3e\+07 optimizer steps"):
        step_plan(20, SimpleNamespace(batch_size=8, max_steps=None, epochs=1e7))
    with pytest.raises(OptionError, match="makes inf optimizer steps"):  # used to raise OverflowError
        step_plan(20, SimpleNamespace(batch_size=8, max_steps=None, epochs=1.5e308))


def test_max_steps_is_limited_at_parse_time():
    assert SFTConfig(max_steps=MAX_STEPS).max_steps == MAX_STEPS
    for make in (SFTConfig, RLConfig):
        with pytest.raises(OptionError, match=f"--max-steps {MAX_STEPS + 1} makes .* more than the 10,000,000"):
            make(max_steps=MAX_STEPS + 1)
    RLConfig(max_steps=10**6, ppo_epochs=10)  # 10,000,000 optimizer steps: the limit itself
    with pytest.raises(OptionError, match="--max-steps 1000000 x --ppo-epochs 11 makes 11,000,000 optimizer steps"):
        RLConfig(max_steps=10**6, ppo_epochs=11)


def test_epochs_with_a_step_count_is_refused():
    """--epochs is never read when --max-steps or --max-tokens sets the step count."""
    with pytest.raises(OptionError, match="--epochs 3 is never read: --max-steps sets the number of steps"):
        SFTConfig(max_steps=10, epochs=3.0)
    with pytest.raises(OptionError, match="--epochs 0.5 is never read: --max-tokens sets the number of steps"):
        SFTConfig(max_tokens=1000, epochs=0.5)
    SFTConfig(max_steps=10, epochs=1.0)  # the default: not set
    SFTConfig(epochs=3.0)


# --------------------------------------------------------------------------- no folder before the refusal


def sft_cfg(model_dir: Path, output_dir: Path, **overrides) -> SFTConfig:
    cfg = SFTConfig(model=str(model_dir), data="countdown", preset="tiny", num_train=32, prompt_template="short",
                    output_dir=str(output_dir), max_length=96, batch_size=8, micro_batch_size=8, max_steps=None,
                    device="cpu", dtype="float32")
    return replace(cfg, **overrides)


def test_sft_max_tokens_beyond_reach_is_refused_before_the_folder(tiny_model_dir, tmp_path, smol_tokenizer,
                                                                  monkeypatch):
    """32 tasks in batches of 8: 4 steps an epoch. Two epochs' tokens and one more need 9 steps: over a limit lowered
    to 8, refused (the lower bound 2 x 4 + 1, before the walk) with no folder made."""
    cfg = sft_cfg(tiny_model_dir, tmp_path / "run")
    epoch_tokens = sum(len(e.input_ids) for e in load_sft_examples(cfg, smol_tokenizer)[0])
    monkeypatch.setattr("rlft.validation.MAX_STEPS", 8)
    train = replace(cfg, max_tokens=2 * epoch_tokens + 1)
    refused = f"--max-tokens {2 * epoch_tokens + 1} .* makes 9 optimizer steps, more than the 8 "
    with pytest.raises(OptionError, match=refused):
        train_sft(train)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("epochs", [1.5e308, 2.0])  # 2.0: over a lowered limit; 1.5e308 x 4: inf
def test_sft_epochs_beyond_reach_is_refused_before_the_folder(tiny_model_dir, tmp_path, monkeypatch, epochs):
    monkeypatch.setattr("rlft.validation.MAX_STEPS", 7)  # 32 tasks in batches of 8: 2 epochs are 8 steps
    refused = re.escape(f"--epochs {epochs:g} (4 steps an epoch) makes ") + ".* more than the 7 "
    with pytest.raises(OptionError, match=refused):
        train_sft(sft_cfg(tiny_model_dir, tmp_path / "run", epochs=epochs))
    assert not (tmp_path / "run").exists()


PAIRS = [{"prompt": f"Q{i}: is {i} + {i} = {2 * i}?\nA:", "chosen": " yes", "rejected": " no"} for i in range(8)]


def test_dpo_and_rm_epochs_beyond_reach_are_refused_before_the_folder(tiny_model_dir, tmp_path, monkeypatch):
    """8 pairs in batches of 4: 2 steps an epoch; 4 epochs are 8 steps, over a limit lowered to 7."""
    from rlft.recipes.dpo import train_dpo
    from rlft.recipes.dpo_config import DPOConfig
    from rlft.recipes.reward_model import RMConfig, train_rm

    data = write_jsonl_rows(tmp_path / "pairs.jsonl", PAIRS)
    monkeypatch.setattr("rlft.validation.MAX_STEPS", 7)
    common = dict(model=str(tiny_model_dir), data=str(data), max_length=64, batch_size=4, micro_batch_size=2,
                  epochs=4.0, device="cpu", dtype="float32")
    with pytest.raises(OptionError, match=r"--epochs 4 \(2 steps an epoch\) makes 8 optimizer steps, more than the 7 "):
        train_dpo(DPOConfig(**common, data_format="text", output_dir=str(tmp_path / "dpo")))
    assert not (tmp_path / "dpo").exists()
    with pytest.raises(OptionError, match=r"--epochs 4 \(2 steps an epoch\) makes 8 optimizer steps"):
        train_rm(RMConfig(**common, eval_fraction=0.0, output_dir=str(tmp_path / "rm")))
    assert not (tmp_path / "rm").exists()
