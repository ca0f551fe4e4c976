"""Option validation (rlft.validation): every command's defaults pass; types, ranges and choices are
checked by field name for flags, YAML and programmatic configs alike, with the option named."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

import pytest

from rlft.cli import _commands
from rlft.validation import OptionError, rule_for, validate_options


@pytest.mark.parametrize("name", list(_commands()))
def test_every_command_default_is_valid_and_every_count_has_a_rule(name):
    cls = _commands()[name][0]
    cfg = cls()  # __post_init__ validates
    validate_options(cfg)
    counts = [f.name for f in fields(cls) if f.type in ("int", "int | None") and "seed" not in f.name]
    assert [n for n in counts if rule_for(n) is None] == []  # every integer option has a range


@dataclass(frozen=True)
class Toy:
    lr: float = 1e-3
    uf_rm_head_lr: float | None = None
    sft_steps: int = 3
    eval_prompts: int = 0
    limit: int | None = None
    mode: Literal["a", "b"] = "a"
    names: tuple[str, ...] = ()
    flag: bool = False
    dtype: str = "auto"


@pytest.mark.parametrize("changes, message", [
    ({"lr": 0}, "--lr must be > 0, got 0"),
    ({"lr": "fast"}, "--lr: expected a number, got 'fast'"),
    ({"lr": True}, "--lr: expected a number, got True"),
    ({"lr": float("inf")}, "--lr must be a finite number, got inf"),
    ({"uf_rm_head_lr": -1.0}, "--uf-rm-head-lr must be > 0 (or unset), got -1.0"),
    ({"sft_steps": 0}, "--sft-steps must be >= 1, got 0"),
    ({"sft_steps": 2.0}, "--sft-steps: expected an integer, got 2.0"),
    ({"eval_prompts": -1}, "--eval-prompts must be >= 0, got -1"),
    ({"limit": 0}, "--limit must be >= 1 (or unset), got 0"),
    ({"mode": "c"}, "--mode: expected one of 'a', 'b', got 'c'"),
    ({"names": ["x", 1]}, "--names: expected a list of strings, got ['x', 1]"),
    ({"flag": "yes"}, "--flag: expected true or false, got 'yes'"),
    ({"dtype": "float64"}, "--dtype: expected one of 'auto', 'float32', 'bfloat16', 'float16', got 'float64'"),
])
def test_violations_name_the_option(changes, message):
    with pytest.raises(OptionError) as info:
        validate_options(Toy(**changes))
    assert str(info.value) == message


def test_valid_values_pass():
    validate_options(
        Toy(lr=1, uf_rm_head_lr=0.5, sft_steps=1, limit=5, mode="b", names=("lr", ), flag=True, dtype="bfloat16"))
    assert rule_for("rloo_k") is rule_for("k") and rule_for("dpo_batch_size") is rule_for("batch_size")
    assert rule_for("output_dir") is None
