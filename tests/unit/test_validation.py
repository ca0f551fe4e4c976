"""Option validation (rlft.validation): every command's defaults pass; types, ranges and choices are
checked (ranges as declared on the fields, or a standard option's by its exact name) for flags, YAML and
programmatic configs alike, with the option named."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import pytest

from rlft.cli import _commands
from rlft.composed import option_fields, option_hints
from rlft.validation import POSITIVE, OptionError, Range, rule_for, validate_options


@pytest.mark.parametrize("name", list(_commands()))
def test_every_command_default_is_valid_and_every_count_has_a_rule(name):
    cls = _commands()[name][0]
    cfg = cls()  # __post_init__ validates
    validate_options(cfg)
    hints, declared = option_hints(cls), option_hints(cls, include_extras=True)
    counts = [f.name for f in option_fields(cls) if hints[f.name] in (int, int | None) and "seed" not in f.name]
    assert name != "rl" or "k" in counts  # the options of a composed config (RLConfig's blocks) too
    # every integer option has a range: declared on its field, or a standard option's
    assert [n for n in counts if rule_for(n, declared[n]) is None] == []


@dataclass(frozen=True)
class Toy:
    lr: float = 1e-3
    uf_rm_head_lr: Annotated[float | None, POSITIVE] = None
    sft_steps: Annotated[int, Range(ge=1)] = 3
    rloo_k: int = 0  # no range declared, and none guessed from the suffix of its name
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
    validate_options(Toy(rloo_k=-5))  # "k" has a range, "rloo_k" none: names are never matched by suffix
    assert rule_for("rloo_k") is None and rule_for("output_dir") is None and rule_for("k") == Range(ge=1)
    assert rule_for("rloo_k", Annotated[int, Range(ge=2)]) == Range(ge=2)


@pytest.mark.parametrize("range_, inside, outside, requirement", [
    (Range(ge=1), [1, 7], [0, 0.5], "must be >= 1"),
    (Range(gt=0), [1e-9], [0, -1], "must be > 0"),
    (Range(ge=0, le=1), [0, 1], [-0.1, 1.1], "must lie in [0, 1]"),
    (Range(gt=0, le=1), [1], [0], "must lie in (0, 1]"),
    (Range(ge=0, lt=1), [0], [1], "must lie in [0, 1)"),
    (Range(ge=0, le=0.5), [0.5], [0.6], "must lie in [0, 0.5]"),
])
def test_a_declared_range_checks_its_bounds_and_says_them(range_, inside, outside, requirement):
    assert all(range_(v) for v in inside) and not any(range_(v) for v in outside)
    assert range_.requirement == requirement
