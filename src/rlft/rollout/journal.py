"""Sampling that survives being killed: prompts go to the engine in chunks, each finished chunk is appended to a
JSONL journal, and a run restarted on the same journal continues after its last written prompt.

Hours of CPU sampling (e.g. on-policy preference pairs: 1,920 prompts x 4 samples at 144 tokens) should not be
lost when the process is stopped. The journal's first line is ``{"meta": {...}}`` (what produced the samples: model,
sampling parameters, task range; the caller decides); every further line is one prompt::

    {"index": b, "prompt": str, "seconds": float,
     "samples": [{"ids": [int, ...], "text": str, "finish_reason": "stop"|"length", "looped": true?,
                  "loss_mask": [0|1, ...]?, "tool_calls": int?, "tool_errors": int?}, ...]}

(``looped`` only where the loop stop ended the sample: ``Sample.looped``.)

``seconds`` is the prompt's share of its chunk's sampling time (the journal's sum is the sampling time of all runs).
Chunk ``c`` (prompts ``c*chunk .. (c+1)*chunk``) is sampled with seed ``params.seed + 1_000_003 * c`` (``None``
stays ``None``), so a resumed run samples its remaining chunks as an uninterrupted one would.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

from rlft.data.files import DataError
from rlft.fsio import atomic_write_text
from rlft.rollout.base import GenerationEngine, Sample, SamplingParams

SEED_STRIDE = 1_000_003
CHUNK_PROMPTS = 64
"""Prompts per chunk by default: the most work a kill can lose."""
MAX_META_BYTES = 1 << 20
"""Most bytes of a journal's first line that :func:`journal_differences` reads."""


def chunk_params(params: SamplingParams, chunk: int) -> SamplingParams:
    """``params`` with the seed of chunk ``chunk`` (``seed + 1_000_003 * chunk``; None stays None)."""
    return params if params.seed is None else replace(params, seed=params.seed + SEED_STRIDE * chunk)


def read_journal(path: Path, meta: dict, prompts: list[str], k: int) -> list[list[Sample]]:
    """The samples already in the journal at ``path`` (none when it does not exist), prompt by prompt from 0.

    A last line cut short (the run was killed while writing it) is dropped and the file rewritten without it.

    Raises:
        ValueError: the journal's meta differs from ``meta`` (names the differing keys), a row's prompt is not
            ``prompts[index]``, or it has not ``k`` samples.
        DataError: a line before the last that is not JSON, or a row whose ``index`` is out of order.
    """
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows, kept = [], []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if i == len(lines) - 1:  # killed mid-write: drop the partial line
                _rewrite(path, kept)
                break
            raise DataError(str(path), i, "<line>", f"not JSON ({err})") from err
        kept.append(line)
        rows.append(row)
    if not rows:
        return []
    if rows[0].get("meta") != meta:
        old = rows[0].get("meta") or {}
        differ = sorted(key for key in set(old) | set(meta) if old.get(key) != meta.get(key))
        raise ValueError(f"{path} was written by another sampling run (differs in {', '.join(differ) or 'meta'}); "
                         "remove it, or point the output elsewhere")
    samples = []
    for i, row in enumerate(rows[1:], start=1):
        if row.get("index") != len(samples):
            raise DataError(str(path), i, "index", f"expected {len(samples)}, got {row.get('index')!r}")
        if len(samples) >= len(prompts) or row.get("prompt") != prompts[len(samples)]:
            raise ValueError(f"{path}: row {i}: its prompt is not prompt {len(samples)} of this run")
        if len(row.get("samples", [])) != k:
            raise ValueError(
                f"{path}: row {i}: field 'samples': expected {k} samples, got {len(row.get('samples', []))}")
        samples.append([Sample(s["ids"], s["text"], s["finish_reason"], looped=bool(s.get("looped", False)),
                               loss_mask=s.get("loss_mask"), tool_calls=int(s.get("tool_calls", 0)),
                               tool_errors=int(s.get("tool_errors", 0))) for s in row["samples"]])
    return samples


def _first_line(path: Path) -> bytes | None:
    """The journal's first line (at most :data:`MAX_META_BYTES`), stripped; None when there is no journal or it is
    empty."""
    if not path.is_file():
        return None
    with path.open("rb") as f:
        first = f.readline(MAX_META_BYTES).strip()
    return first or None


