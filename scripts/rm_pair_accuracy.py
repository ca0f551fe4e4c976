"""Pairwise accuracy of a reward model on a preference file it was not trained on, with a 95% interval.

For each pair (``prompt``, ``chosen``, ``rejected``; rows whose ``metadata`` gives equal ``score_chosen`` and
``score_rejected`` are ties and skipped, as ``rlft rm --drop-ties`` does) the model scores both answers through
:class:`rlft.rewards.reward_model.RewardModelScorer`; accuracy is the fraction with chosen > rejected (an exact tie
counts 0.5), with a normal-approximation interval. Rows whose prompt alone is longer than ``--max-length`` are
skipped and counted, as in training; longer answers are cut at the end, as in training.

Usage:
    python scripts/rm_pair_accuracy.py --model runs/uf_bon/rm_judge/model --pairs runs/uf_bon/selector_pairs.jsonl \\
        --max-length 384 --json runs/uf_bon/rm_judge_on_selector_pairs.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rlft.rewards.reward_model import RewardModelScorer


def is_tie(row: dict) -> bool:
    meta = row.get("metadata") or {}
    return "score_chosen" in meta and meta.get("score_chosen") == meta.get("score_rejected")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a reward-model folder written by `rlft rm`")
    p.add_argument("--pairs", type=Path, required=True, help="a .jsonl of {prompt, chosen, rejected[, metadata]}")
    p.add_argument("--max-length", type=int, default=384)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    with args.pairs.open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for i, r in enumerate(rows):
        missing = [k for k in ("prompt", "chosen", "rejected") if k not in r]
        if missing:
            raise ValueError(f"{args.pairs} row {i}: no field {missing[0]!r}")
    scorer = RewardModelScorer(args.model, batch_size=args.batch_size, dtype=args.dtype, max_length=args.max_length)
    kept, ties, too_long = [], 0, 0
    for r in rows:
        if is_tie(r):
            ties += 1
            continue
        try:
            scorer.tokenize(r["prompt"], r["chosen"])
        except ValueError:
            too_long += 1
            continue
        kept.append(r)
    if not kept:
        raise ValueError(f"{args.pairs}: no pair left to score ({ties} ties, {too_long} prompts over --max-length)")
    prompts = [r["prompt"] for r in kept]
    chosen = scorer.score(prompts, [r["chosen"] for r in kept])
    rejected = scorer.score(prompts, [r["rejected"] for r in kept])
    wins = [1.0 if c > j else 0.5 if c == j else 0.0 for c, j in zip(chosen, rejected)]
    n = len(wins)
    acc = sum(wins) / n
    half = 1.96 * math.sqrt(acc * (1 - acc) / n)
    out = {"model": args.model, "pairs": str(args.pairs), "n": n, "accuracy": acc, "ci95": [acc - half, acc + half],
           "skipped_ties": ties, "skipped_prompt_too_long": too_long, "max_length": args.max_length}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
