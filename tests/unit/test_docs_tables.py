"""Tables a reader scans stay scannable: the results index (docs/results/README.md) has short cells, one line per
study, and the README's demo table links once per row."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_CELL = 300


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row (separator rows left out)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("|") and not re.fullmatch(r"\|[\s\-:|]+\|", line):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def long_cells(rows: list[list[str]], limit: int) -> list[str]:
    return [f"{row[0][:40]}...: {len(c)} characters" for row in rows for c in row if len(c) > limit]


def test_the_checks_catch_long_cells_and_repeated_links():
    rows = table_rows("| a | b |\n|---|---|\n| x | " + "y" * 301 + " |\n")
    assert rows == [["a", "b"], ["x", "y" * 301]] and long_cells(rows, MAX_CELL) == ["x...: 301 characters"]
    assert len(re.findall(r"\]\(", "| [a](l) | [b](l) |")) == 2


def test_the_results_index_has_short_cells_one_row_per_study():
    rows = table_rows((ROOT / "docs" / "results" / "README.md").read_text(encoding="utf-8"))
    assert len(rows) > 5
    assert not long_cells(rows, MAX_CELL), long_cells(rows, MAX_CELL)
    studies = [re.search(r"\]\(([^)]+)\)", row[0]).group(1) for row in rows[1:]]
    assert len(studies) == len(set(studies)), "a study has two rows in the results index"


def test_the_readme_demo_table_links_once_per_row():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("<!-- demo-table -->", 1)[1].split("<!-- /demo-table -->", 1)[0]
    rows = table_rows(table)[1:]
    assert rows, "no demo table between the README's demo-table markers"
    for row in rows:
        links = re.findall(r"\]\(", " | ".join(row))
        assert len(links) <= 1, f"README demo table row {row[0]!r} has {len(links)} links"