def _meta_of(first: bytes | None) -> dict | None:
    """The meta a journal's first line holds; None for no line or one that is no journal meta."""
    try:
        old = json.loads(first).get("meta") if first else None
    except (ValueError, AttributeError):
        old = None
    return old if isinstance(old, dict) else None


def recorded_meta(path: str | Path) -> dict | None:
    """The meta on the first line of the journal at ``path``; None when there is no journal, an empty one, or a first
    line that is no journal meta."""
    return _meta_of(_first_line(Path(path)))


def journal_differences(path: str | Path, meta: dict, chunk_prompts: int = CHUNK_PROMPTS) -> list[str] | None:
    """What a run with ``meta`` (and ``chunk_prompts``) would find in the journal at ``path`` before sampling, from its
    first line alone (at most :data:`MAX_META_BYTES` read): None when there is no journal (or an empty one), ``[]``
    when it is this run's (it will be continued), else the meta keys that differ (``["meta"]`` for a first line that
    is no journal meta). Lets a command refuse another run's journal at parse time, before loading a model."""
    first = _first_line(Path(path))
    if first is None:
        return None
    old = _meta_of(first)
    if old is None:
        return ["meta"]
    meta = {**meta, "chunk_prompts": chunk_prompts}
    return sorted(key for key in set(old) | set(meta) if old.get(key) != meta.get(key))


def _rewrite(path: Path, lines: list[str]) -> None:
    atomic_write_text(path, "".join(line + "\n" for line in lines))


def sample_with_journal(engine: GenerationEngine, prompts: list[str], params: SamplingParams, path: str | Path,
                        meta: dict, *, chunk_prompts: int = CHUNK_PROMPTS,
                        progress=None) -> tuple[list[list[Sample]], float]:
    """``engine.generate(prompts, params)``, chunk by chunk, journalled at ``path`` (see the module docstring).

    Args:
        meta: JSON-able description of the run; a journal with another meta (or chunk size) is refused, not mixed in.
        chunk_prompts: prompts per chunk (the most work a kill can lose); the journal keeps whole chunks only, so
            a chunk found cut short is sampled again whole.
        progress: called as ``progress(done, total)`` after each chunk (prompts), when given.

    Returns:
        (B lists of ``params.k`` samples, the summed sampling seconds of every run that wrote the journal).

    Raises:
        ValueError: ``chunk_prompts < 1``, or a journal that does not match (see :func:`read_journal`).
    """
    if chunk_prompts < 1:
        raise ValueError(f"chunk_prompts must be >= 1, got {chunk_prompts}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "chunk_prompts": chunk_prompts}
    done = read_journal(path, meta, prompts, params.k)
    # a chunk cut short (not the last one of the prompts) is sampled again, whole, with its own seed
    whole = len(done) if len(done) == len(prompts) else len(done) - len(done) % chunk_prompts
    lines = path.read_text().splitlines()[: whole + 1] if path.exists() else []
    if whole < len(done) or not lines:
        done = done[:whole]
        lines = lines or [json.dumps({"meta": meta})]
        _rewrite(path, lines)
    seconds = sum(json.loads(line).get("seconds", 0.0) for line in lines[1:])
    start = len(done)
    while start < len(prompts):
        chunk = start // chunk_prompts
        stop = min(len(prompts), (chunk + 1) * chunk_prompts)
        t0 = time.perf_counter()
        out = engine.generate(prompts[start:stop], chunk_params(params, chunk))
        share = (time.perf_counter() - t0) / (stop - start)
        seconds += share * (stop - start)
        text = "".join(
            json.dumps({
                "index": b, "prompt": prompts[b], "seconds": share, "samples": [{
                    "ids": list(s.completion_ids), "text": s.text, "finish_reason": s.finish_reason,
                    **({"looped": True} if s.looped else {}),
                    **({"loss_mask": s.loss_mask, "tool_calls": s.tool_calls, "tool_errors": s.tool_errors}
                       if s.loss_mask is not None else {})
                } for s in row]
            }) + "\n" for b, row in zip(range(start, stop), out))
        with path.open("a") as f:  # one write per chunk, flushed to disk before the next chunk starts
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        done.extend(out)
        start = stop
        if progress is not None:
            progress(start, len(prompts))
    return done, seconds
