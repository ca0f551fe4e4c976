"""docs/design.md's layer table is the law: every import in src/rlft goes down (or sideways where the table allows).

The table (section 2 of docs/design.md) is read from the document itself, so the test and the design cannot drift:
each row names a layer (its first cell's number), its packages (``data/``) and modules (``types``, ``cli.py``), and,
in its last cell, what they may import: ``layer 0 only``, ``layers 0-2``, ``layer 0``, named packages or modules
(``ops``), or ``everything``. Every import counts, type-only ones included (the graph of ``test_import_graph``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tests.unit.test_import_graph import import_graph, modules

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"


@dataclass
class Row:
    layer: int
    units: list[str]
    """Top-level names under rlft: packages ('data') and modules ('types', 'cli')."""
    layers: set[int] = field(default_factory=set)
    """Layers whose units it may import."""
    names: set[str] = field(default_factory=set)
    """Further units it may import by name."""
    everything: bool = False


def _unit_name(token: str) -> str:
    return token.strip().rstrip("/").removesuffix(".py")


def parse_layer_table(text: str) -> list[Row]:
    """The rows of the markdown table under '## 2. Layers' whose first cell starts with a layer number."""
    section = text.split("## 2. Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not re.match(r"^\d+\b", cells[0]):
            continue
        row = Row(int(re.match(r"^(\d+)", cells[0]).group(1)),
                  [_unit_name(t) for t in re.findall(r"`([^`]+)`", cells[1])])
        allowed = cells[-1]
        if "everything" in allowed:
            row.everything = True
        for lo, hi in re.findall(r"layers? (\d+)(?:\s*-\s*(\d+))?", allowed):
            row.layers.update(range(int(lo), int(hi or lo) + 1))
        row.names.update(_unit_name(t) for t in re.findall(r"`([^`]+)`", allowed))
        rows.append(row)
    return rows


def unit_of(module: str) -> str:
    """``rlft.rl.config`` -> ``rl``; ``rlft.types`` -> ``types``; ``rlft`` -> ``rlft``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def violations(graph: dict[str, set[str]], rows: list[Row]) -> list[str]:
    by_unit = {u: row for row in rows for u in row.units}
    layer_of = {u: row.layer for u, row in by_unit.items()}
    found = []
    for module, targets in sorted(graph.items()):
        unit = unit_of(module)
        if unit == "rlft":
            continue  # the package's __init__: its version and nothing else
        row = by_unit.get(unit)
        if row is None:
            found.append(f"{module}: its package or module {unit!r} is in no row of docs/design.md's layer table")
            continue
        for target in sorted(targets):
            other = unit_of(target)
            if other in (unit, "rlft") or row.everything:
                continue
            if other not in layer_of:
                continue  # reported as its own module above
            if layer_of[other] > row.layer:
                found.append(f"{module} (layer {row.layer}) imports {target} (layer {layer_of[other]}, higher)")
            elif layer_of[other] not in row.layers and other not in row.names:
                found.append(f"{module} ({unit}, layer {row.layer}) imports {target}: not among what its row allows")
    return found


def test_the_parser_reads_a_table_and_the_check_finds_upward_imports():
    text = (
        "## 2. Layers\n\n| layer | modules | holds | imports from rlft |\n|---|---|---|---|\n"
        "| 0 foundation | `types`, `ops` | x | layer 0 only |\n| 1 | `losses/` | x | `ops` only |\n"
        "| 1 | `data/` | x | `types` |\n| 3 | `eval/` | x | layers 0-1 |\n| 6 | `cli.py` | x | everything |\n"
        "\n## 3. Next\n"
    )
    rows = parse_layer_table(text)
    assert [(r.layer, r.units) for r in rows] == [(0, ["types", "ops"]), (1, ["losses"]), (1, ["data"]), (3, ["eval"]),
                                                  (6, ["cli"])]
    assert rows[0].layers == {0} and rows[1].names == {"ops"} and rows[3].layers == {0, 1} and rows[4].everything
    graph = {
        "rlft.types": {"rlft.eval.x"}, "rlft.losses.pg": {"rlft.ops", "rlft.data.files"},
        "rlft.eval.x": {"rlft.losses.pg"}, "rlft.cli": {"rlft.eval.x"}, "rlft.data.files": {"rlft.types"}
    }
    assert violations(graph, rows) == [
        "rlft.losses.pg (losses, layer 1) imports rlft.data.files: not among what its row allows",
        "rlft.types (layer 0) imports rlft.eval.x (layer 3, higher)",
    ]


def test_every_module_keeps_to_its_layer():
    rows = parse_layer_table(DESIGN.read_text(encoding="utf-8"))
    assert rows, "no layer table found in docs/design.md section 2"
    assert set(modules()), "no modules found"
    found = violations(import_graph(), rows)
    assert not found, "imports against docs/design.md's layer table:\n" + "\n".join("  " + v for v in found)


def test_the_lab_sits_above_the_library_and_below_the_command_line():
    """The demo, the study pipeline, the test-look ledger and the scripts' I/O rules are the lab's (``rlft/lab/``): one
    layer above ``recipes/``, one below ``cli.py``; so a library module importing one of them is reported."""
    rows = parse_layer_table(DESIGN.read_text(encoding="utf-8"))
    layer = {u: row.layer for row in rows for u in row.units}
    assert layer["lab"] == layer["recipes"] + 1 and layer["cli"] == layer["lab"] + 1
    assert max(layer.values()) == layer["cli"]
    lab_modules = {m for m in modules() if unit_of(m) == "lab"}
    assert {"rlft.lab.demo", "rlft.lab.pipeline", "rlft.lab.ledger", "rlft.lab.script_io",
            "rlft.lab.test_looks"} <= lab_modules
    graph = {"rlft.recipes.rl": {"rlft.lab.ledger"}, "rlft.lab.demo": {"rlft.recipes.rl"}}
    assert violations(graph, rows) == ["rlft.recipes.rl (layer 5) imports rlft.lab.ledger (layer 6, higher)"]
