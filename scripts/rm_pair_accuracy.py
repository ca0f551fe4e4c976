"""Pairwise accuracy of a reward model on a preference file it was not trained on, with a 95% interval.

Pairs are read by :func:`rlft.data.preferences.load_preference_pairs`, as ``rlft rm`` reads them: score ties
(equal ``score_chosen`` and ``score_rejected``) are dropped and counted, as ``--drop-ties`` does; an invalid row
(a missing field, an empty reply, chosen and rejected after different conversations) is an error naming the file,
row and field, or with ``--skip-invalid`` is skipped and counted. The model scores both answers of each pair
through :class:`rlft.rewards.reward_model.RewardModelScorer`; accuracy is the fraction with chosen > rejected, strictly
(an exact score tie counts 0, as in ``rlft rm``'s held-out accuracy; ties are counted in ``score_ties``), with
Wilson's 95% interval (:func:`rlft.eval.winrate.winrate_summary`). Pairs whose prompt alone is longer
than ``--max-length`` are skipped and counted, as in training; longer answers are cut at the end, as in training.

Checked before the model loads (one line, exit code 2: :mod:`rlft.lab.script_io`): ``--json`` is a new file (an existing
one needs ``--overwrite``) and never the ``--pairs`` file; ``--pairs`` exists; ``--model`` is a reward model (a
folder written by ``rlft rm``: a 1-label sequence classifier; a plain causal LM would be scored by a random head);
``--max-length`` and ``--batch-size`` are >= 1 and ``--dtype`` is known.

Usage:
    python scripts/rm_pair_accuracy.py --model runs/uf_bon/rm_judge/model --pairs runs/uf_bon/selector_pairs.jsonl \\
        --max-length 384 --json runs/uf_bon/rm_judge_on_selector_pairs.json
"""

from __future__ import annotations

import json
from pathlib import Path

from rlft.data.preferences import load_preference_pairs
from rlft.eval.winrate import winrate_summary
from rlft.rewards.reward_model import RewardModelScorer, check_reward_model
from rlft.lab.script_io import ArgumentParser, check_outputs, fail, run_script

DTYPES = ("auto", "float32", "bfloat16", "float16")


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a reward-model folder written by `rlft rm`")
    p.add_argument("--pairs", type=Path, required=True, help="a .jsonl of {prompt, chosen, rejected[, metadata]}")
    p.add_argument("--max-length", type=int, default=384)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--skip-invalid", action="store_true", help="skip and count invalid rows instead of stopping")
    p.add_argument("--json", type=Path, default=None, help="also write the summary here (a new file)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json")
    args = p.parse_args(argv)
    for option, value in (("--max-length", args.max_length), ("--batch-size", args.batch_size)):
        if value < 1:
            fail(f"{option} must be >= 1, got {value}")
    check_outputs({"--json": args.json}, [args.pairs], overwrite=args.overwrite)
    if not args.pairs.is_file():
        fail(f"--pairs {args.pairs}: no such file")
    check_reward_model(args.model, "--model")
    pairs, counts = load_preference_pairs(args.pairs, skip_invalid=args.skip_invalid, drop_ties=True)
    if not pairs:
        fail(
            f"{args.pairs}: no pair to score ({counts['dropped_ties']} ties, {counts['skipped_invalid']} invalid rows)")
    scorer = RewardModelScorer(args.model, batch_size=args.batch_size, dtype=args.dtype, max_length=args.max_length)
    kept, too_long = [], 0
    for pair in pairs:
        try:
            scorer.tokenize(pair.prompt, pair.chosen)
        except ValueError:
            too_long += 1
            continue
        kept.append(pair)
    if not kept:
        fail(f"{args.pairs}: no pair left to score ({counts['dropped_ties']} ties, {counts['skipped_invalid']} "
             f"invalid rows, {too_long} prompts over --max-length)")
    prompts = [pair.prompt for pair in kept]
    chosen = scorer.score(prompts, [pair.chosen for pair in kept])
    rejected = scorer.score(prompts, [pair.rejected for pair in kept])
    summary = winrate_summary([1.0 if c > j else 0.0 for c, j in zip(chosen, rejected)])
    out = {
        "model": args.model, "pairs": str(args.pairs), "n": summary["n"], "accuracy": summary["win_rate"],
        "ci95": [summary["ci_low"], summary["ci_high"]], "interval": "wilson",
        "score_ties": sum(c == j for c, j in zip(chosen, rejected)), "skipped_ties": counts["dropped_ties"],
        "skipped_invalid": counts["skipped_invalid"], "skipped_prompt_too_long": too_long, "max_length": args.max_length
    }
    print(json.dumps(out, indent=1))
    if args.json:
        from rlft.fsio import atomic_write_text

        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.json, json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    run_script(main)
