"""Offline measurement of loop-aware stopping (``SamplingParams.stop_repeats``) on archived Countdown completions.

For every archived completion text and each N, the stop is simulated (:func:`rlft.rollout.loops.loop_cut`: the
completion is cut right after the newline that completes the N-th identical non-empty line) and the cut text is
scored again with the TinyZero scorer (:func:`rlft.rewards.countdown.score_completions`). Reported per group of
completions and per N: how many would stop, the share of generated tokens saved, how many scores change, and the
mean score change with a paired 95% interval (:func:`rlft.eval.countdown.paired_difference`, one "task" per
completion).

The archived evaluation files keep per-task scores, truncation flags and token counts, but the text of only their
first 3 tasks' first sample (``examples``); the pair files (``rlft pairs countdown``) keep both texts of every pair
they kept. Groups (``docs/results/``):

- ``rl``: the ``examples`` of the RL models' evaluation files (real_grpo seeds 0 and 1, and real_grpo retrained on
  the rebuilt start), with each example's recorded tokens, truncation and score;
- ``sft``: the same for the SFT models (the real SFT start, real_sft_correct, the rebuilt start, sft_continued);
- ``sft_start_pairs``: the chosen and rejected completions of ``countdown-real/data/dpo_s{0,1}_pairs.jsonl``
  (the real SFT start at T=1, 256 tokens, on training tasks; pairs with unequal scores only);
- ``bounded_pairs``: the same for ``countdown-bounded/data/pairs_*.jsonl`` (the ``bounded`` SFT start and its DPO
  rounds on ``medium3`` tasks, 144 tokens).

Duplicate (prompt, completion) texts are counted once. Token counts are the recorded ones where the file has them,
else the SmolLM2 tokenizer's count of the text (+1 for the EOS of a finished completion).

    python scripts/studies/loop_stop_study.py                   # prints the tables (markdown)
    python scripts/studies/loop_stop_study.py --output rows.json  # and every row as JSON (a new file; --overwrite)

The files are read from ``--results`` (default ``docs/results``). ``--output`` is checked before anything is read
(:func:`rlft.lab.script_io.check_outputs`: never one of the files read, never an existing file without
``--overwrite``) and written atomically; a bad option or an unreadable input file is one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

from rlft.eval.countdown import paired_difference, read_eval_json
from rlft.eval.stats import format_difference
from rlft.fsio import atomic_write_text
from rlft.rewards.countdown import score_completions
from rlft.rollout.loops import loop_cut
from rlft.lab.script_io import ArgumentParser, check_outputs, fail, run_script

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
RL_FILE = re.compile(r"^rl_")
SFT_FILE = re.compile(r"^(sft_start|sft_correct|sft_rebuilt|sft_continued)_")
QUERY = re.compile(r"Using the numbers \[([\d, ]+)\], create an equation that equals (\d+)")


@dataclass
class Completion:
    group: str
    prompt: str
    text: str
    nums: list[int]
    target: int
    score: float
    finished: bool
    """An EOS was generated (finish_reason "stop", not truncated)."""
    tokens: int | None
    """Generated tokens as recorded (EOS included), or None."""


def ground_truth(c: Completion) -> dict:
    return {"target": c.target, "numbers": list(c.nums)}


def input_files(results: Path) -> dict[str, list[Path]]:
    """The files read under ``results`` (``docs/results``): ``eval`` (the RL and SFT evaluation files of countdown-real
    and test-time), ``sft_start_pairs`` and ``bounded_pairs`` (the pair files), each sorted by name."""
    evals = [path for folder in (results / "countdown-real" / "data", results / "test-time" / "data")
             for path in sorted([*folder.glob("*_eval_*.json"), *folder.glob("*_eval_*.json.gz")])
             if RL_FILE.match(path.name) or SFT_FILE.match(path.name)]
    return {"eval": evals, "sft_start_pairs": sorted((results / "countdown-real" / "data").glob("dpo_s*_pairs.jsonl")),
            "bounded_pairs": sorted((results / "countdown-bounded" / "data").glob("pairs_*.jsonl"))}


def eval_examples(paths: list[Path]) -> list[Completion]:
    """The ``examples`` of the RL and SFT evaluation files ``paths``, with their recorded tokens, truncation and score.
    ScriptError naming the file when one lacks a field."""
    out = []
    for path in paths:
        group = "rl" if RL_FILE.match(path.name) else "sft"
        data, t = read_eval_json(path), 0
        try:
            for t, ex in enumerate(data.get("examples", [])):
                trunc, tokens = data["task_truncated"][t][0], data["task_tokens"][t][0]
                out.append(Completion(group, ex["prompt_tail"], ex["completion"], ex["nums"], ex["target"],
                                      data["task_scores"][t][0], not trunc, tokens))
        except (KeyError, IndexError, TypeError) as e:
            fail(f"{path}: example {t}: {missing(e)} (not an `rlft eval countdown` file with examples?)")
    return out


def pair_completions(paths: list[Path], group: str) -> list[Completion]:
    """Both completions of every pair in the ``rlft pairs countdown`` files ``paths``. ScriptError naming the file and
    line when a line is not JSON or lacks a field."""
    out = []
    for path in paths:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                for side in ("chosen", "rejected"):
                    out.append(Completion(group, row["prompt"], row[side], row["nums"], row["target"],
                                          row[f"score_{side}"], row[f"{side}_finish_reason"] == "stop", None))
            except json.JSONDecodeError as e:
                fail(f"{path}: line {i}: not JSON ({e.msg})")
            except (KeyError, TypeError) as e:
                fail(f"{path}: line {i}: {missing(e)} (not a pairs file of `rlft pairs countdown`?)")
    return out


def missing(error: Exception) -> str:
    """What a record lacks: ``no field 'x'`` for a KeyError, else the error's message."""
    return f"no field {error}" if isinstance(error, KeyError) else f"malformed ({error})"


