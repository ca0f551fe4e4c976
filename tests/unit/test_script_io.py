"""rlft.lab.script_io: the scripts' one rule. Outputs never an input nor an existing file without --overwrite, JSON read
naming the file, one-line errors with exit code 2; and rlft.eval.countdown.other_settings, which the scripts and
--greedy-from use to refuse a pairing of other prompts or budgets."""

from __future__ import annotations

import pytest

from rlft.eval.countdown import other_settings
from rlft import run_folder
from rlft.lab.script_io import ArgumentParser, ScriptError, check_outputs, check_picture, read_json, run_script
from rlft.run_folder import OutputPathError


def test_check_outputs_refuses_inputs_existing_files_folders_and_twins(tmp_path):
    assert check_outputs is run_folder.check_outputs  # one rule: the scripts' import is the library's function
    data = tmp_path / "pairs.jsonl"
    data.write_text("{}\n")
    for overwrite in (False, True):
        with pytest.raises(OutputPathError, match="--json .*pairs.jsonl is the input .*pairs.jsonl"):
            check_outputs({"--json": data}, [data], overwrite=overwrite)
        with pytest.raises(OutputPathError, match="is the input"):  # the same file by another spelling
            check_outputs({"--json": tmp_path / "sub" / ".." / "pairs.jsonl"}, [data], overwrite=overwrite)
    old = tmp_path / "old.json"
    old.write_text("{}")
    with pytest.raises(OutputPathError, match="old.json already exists; pass --overwrite"):
        check_outputs({"--json": old}, [data])
    assert check_outputs({"--json": old, "--plot": None}, [data], overwrite=True) == {"--json": old}
    with pytest.raises(OutputPathError, match="is a folder"):
        check_outputs({"--json": tmp_path}, [])
    with pytest.raises(OutputPathError, match="--a and --b name the same file"):
        check_outputs({"--a": tmp_path / "x", "--b": tmp_path / "x"}, [])
    assert old.read_text() == "{}" and data.read_text() == "{}\n"
    check_picture("--plot", "a/b.PNG")
    with pytest.raises(ScriptError, match="--plot study.md: name a .png, .pdf or .svg file"):
        check_picture("--plot", "study.md")


def test_read_json_names_the_file(tmp_path):
    cut = tmp_path / "eval.json"
    cut.write_text('{"task_scores": [[1.0], [0.')
    with pytest.raises(
            ValueError,
            match=r"eval.json: not JSON \(Expecting ',' delimiter at line 1 column 27\); expected an evaluation"):
        read_json(cut, "an evaluation")
    with pytest.raises(ValueError, match="missing.json: no such file"):
        read_json(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="is a folder"):
        read_json(tmp_path)
    (tmp_path / "latin.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(ValueError, match="latin.json: not UTF-8"):
        read_json(tmp_path / "latin.json")
    cut.write_text('{"a": [1, 2]}')
    assert read_json(cut) == {"a": [1, 2]}


def test_run_script_prints_one_line_and_exits_2(capsys):
    def main(argv):
        parser = ArgumentParser(prog="x.py")
        parser.add_argument("--n", type=int, required=True)
        args = parser.parse_args(argv)
        if args.n == 0:
            raise ScriptError("--n 0: nothing to do")
        if args.n == 1:
            raise FileNotFoundError(2, "No such file or directory", "data.jsonl")
        if args.n == 2:
            raise RuntimeError("a bug")
        if args.n == 4:
            raise SystemExit("variant 'x' is not a DPO variant")  # an older script's way
        if args.n == 5:
            raise SystemExit(0)

    for argv, message in ((["--n", "0"], "--n 0: nothing to do"), (["--n",
                                                                    "1"], "data.jsonl: No such file or directory"),
                          (["--n", "y"], "argument --n: invalid int value: 'y' (--help for usage)"),
                          ([], "the following arguments are required: --n"), (["--n", "4"],
                                                                              "variant 'x' is not a DPO variant")):
        with pytest.raises(SystemExit) as exit_info:
            run_script(main, argv, prog="x.py")
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith("x.py: error: ") and err.count("\n") == 1 and message in err
    with pytest.raises(RuntimeError):  # a bug is not a user error: its traceback stays
        run_script(main, ["--n", "2"], prog="x.py")
    with pytest.raises(SystemExit) as exit_info:  # an exit code passes through
        run_script(main, ["--n", "5"], prog="x.py")
    assert exit_info.value.code == 0 and capsys.readouterr().err == ""
    run_script(main, ["--n", "3"], prog="x.py")


def test_other_settings_compares_recorded_prompt_template_and_budget():
    a = {"prompt_template": "short", "max_new_tokens": 256, "model_sha256": "a"}
    assert other_settings(a, {**a, "model_sha256": "b"}) == {}  # weights are other_weights' part
    assert other_settings(a, {**a, "prompt_template": "base"}) == {"prompt_template": ("short", "base")}
    assert other_settings(a, {"prompt_template": "chat", "max_new_tokens": 1024}) == {
        "prompt_template": ("short", "chat"), "max_new_tokens": (256, 1024)}
    assert other_settings(a, {}) == {} and other_settings({}, a) == {}  # an archived file records none: not checked


def test_compare_engines_checks_its_output_before_loading_anything(tmp_path, capsys):
    """scripts/compare_engines.py (a GPU check): an existing --output is refused before vLLM or the model loads."""
    from tests.conftest import load_script

    m = load_script("compare_engines")
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        m.run_script(m.main, ["--model", str(tmp_path / "none"), "--output",
                              str(tmp_path / "report.json")], prog="compare_engines.py")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "report.json already exists; pass --overwrite" in err
