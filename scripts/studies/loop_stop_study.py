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
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

from rlft.eval.countdown import paired_difference, read_eval_json
from rlft.eval.stats import format_difference
from rlft.rewards.countdown import score_completions
from rlft.rollout.loops import loop_cut

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
EVAL_DIRS = (RESULTS / "countdown-real" / "data", RESULTS / "test-time" / "data")
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


def eval_examples() -> list[Completion]:
    """The ``examples`` of the RL and SFT evaluation files, with their recorded tokens, truncation and score."""
    out = []
    for folder in EVAL_DIRS:
        for path in sorted([*folder.glob("*_eval_*.json"), *folder.glob("*_eval_*.json.gz")]):
            group = "rl" if RL_FILE.match(path.name) else "sft" if SFT_FILE.match(path.name) else None
            if group is None:
                continue
            data = read_eval_json(path)
            for t, ex in enumerate(data.get("examples", [])):
                trunc, tokens = data["task_truncated"][t][0], data["task_tokens"][t][0]
                out.append(Completion(group, ex["prompt_tail"], ex["completion"], ex["nums"], ex["target"],
                                      data["task_scores"][t][0], not trunc, tokens))
    return out


def pair_completions(paths: list[Path], group: str) -> list[Completion]:
    out = []
    for path in paths:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            for side in ("chosen", "rejected"):
                out.append(Completion(group, row["prompt"], row[side], row["nums"], row["target"], row[f"score_{side}"],
                                      row[f"{side}_finish_reason"] == "stop", None))
    return out


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", default="3,4,5,6", help="the N values to simulate")
    parser.add_argument("--output", default=None, help="also write the JSON of every row here")
    args = parser.parse_args()
    from rlft.models import load_embedded_tokenizer

    tokenizer = load_embedded_tokenizer()

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    real_pairs = sorted((RESULTS / "countdown-real" / "data").glob("dpo_s*_pairs.jsonl"))
    bounded_pairs = sorted((RESULTS / "countdown-bounded" / "data").glob("pairs_*.jsonl"))
    groups: dict[str, list[Completion]] = {}
    for c in unique(eval_examples() + pair_completions(real_pairs, "sft_start_pairs")
                    + pair_completions(bounded_pairs, "bounded_pairs")):
        groups.setdefault(c.group, []).append(c)
    rows = []
    print("| group | N | completions | finished | mean tokens | stopped (finished) | tokens saved | scores changed "
          "(correct lost, format lost) | score change [95% CI] |")
    print("|---|---|---|---|---|---|---|---|---|")
    for group, completions in groups.items():
        mismatched = check_scores(completions)
        for n in (int(x) for x in args.repeats.split(",")):
            r = simulate(completions, n, count_tokens)
            d = r["diff"]
            rows.append({"group": group, "score_mismatches": mismatched, **r})
            print(f"| {group} | {n} | {r['completions']} | {sum(c.finished for c in completions)} | {r['mean_tokens']:.1f} | "
                  f"{r['stopped']} ({r['stopped_finished']}) | {r['saved_share']:.1%} | {r['changed']} "
                  f"({r['lost_correct']}, {r['lost_format']}) | {format_difference(d, 4)} |")
        if mismatched:
            print(f"note: {mismatched} recorded scores of group {group} differ from the scorer's on the full text")
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