def unique(completions: list[Completion]) -> list[Completion]:
    seen, out = set(), []
    for c in completions:
        key = (c.group, c.prompt, c.text)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def simulate(completions: list[Completion], n: int, count_tokens) -> dict:
    """The stop at ``n`` repeats over ``completions``: counts, tokens saved, score changes and the paired interval."""
    before, after, saved, total, stopped = [], [], 0, 0, 0
    lost_correct = lost_format = stopped_finished = 0
    for c in completions:
        tokens = c.tokens if c.tokens is not None else count_tokens(c.text) + int(c.finished)
        total += tokens
        cut = loop_cut(c.text, n)
        new_score = c.score
        if cut is not None:
            stopped += 1
            stopped_finished += c.finished
            kept = min(count_tokens(c.text[:cut]), tokens)
            saved += tokens - kept
            new_score = score_completions([c.prompt], [c.text[:cut]], [ground_truth(c)])[0]
            lost_correct += c.score == 1.0 and new_score < 1.0
            lost_format += c.score == 0.1 and new_score < 0.1
        before.append([c.score])
        after.append([new_score])
    diff = paired_difference(after, before)
    return {"n": n, "completions": len(completions), "stopped": stopped, "stopped_finished": stopped_finished,
            "saved_share": saved / total if total else 0.0, "mean_tokens": total / max(len(completions), 1),
            "changed": sum(a != b for (a,), (b,) in zip(after, before)), "lost_correct": lost_correct,
            "lost_format": lost_format, "diff": diff}


def check_scores(completions: list[Completion]) -> int:
    """How many recorded scores the scorer does not reproduce on the full text (0 expected)."""
    return sum(score_completions([c.prompt], [c.text], [ground_truth(c)])[0] != c.score for c in completions)


def parse_repeats(text: str) -> list[int]:
    """``--repeats 3,4,5``: the N values, each a whole number >= 2 (ScriptError naming the option otherwise)."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 2:
        fail(f"--repeats {text!r}: expected comma-separated whole numbers >= 2 (e.g. 3,4,5,6)")
    return values


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", default="3,4,5,6", help="the N values to simulate")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of the studies' files (docs/results)")
    parser.add_argument("--output", type=Path, default=None, help="also write the JSON of every row here (a new file)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    repeats, files = parse_repeats(args.repeats), input_files(args.results)
    check_outputs({"--output": args.output}, [p for paths in files.values() for p in paths], overwrite=args.overwrite)
    if not any(files.values()):
        fail(f"--results {args.results}: no evaluation or pair files found (countdown-real/data, test-time/data, ...)")
    from rlft.models import load_embedded_tokenizer

    tokenizer = load_embedded_tokenizer()

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    groups: dict[str, list[Completion]] = {}
    for c in unique(eval_examples(files["eval"]) + pair_completions(files["sft_start_pairs"], "sft_start_pairs")
                    + pair_completions(files["bounded_pairs"], "bounded_pairs")):
        groups.setdefault(c.group, []).append(c)
    rows = []
    print("| group | N | completions | finished | mean tokens | stopped (finished) | tokens saved | scores changed "
          "(correct lost, format lost) | score change [95% CI] |")
    print("|---|---|---|---|---|---|---|---|---|")
    for group, completions in groups.items():
        mismatched = check_scores(completions)
        for n in repeats:
            r = simulate(completions, n, count_tokens)
            d = r["diff"]
            rows.append({"group": group, "score_mismatches": mismatched, **r})
            print(
                f"| {group} | {n} | {r['completions']} | {sum(c.finished for c in completions)} | "
                f"{r['mean_tokens']:.1f} | "
                f"{r['stopped']} ({r['stopped_finished']}) | {r['saved_share']:.1%} | {r['changed']} "
                f"({r['lost_correct']}, {r['lost_format']}) | {format_difference(d, 4)} |")
        if mismatched:
            print(f"note: {mismatched} recorded scores of group {group} differ from the scorer's on the full text")
    if args.output:
        atomic_write_text(args.output.expanduser(), json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":  # a bad option, an --output that exists or is an input, an unreadable file: one line, exit 2
    run_script(main)
