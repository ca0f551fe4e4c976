"""The command line: command list, help text for every option, --config defaults, clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlft.cli import _commands, load_config_defaults, main
from rlft.validation import OptionError


def test_help_lists_every_command(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    for name in _commands():
        assert name in out


@pytest.mark.parametrize("name", list(_commands()))
def test_every_option_has_help_text(name):
    cls = _commands()[name][0]
    result = subprocess.run([sys.executable, "-m", "rlft.cli", *name.split(), "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    import tyro

    from rlft.composed import option_fields, option_hints

    hints = option_hints(cls, include_extras=True)
    for f in option_fields(cls):  # a composed config's (RLConfig's) options: its blocks' fields
        if tyro.conf.Positional[int].__metadata__[0] in getattr(hints[f.name], "__metadata__", ()):
            continue  # a positional argument (`rlft eval compare A.json B.json`): it has no flag
        flag = "--" + f.name.replace("_", "-")
        assert flag in result.stdout, f"{flag} missing from `rlft {name} --help`"
    import ast
    import inspect

    # Every field is followed by a docstring (tyro's help text source).
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            nxt = body[i + 1] if i + 1 < len(body) else None
            assert isinstance(nxt, ast.Expr) and isinstance(
                nxt.value, ast.Constant), f"{cls.__name__}.{node.target.id} has no docstring"


def test_config_file_supplies_defaults(tmp_path):
    from rlft.recipes.sft import SFTConfig

    path = tmp_path / "c.yaml"
    path.write_text("lr: 0.001\nmax-steps: 7\npreset: tiny\n")
    cfg = load_config_defaults(SFTConfig, str(path))
    assert (cfg.lr, cfg.max_steps, cfg.preset) == (0.001, 7, "tiny")
    import tyro

    overridden = tyro.cli(SFTConfig, args=["--lr", "0.5"], default=cfg)
    assert (overridden.lr, overridden.max_steps) == (0.5, 7)


def test_config_file_unknown_key_is_an_error(tmp_path):
    from rlft.recipes.sft import SFTConfig

    path = tmp_path / "c.yaml"
    path.write_text("learning_rate: 0.1\n")
    with pytest.raises(OptionError, match=r"c\.yaml: unknown option\(s\) learning_rate; known: batch_size, "):
        load_config_defaults(SFTConfig, str(path))


def test_unknown_command_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2
    assert "unknown command" in capsys.readouterr().err


def test_missing_model_gives_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["eval", "countdown", "--model", str(tmp_path / "nope"), "--limit", "1"])
    assert e.value.code == 1
    assert "does not exist" in capsys.readouterr().err
