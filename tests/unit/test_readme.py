"""The README is a user's guide a newcomer can act on: at most 160 lines, the two commands on its first screen, one
demo table whose numbers are the archived demo's, and example commands that run on a fresh clone (no ../shared, no
download): each passes ``--dry-run`` in an empty folder, and every model and data it names is built in, ships with
rlft, or is written by an earlier example."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rlft.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 160
DEMO_REPORT = ROOT / "docs" / "results" / "countdown-real" / "demo" / "report.md"
NO_DRY_RUN = ("eval compare", "eval ledger")
"""Commands that read finished files and have no --dry-run."""


def readme() -> str:
    return README.read_text(encoding="utf-8")


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)


def example_commands(text: str) -> list[list[str]]:
    """The ``rlft ...`` commands of the README's bash blocks as argument lists: continuation lines joined, comments
    dropped, a ``for VAR in A B; do CMD; done`` loop unrolled."""
    commands = []
    for block in bash_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            loop = re.fullmatch(r"for (\w+) in ([^;]+); do (.+); done", line)
            bodies = [loop.group(3).replace(f"${loop.group(1)}", v) for v in loop.group(2).split()] if loop else [line]
            commands += [shlex.split(b) for b in bodies if b.startswith("rlft ")]
    return commands


def test_the_example_parser_joins_lines_and_unrolls_loops():
    text = "```bash\nrlft sft --a 1 \\\n    --b 2   # note\nmake x\nfor m in p q; do rlft eval --m runs/$m; done\n```\n"
    assert example_commands(text) == [["rlft", "sft", "--a", "1", "--b", "2"], ["rlft", "eval", "--m", "runs/p"],
                                      ["rlft", "eval", "--m", "runs/q"]]


def test_readme_is_short_and_its_first_screen_gives_both_commands():
    lines = readme().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines, more than {MAX_LINES}"
    first = lines[:15]
    for command in ("make demo", "make test"):
        assert any(line.startswith(command + " ") for line in first), f"{command!r} is not in the first 15 lines"
    assert any(line.startswith("**rlft** is ") for line in first), "the first screen does not say what rlft is"


def test_readme_needs_no_shared_folder_and_cites_no_spec():
    text = readme()
    assert "../shared" not in text and "shared/data" not in text
    assert "the spec" not in text.lower()


def test_the_demo_section_has_one_table_of_four_rows_and_states_each_cpus_time():
    text = readme()
    section = text.split("\n## The demo\n", 1)[1].split("\n## ", 1)[0]
    tables = re.findall(r"(?:^\|.*\|\n)+", section, flags=re.MULTILINE)
    assert len(tables) == 1, f"the demo section holds {len(tables)} tables"
    assert len(tables[0].splitlines()) == 2 + 4  # header, separator, four stages
    assert "37 min" in section and "avx512_bf16" in section
    assert "76 min" in section and "without AVX-512" in section and "66" in section


def test_the_demo_table_holds_the_archived_demos_numbers():
    """Each stage's mixed / 3 / 4-number score and cut share equal the archived demo report's table, and each gain
    its paired table (docs/results/countdown-real/demo/report.md)."""
    table = readme().split("<!-- demo-table -->", 1)[1].split("<!-- /demo-table -->", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.strip().splitlines()[2:]]
    report = DEMO_REPORT.read_text(encoding="utf-8")
    rows_re = r"^\| (sft|filtered|rl|dpo) \| (.*) \|$"
    scores = {m.group(1): m.group(2).split(" | ") for m in re.finditer(rows_re, report, re.M)}
    gains = dict(re.findall(r"^\| (\w+ - \w+) \| (\S+ \[\S+, \S+\])", report, re.M))
    for row, label, gain in zip(rows, ("sft", "filtered", "rl", "dpo"), (None, "filtered - sft", "rl - filtered",
                                                                          "dpo - filtered")):
        mixed, _, _, truncated, three, four, _ = scores[label]
        assert row[1].replace("*", "") == f"{mixed} / {three} / {four}", (label, row[1])
        assert row[3] == f"{round(float(truncated) * 100)}%", (label, row[3])
        assert (gain is None and row[2] == "-") or row[2].replace("*", "").startswith(gains[gain]), (label, row[2])


def test_every_example_command_runs_on_a_fresh_clone(capsys, tmp_path, monkeypatch):
    commands = example_commands(readme())
    assert len(commands) >= 6 and any(c[:2] == ["rlft", "rl"] for c in commands)
    monkeypatch.chdir(tmp_path)  # an empty folder: no ../shared, no runs/ yet
    written: list[str] = []  # the --output-dir / --output of the commands before
    for argv in commands:
        name = " ".join(argv[1:3])
        values = {flag: value for flag, value in zip(argv, argv[1:]) if flag.startswith("--")}
        for flag in ("--model", "--data", "--heldout-data", "--policy", "--reference", "--judge"):
            value = values.get(flag)
            assert value is None or value in ("countdown", "countdown-3to4") or any(
                value.startswith(out.rstrip("/") + "/") or value == out for out in written), (argv, flag, value)
        reads = [a for a in argv[3:] if a.startswith("runs/") and a not in values.values()]  # positional files
        assert all(any(a.startswith(out + "/") or a == out for out in written) for a in reads), (argv, written)
        written += [values[f] for f in ("--output-dir", "--output") if f in values]
        if name in NO_DRY_RUN:
            continue
        main([*argv[1:], "--dry-run"])
        plan = capsys.readouterr().out
        assert ": dry run" in plan, (argv, plan[:300])
        named = [line.strip() for line in plan.split("\noptions:", 1)[0].splitlines()[1:]
                 if re.match(r"\s+(model|data|heldout_data|policy|reference|judge):", line)]
        for line in named:  # built in, shipped, generated, or written by an earlier example (runs/...)
            assert ("built-in" in line or "ship with rlft" in line or "generated Countdown tasks" in line
                    or " runs/" in line), (argv, line)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", ["README.md", "docs/scale.md", "docs/results/README.md",
                                  "docs/results/countdown-pipeline.md"])
def test_relative_links_resolve(path):
    """Every relative link of the README and of the pages its text moved to names a file that exists."""
    page = ROOT / path
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
        if not re.match(r"[a-z]+://", target):
            assert (page.parent / target).exists(), f"{path}: link to {target} names no file"
