"""Archives of a Countdown ablation (``scripts/countdown_ablation.py``): the flat ``<variant>_s<seed>_<file>`` files a
study keeps in ``docs/results/<study>/data/``, laid back out as the runner's folders so that ``ablation_report.py
report`` and its plots can be rebuilt from them (``ablation_report.py unpack``)."""

from __future__ import annotations

import re
from pathlib import Path

ARCHIVED = re.compile(
    r"^(?P<name>.+?)_s(?P<seed>\d+)_(?P<file>eval_.+\.json|metrics\.jsonl|pairs_stats\.json|train_time\.json)$")
"""An archived run file, ``<variant>_s<seed>_<file>`` (docs/results/countdown-bounded/data)."""
UNPACKED_AS = {"metrics.jsonl": "run/metrics.jsonl", "pairs_stats.json": "pairs.stats.json"}
"""Where an archived file goes inside ``<variant>/s<seed>/`` when its run folder names it differently."""


def unpack_archive(variants: dict, archive: Path, out: Path) -> int:
    """Copy an archive's run files into the ``out/<variant>/s<seed>/`` layout that ``report`` and the plots read:
    ``eval_*.json`` and ``train_time.json`` as they are, ``metrics.jsonl`` to ``run/metrics.jsonl``,
    ``pairs_stats.json`` to ``pairs.stats.json``; ``sft_start_eval_*.json`` to ``sft_start/``. Files of unknown variants
    and files already in ``out`` are left alone (never replaced); each copy is written atomically (:mod:`rlft.fsio`: a
    copy cut short is never left to be taken for the file). Returns the number of files copied."""
    from rlft.fsio import atomic_write_bytes

    copied = 0
    for path in sorted(archive.iterdir()):
        if path.name.startswith("sft_start_eval_"):
            target = out / "sft_start" / path.name.removeprefix("sft_start_")
        elif (m := ARCHIVED.match(path.name)) and m["name"] in variants:
            target = out / m["name"] / f"s{m['seed']}" / UNPACKED_AS.get(m["file"], m["file"])
        else:
            continue
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, path.read_bytes())
            copied += 1
    return copied
