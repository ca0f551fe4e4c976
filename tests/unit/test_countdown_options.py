"""rlft.tasks.countdown.options: one Countdown options block for sft, pairs countdown, eval countdown and rl, and one
definition of the held-out split (evaluation never sees a training task)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlft.eval.countdown_command import EvalCountdownConfig, load_eval_tasks
from rlft.recipes.pairs import PairsConfig, load_pair_tasks
from rlft.recipes.sft import SFTConfig
from rlft.rl.config import RLConfig
from rlft.tasks.countdown.generator import PRESETS, make_splits, task_key
from rlft.tasks.countdown.options import (DEFAULT_NUM_TRAIN, CountdownDataOptions, CountdownOptions,
                                          CountdownTrainingOptions)
from rlft.validation import OptionError

SRC = Path(__file__).resolve().parents[2] / "src" / "rlft"
SHARED = ("data_split", "preset", "split_seed", "heldout_size", "prompt_template")


def _countdown(cls: type) -> type:
    """The class holding ``cls``'s Countdown options: ``cls`` (a sum of blocks), or its Countdown block field (a
    composed config, RLConfig)."""
    from rlft.composed import block_fields

    return next((b for b in block_fields(cls).values() if issubclass(b, CountdownOptions)), cls)


def test_the_four_configs_share_one_block_with_one_default_each():
    from rlft.composed import option_fields

    for cls in (SFTConfig, PairsConfig, EvalCountdownConfig, RLConfig):
        assert issubclass(_countdown(cls), CountdownOptions), cls
        defaults = {f.name: f.default for f in option_fields(cls)}
        assert {name: defaults[name]
                for name in SHARED} == {
                    "data_split": "train", "preset": "easy3", "split_seed": 1234, "heldout_size": 200,
                    "prompt_template": "base"
                }, cls
    for cls in (PairsConfig, EvalCountdownConfig, RLConfig):
        assert issubclass(_countdown(cls), CountdownDataOptions)
    for cls in (PairsConfig, RLConfig):
        assert issubclass(_countdown(cls), CountdownTrainingOptions)
    # the Countdown fields are declared once, in the block: no config redeclares them
    # (sft's --data-split reads any dataset)
    for cls in (PairsConfig, EvalCountdownConfig, RLConfig):
        assert not set(cls.__dict__.get("__annotations__", {})) & set(SHARED + ("data", "data_heldout")), cls
    assert SFTConfig.num_train == RLConfig().num_train == DEFAULT_NUM_TRAIN


def test_generated_tasks_is_make_splits_and_prefix_stable():
    opts = CountdownOptions(preset="easy3", split_seed=7, heldout_size=30)
    train, held = opts.generated_tasks(50)
    assert (train, held) == make_splits(PRESETS["easy3"], 50, 30, 7)
    assert not {task_key(t) for t in train} & {task_key(t) for t in held}
    # a prefix of the held-out tasks, drawn alone, is the same prefix (what eval countdown --limit reads)
    assert opts.generated_tasks(0, 10) == ([], held[:10])
    assert opts.generated_tasks(0) == ([], held)
    with pytest.raises(ValueError, match="--heldout-size is 30"):
        opts.generated_tasks(0, 31)
    with pytest.raises(ValueError, match="unknown Countdown preset"):
        CountdownOptions(preset="nope").generated_tasks(1)


def test_every_command_draws_the_same_split():
    """SFT's training tasks, pairs' prompts, rl's training and held-out tasks and eval countdown's test and train tasks
    all come from the one definition: with equal options no evaluated task is a training task."""
    common = dict(preset="easy3", split_seed=11, heldout_size=40)
    train, held = CountdownOptions(**common).generated_tasks(120)
    assert SFTConfig(**common, num_train=120).generated_tasks(120)[0] == train
    assert load_pair_tasks(PairsConfig(**common, num_prompts=30, start=50)) == train[50:80]
    assert RLConfig(**common, num_train=120).training_tasks(120) == (train, held)
    assert load_eval_tasks(EvalCountdownConfig(**common, limit=25)) == held[:25]
    assert load_eval_tasks(EvalCountdownConfig(**common, split="train", limit=120)) == train
    evaluated = {task_key(t) for t in load_eval_tasks(EvalCountdownConfig(**common, limit=None))}
    assert len(evaluated) and not evaluated & {task_key(t) for t in train}


def test_training_tasks_from_a_file(tmp_path):
    from rlft.data.files import write_jsonl
    from rlft.tasks.countdown.generator import generate_tasks
    from rlft.tasks.countdown.splits import load_split

    rows = tmp_path / "rows.jsonl"
    write_jsonl(rows,
                [{"target": t.target, "nums": list(t.nums)} for t in generate_tasks(PRESETS["standard"], 1100, seed=3)])
    split = load_split(str(rows))
    train, held = CountdownTrainingOptions(data=str(rows)).training_tasks(5, start=2, heldout="test")
    assert train == split.train[2:7] and held == split.test
    assert CountdownTrainingOptions(data=str(rows)).training_tasks(5)[1] == split.validation
    plain, none = CountdownTrainingOptions(data=str(rows), data_heldout=False).training_tasks(3, start=1)
    assert none == [] and [(t.nums, t.target) for t in plain] == [(t.nums, t.target) for t in
                                                                   generate_tasks(PRESETS["standard"], 4, seed=3)[1:4]]


@pytest.mark.parametrize("cls", [PairsConfig, RLConfig])
def test_options_that_do_nothing_without_data_are_refused(cls):
    with pytest.raises(OptionError, match="--no-data-heldout is only read with --data"):
        cls(data_heldout=False)
    with pytest.raises(OptionError, match="--data-split test is only read with --data"):
        cls(data_split="test")
    cls(data="rows.jsonl", data_heldout=False, data_split="test")  # with --data both are read


def test_eval_imports_no_rl_module():
    """eval is layer 3, rl layer 4 (docs/design.md): eval countdown's default training set size comes from tasks/."""
    for path in (SRC / "eval").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "rlft.rl" or n.startswith("rlft.rl.") for n in names), path
