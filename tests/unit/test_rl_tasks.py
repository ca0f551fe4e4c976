"""rlft.rl.prompts.load_rl_tasks reads the one split definition of the Countdown commands
(``CountdownTrainingOptions.training_tasks``) and gives the tasks it gave when it called ``make_splits`` and
``load_split`` itself: compared with that code, kept here as the reference, on the default config, other presets and
sizes, a Countdown file (validation and test rows) and a file with no held-out block."""

from __future__ import annotations


import pytest

from rlft.rl.config import RLConfig, rloo_config
from rlft.rl.prompts import load_rl_tasks
from rlft.tasks.countdown.generator import PRESETS, generate_tasks, make_splits
from rlft.tasks.countdown.loaders import load_countdown
from rlft.tasks.countdown.splits import load_split

from tests.conftest import write_jsonl_rows


def reference_tasks(cfg: RLConfig):
    """``load_rl_tasks`` as it was (2026-11-27, before it read ``cfg.training_tasks``)."""
    if cfg.data is None:
        return make_splits(PRESETS[cfg.preset], cfg.num_train, cfg.heldout_size, cfg.split_seed)
    if not cfg.data_heldout:
        return load_countdown(cfg.data, split=cfg.data_split, limit=cfg.num_train), []
    split = load_split(cfg.data, data_split=cfg.data_split)
    return split.train[: cfg.num_train], split.part(cfg.eval_rows)


@pytest.mark.parametrize("cfg", [
    RLConfig(),  # the default: 2000 easy3 tasks, 200 held out, split seed 1234
    rloo_config(preset="tiny", num_train=300, heldout_size=40, split_seed=7),
    RLConfig(preset="standard", num_train=50, heldout_size=500, split_seed=0),
], ids=["default", "tiny", "standard"])
def test_generated_tasks_are_those_of_make_splits(cfg):
    train, heldout = load_rl_tasks(cfg)
    before = reference_tasks(cfg)
    assert (train, heldout) == before and len(train) == cfg.num_train and len(heldout) == cfg.heldout_size


def test_file_tasks_are_those_of_load_split(tmp_path):
    tasks = generate_tasks(PRESETS["standard"], 1600, seed=9)
    path = str(write_jsonl_rows(tmp_path / "tasks.jsonl", [{"target": t.target, "nums": list(t.nums)} for t in tasks]))
    for cfg in (RLConfig(data=path), RLConfig(data=path, num_train=100), RLConfig(data=path, eval_rows="test"),
                RLConfig(data=path, num_train=100, eval_rows="test")):
        train, heldout = load_rl_tasks(cfg)
        assert (train, heldout) == reference_tasks(cfg), cfg
        assert train and len(heldout) == 500
    assert load_rl_tasks(RLConfig(data=path))[1] != load_rl_tasks(RLConfig(data=path, eval_rows="test"))[1]
    # --no-data-heldout: the file's first num_train rows, none held out
    for cfg in (RLConfig(data=path, data_heldout=False), RLConfig(data=path, data_heldout=False, num_train=7)):
        train, heldout = load_rl_tasks(cfg)
        assert (train, heldout) == reference_tasks(cfg) and heldout == [] and len(train) == min(cfg.num_train, 1600)
