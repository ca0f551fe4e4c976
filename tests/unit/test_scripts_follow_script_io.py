"""Every script under scripts/ (scripts/studies/ included) and every bench/ script that writes an ``--output`` follows
rlft.lab.script_io's rule, read from its source with ``ast``: a script imports rlft.lab.script_io, parses its options
with script_io's ArgumentParser (argparse's own prints a usage block, not one line) and runs ``run_script(main)`` (user
errors: one line, exit 2); a script that writes a file checks it first with ``check_outputs`` (never an input, never
an existing file without ``--overwrite``), and no file is written raw (``write_text``, ``open(..., "w")``,
``json.dump``, ``shutil.copy``...): writes go through rlft.fsio's atomic writes (or matplotlib's ``savefig``, after the
check). Plus behaviour checks of the scripts that took the rule on last (loop_stop_study.py has its own file)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from rlft.lab.script_io import run_script
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").rglob("*.py"))
BENCH = sorted((ROOT / "bench").glob("*.py"))
RAW_WRITES = {"write_text", "write_bytes", "dump", "copy", "copyfile", "copy2", "copytree", "move", "save", "to_csv",
              "to_parquet", "to_json"}
"""Calls that write a file in place (``Path.write_text``, ``json.dump``, ``shutil.copy*``, ``torch.save``, pandas')."""
CHECKS = {"check_outputs", "start_and_runs_args"}
"""script_io's output checks (``start_and_runs_args`` calls ``check_outputs``)."""
HELPERS_THAT_WRITE = {"ablation_archive.py": "unpack_archive copies an archive's files, never over an existing one"}
"""Modules of scripts/ without a ``__main__`` that write, and why their callers need no output check."""


def called(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """``(name, call)`` of every call in ``tree``: ``f(...)`` -> "f", ``x.y.f(...)`` -> "f"."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            out.append((f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""), node))
    return out


def raw_writes(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """The raw file writes in ``tree``: ``("line N: name", call)`` of a RAW_WRITES call, or of an ``open`` (``open``,
    ``Path.open``, ``gzip.open``) with a writing mode (``w``, ``a``, ``x`` or ``+``; positional or ``mode=``)."""
    found = []
    for name, call in called(tree):
        if name == "open":
            modes = [a.value for a in [*call.args[:2], *(k.value for k in call.keywords if k.arg == "mode")]
                     if isinstance(a, ast.Constant) and isinstance(a.value, str) and set(a.value) <= set("rwaxbt+")]
            if writing := [m for m in modes if set(m) & set("wax+")]:
                found.append((f"line {call.lineno}: open(..., {writing[0]!r})", call))
        elif name in RAW_WRITES:
            found.append((f"line {call.lineno}: {name}", call))
    return found


def main_block(tree: ast.Module) -> ast.If | None:
    """The ``if __name__ == "__main__":`` block of a module, or None."""
    return next((node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)), None)


def writes(tree: ast.AST) -> bool:
    """Whether the module writes a file itself: rlft.fsio's atomic writes, ``savefig``, rlft.eval.report's plots, or
    another writer of bench/ (``report.write``)."""
    return any(name.startswith(("atomic_", "plot_")) or name == "savefig" or (name == "write" and "report" in
               ast.unparse(call.func)) for name, call in called(tree))


def imports_script_io(tree: ast.AST) -> set[str]:
    return {a.name for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "rlft.lab.script_io" for a in node.names}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_script_follows_script_io(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    raw = [where for where, _ in raw_writes(tree)]
    assert not raw, f"{path.name} writes raw (use rlft.fsio's atomic writes): {raw}"
    names = {name for name, _ in called(tree)}
    block = main_block(tree)
    if block is None:  # a module the scripts import
        assert not writes(tree) or path.name in HELPERS_THAT_WRITE, f"{path.name} writes: say why in HELPERS_THAT_WRITE"
        return
    assert {"run_script"} <= imports_script_io(tree), f"{path.name}: import run_script from rlft.lab.script_io"
    assert "run_script" in {name for name, _ in called(block)}, f"{path.name}: its __main__ block is run_script(main)"
    own = [c.lineno for name, c in called(tree) if name == "ArgumentParser" and "argparse." in ast.unparse(c.func)]
    assert not own, f"{path.name}: argparse.ArgumentParser at line(s) {own}; use rlft.lab.script_io's"
    if writes(tree):
        assert names & CHECKS, f"{path.name} writes files but never calls check_outputs"


@pytest.mark.parametrize("path", [p for p in BENCH if "add_argument(\"--output\"" in p.read_text(encoding="utf-8")],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_bench_script_with_an_output_checks_it(path):
    """A bench script that writes ``--output`` checks it before the measurement and writes it atomically; its scratch
    files (a temporary folder's) are its own business."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert "check_outputs" in {name for name, _ in called(tree)}, f"{path.name}: check --output with check_outputs"
    raw = [where for where, call in raw_writes(tree) if "output" in ast.unparse(call)]
    assert not raw, f"{path.name} writes --output raw: {raw}"
    block = main_block(tree)
    assert block is not None and "run_script" in {name for name, _ in called(block)}, path.name


def test_the_scan_finds_what_it_forbids():
    """The checks above can fail: the scanner flags each kind of raw write, and a parser of argparse's own."""
    source = ('import json, shutil\nfrom pathlib import Path\nPath("a").write_text("x")\nopen("b", "w")\n'
              'Path("c").open("a")\njson.dump({}, f)\nshutil.copyfile("d", "e")\nopen("f")\nPath("g").read_text()\n'
              'gzip.open("h", mode="rt")\ngzip.open("i", "wt")\n')
    assert [where for where, _ in raw_writes(ast.parse(source))] == [
        "line 3: write_text", "line 4: open(..., 'w')", "line 5: open(..., 'a')", "line 6: dump", "line 7: copyfile",
        "line 11: open(..., 'wt')"]
    tree = ast.parse('import argparse\nfrom rlft.fsio import atomic_write_text\ndef main(argv):\n'
                     '    atomic_write_text("x", "y")\nif __name__ == "__main__":\n    main(None)\n')
    assert writes(tree) and main_block(tree) is not None and not imports_script_io(tree)


def test_unpack_never_replaces_a_file(tmp_path):
    """ablation_archive.unpack_archive (HELPERS_THAT_WRITE): a file already laid out stays as it is; the others are
    copied byte for byte."""
    archive = load_script("ablation_archive")
    src, out = tmp_path / "archive", tmp_path / "out"
    src.mkdir()
    (src / "v_s0_eval_greedy_5.json").write_text('{"new": 1}')
    (src / "v_s0_metrics.jsonl").write_text('{"step": 1}\n')
    (out / "v" / "s0").mkdir(parents=True)
    (out / "v" / "s0" / "eval_greedy_5.json").write_text('{"old": 1}')
    assert archive.unpack_archive({"v": {}}, src, out) == 1
    assert (out / "v" / "s0" / "eval_greedy_5.json").read_text() == '{"old": 1}'
    assert (out / "v" / "s0" / "run" / "metrics.jsonl").read_text() == '{"step": 1}\n'


def one_error(script, argv, capsys, prog) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run_script(script.main, argv, prog=prog)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith(f"{prog}: error: "), err
    return err


def test_plot_compute_vs_score_checks_its_picture_first(tmp_path, capsys):
    """The default --out (the study's own picture) exists: rebuilding it takes --overwrite; an archived file is never
    the picture; a name that is not a picture is refused. All before any file is read."""
    plot = load_script("plot_compute_vs_score")
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.png").write_text("archived")
    (tmp_path / "old.png").write_text("old")
    assert "is the input" in one_error(plot, ["--data", str(data), "--out", str(data / "a.png"), "--overwrite"], capsys,
                                       "p.py")
    assert "old.png already exists; pass --overwrite" in one_error(
        plot, ["--data", str(data), "--out", str(tmp_path / "old.png")], capsys, "p.py")
    assert "name a .png, .pdf or .svg file" in one_error(plot, ["--data", str(data), "--out", str(tmp_path / "x.md")],
                                                         capsys, "p.py")
    assert (data / "a.png").read_text() == "archived" and (tmp_path / "old.png").read_text() == "old"


def test_ablation_report_and_sft_curve_keep_earlier_outputs_without_overwrite(tmp_path, capsys):
    """`ablation_report.py report` (its two plots in --out) and `countdown_ablation.py sft-curve` (sft_curve.json and
    .png): an earlier file is refused before anything is read or evaluated."""
    report = load_script("ablation_report")
    (tmp_path / "paired_vs_samples.png").write_text("earlier")
    err = one_error(report, ["report", "--out", str(tmp_path)], capsys, "ablation_report.py")
    assert "paired_vs_samples.png already exists; pass --overwrite" in err
    ablation = load_script("countdown_ablation")
    (tmp_path / "sft_curve.json").write_text("[]")
    err = one_error(ablation, ["sft-curve", "--out", str(tmp_path), "--sft-run", str(tmp_path / "none")], capsys,
                    "countdown_ablation.py")
    assert "sft_curve.json already exists; pass --overwrite" in err
    assert (tmp_path / "sft_curve.json").read_text() == "[]"


def test_reuse_report_keeps_an_earlier_plot(tmp_path, capsys):
    reuse = load_script("reuse_report")
    (tmp_path / "reuse_paired_vs_samples_validation_s0.png").write_text("earlier")
    err = one_error(reuse, ["--out", str(tmp_path)], capsys, "reuse_report.py")
    assert "reuse_paired_vs_samples_validation_s0.png already exists; pass --overwrite" in err


def test_a_bench_output_is_checked_before_the_measurement(tmp_path, capsys):
    """bench/rollout_gpu.py (no GPU needed to get this far): an existing --output is one line, exit 2, untouched."""
    bench = load_script("bench/rollout_gpu")
    (tmp_path / "r.json").write_text(json.dumps({"keep": 1}))
    err = one_error(bench, ["--output", str(tmp_path / "r.json")], capsys, "rollout_gpu.py")
    assert "r.json already exists; pass --overwrite" in err
    assert json.loads((tmp_path / "r.json").read_text()) == {"keep": 1}
