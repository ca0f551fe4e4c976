"""Report of the UltraFeedback best-of-N track: reward-model best-of-N against plain sampling, both judged against the
same greedy answers by a second reward model trained on a disjoint split.

Reads the folders written by ``rlft eval winrate`` (``winrate.jsonl``, ``winrate.json``, ``policy_candidates.jsonl``):
``<runs>/bon<N>_s<seed>`` (best of N by the selector) and ``<runs>/bon1_s<seed>`` (one sample, same temperature),
all against one shared reference file, so every comparison is paired prompt by prompt. With ``--judge`` it also
scores every one of the N candidates with the judge, which separates the selector's effect from the sampling's:

- ``selected minus random``: the judge's win label of the selector's pick minus the mean label of the N candidates
  (the expected label of a pick at random among the same samples), per prompt;
- ``judge's best``: the label of the candidate the judge itself prefers (an upper bound for any selector, as judged);
- ``agreement``: the fraction of candidate pairs of a prompt that selector and judge order the same way (0.5: chance).

The rescoring scores the reference answers again too, in the same call, so all of its labels come from one scoring
(float32 by default); its labels of the picked answers can differ from the run's on near-ties (the run's batches and
precision differ), and their number is reported as ``rescoring_mismatches``.

``--json`` and ``--markdown`` are checked before anything is read or scored (:mod:`rlft.lab.script_io`): new files (an
existing one needs ``--overwrite``), none of the files read; errors are one line, exit code 2.

Usage:
    python scripts/uf_best_of_n_report.py --runs runs/uf_bon --n 4 --seeds 0 1 --judge runs/uf_bon/rm_judge/model \\
        --json runs/uf_bon/report.json --markdown runs/uf_bon/report.md
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path
from statistics import mean

from rlft.data.files import read_jsonl
from rlft.eval.countdown import paired_difference
from rlft.eval.stats import format_difference
from rlft.eval.winrate import winrate_label
from rlft.fsio import atomic_write_json, atomic_write_text
from rlft.lab.script_io import ArgumentParser, check_outputs, run_script


def column(values: list[float]) -> list[list[float]]:
    """Per-prompt values as the (N, 1) task_scores that :func:`paired_difference` takes."""
    return [[v] for v in values]


def check_same_reference(runs: dict[str, list[dict]]) -> None:
    """Every run must have judged the same prompts against the same reference responses, in the same order."""
    names = list(runs)
    first = runs[names[0]]
    for name in names[1:]:
        rows = runs[name]
        if len(rows) != len(first):
            raise ValueError(f"{name} has {len(rows)} prompts, {names[0]} has {len(first)}")
        for i, (a, b) in enumerate(zip(first, rows)):
            if a["prompt"] != b["prompt"] or a["reference_response"] != b["reference_response"]:
                raise ValueError(f"prompt {i}: {name} and {names[0]} differ in prompt or reference response")


def pairwise_agreement(selector: list[float], judge: list[float]) -> tuple[int, int]:
    """(concordant, counted) over candidate pairs that neither scorer ties."""
    agree = counted = 0
    for i, j in combinations(range(len(selector)), 2):
        s, t = selector[i] - selector[j], judge[i] - judge[j]
        if s == 0 or t == 0:
            continue
        counted += 1
        agree += (s > 0) == (t > 0)
    return agree, counted


def candidate_analysis(candidates: list[dict], rows: list[dict], judge) -> dict:
    """Judge every candidate; per-prompt labels of the pick, a random pick and the judge's own best."""
    prompts, responses, owner = [], [], []
    for i, c in enumerate(candidates):
        for r in c["responses"]:
            prompts.append(c["prompt"])
            responses.append(r)
            owner.append(i)
    scores = judge.score(prompts + [r["prompt"] for r in rows], responses + [r["reference_response"] for r in rows])
    scores, reference = scores[:len(responses)], scores[len(responses):]
    per_prompt: list[list[float]] = [[] for _ in candidates]
    for i, s in zip(owner, scores):
        per_prompt[i].append(s)
    picked, random_pick, best, agree, counted = [], [], [], 0, 0
    for c, row, js, ref in zip(candidates, rows, per_prompt, reference):
        if c["prompt"] != row["prompt"]:
            raise ValueError("policy_candidates.jsonl and winrate.jsonl list the prompts in different orders")
        labels = [winrate_label(s, ref) for s in js]
        picked.append(labels[c["chosen"]])
        random_pick.append(sum(labels) / len(labels))
        best.append(max(labels))
        a, n = pairwise_agreement(c["selector_scores"], js)
        agree += a
        counted += n
    words = [[len(r.split()) for r in c["responses"]] for c in candidates]
    lengths = {"picked": mean([w[c["chosen"]] for w, c in zip(words, candidates)]),
               "candidates": mean([x for w in words for x in w]),
               "reference": mean([len(r["reference_response"].split()) for r in rows])}
    return {"picked": picked, "random": random_pick, "judge_best": best, "words": lengths,
            "agreement": agree / counted if counted else float("nan"), "agreement_pairs": counted}


def seed_report(runs: Path, n: int, seed: int, judge) -> dict:
    bon_dir, one_dir = runs / f"bon{n}_s{seed}", runs / f"bon1_s{seed}"
    bon, one = read_jsonl(bon_dir / "winrate.jsonl"), read_jsonl(one_dir / "winrate.jsonl")
    check_same_reference({bon_dir.name: bon, one_dir.name: one})
    out = {
        "seed": seed,
        f"bon{n}": json.loads((bon_dir / "winrate.json").read_text()),
        "bon1": json.loads((one_dir / "winrate.json").read_text()),
        f"bon{n}_minus_bon1": paired_difference(column([r["label"] for r in bon]), column([r["label"] for r in one])),
        "_labels": {f"bon{n}": [r["label"] for r in bon], "bon1": [r["label"] for r in one]},
        "_rows": bon,
    }
    if judge is not None:
        cand = candidate_analysis(read_jsonl(bon_dir / "policy_candidates.jsonl"), bon, judge)
        out["rescoring_mismatches"] = sum(p != r["label"] for p, r in zip(cand["picked"], bon))
        out["rescored_win_rate"] = sum(cand["picked"]) / len(cand["picked"])
        out["selected_minus_random"] = paired_difference(column(cand["picked"]), column(cand["random"]))
        out["random_win_rate"] = sum(cand["random"]) / len(cand["random"])
        out["judge_best_win_rate"] = sum(cand["judge_best"]) / len(cand["judge_best"])
        out["agreement"], out["agreement_pairs"] = cand["agreement"], cand["agreement_pairs"]
        out["mean_words"] = cand["words"]
        out["_labels"]["random"] = cand["random"]
        out["_labels"]["picked"] = cand["picked"]
    return out


def fmt(d: dict) -> str:
    return f"{format_difference(d)} ({d['better']} / {d['worse']})"


def markdown(reports: list[dict], n: int, pooled: dict) -> str:
    lines = [
        f"| UltraFeedback, {reports[0][f'bon{n}']['n']} prompts, vs greedy | " +
        " | ".join(f"seed {r['seed']}" for r in reports) + " | both seeds |", "|---|" + "---|" * (len(reports) + 1)
    ]

    def wr(s: dict) -> str:
        return f"{s['win_rate']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]"

    lines.append(f"| best of {n} by the selector: win-rate (Wilson 95%) | " +
                 " | ".join(wr(r[f"bon{n}"]) for r in reports) + f" | {pooled[f'bon{n}']:.3f} |")
    lines.append("| one sample: win-rate | " + " | ".join(wr(r["bon1"]) for r in reports) +
                 f" | {pooled['bon1']:.3f} |")
    lines.append(f"| best of {n} minus one sample, paired (better / worse prompts) | "
                 + " | ".join(fmt(r[f"bon{n}_minus_bon1"]) for r in reports) + f" | {fmt(pooled['bon_minus_bon1'])} |")
    if "selected_minus_random" in reports[0]:
        lines.append("| rescored: the selector's pick, win-rate (labels that differ from the run's) | " +
                     " | ".join(f"{r['rescored_win_rate']:.3f} ({r['rescoring_mismatches']})" for r in reports) +
                     " | |")
        lines.append(f"| rescored: random pick among the same {n}, win-rate | " +
                     " | ".join(f"{r['random_win_rate']:.3f}" for r in reports) + f" | {pooled['random']:.3f} |")
        lines.append("| rescored: selector's pick minus random pick, same samples, paired | " +
                     " | ".join(fmt(r["selected_minus_random"]) for r in reports) +
                     f" | {fmt(pooled['selected_minus_random'])} |")
        lines.append(f"| rescored: the judge's own best of {n} (upper bound, as judged) | "
                     + " | ".join(f"{r['judge_best_win_rate']:.3f}" for r in reports) + " | |")
        lines.append("| selector-judge agreement on candidate pairs (0.5 = chance) | "
                     + " | ".join(f"{r['agreement']:.3f} ({r['agreement_pairs']} pairs)" for r in reports) + " | |")
        lines.append("| mean words: the selector's pick / all candidates / greedy | " + " | ".join(
            "{picked:.0f} / {candidates:.0f} / {reference:.0f}".format(**r["mean_words"]) for r in reports) + " | |")
    return "\n".join(lines) + "\n"


def pool(reports: list[dict], n: int) -> dict:
    """Both seeds together: per prompt, the mean over seeds, paired the same way."""
    def mean_over_seeds(key: str) -> list[float]:
        cols = [r["_labels"][key] for r in reports]
        return [sum(v) / len(v) for v in zip(*cols)]

    out = {f"bon{n}": sum(mean_over_seeds(f"bon{n}")) / len(reports[0]["_rows"]),
           "bon1": sum(mean_over_seeds("bon1")) / len(reports[0]["_rows"]),
           "bon_minus_bon1": paired_difference(column(mean_over_seeds(f"bon{n}")), column(mean_over_seeds("bon1")))}
    if "random" in reports[0]["_labels"]:
        out["random"] = sum(mean_over_seeds("random")) / len(reports[0]["_rows"])
        out["selected_minus_random"] = paired_difference(column(mean_over_seeds("picked")),
                                                         column(mean_over_seeds("random")))
    return out


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, required=True, help="folder holding bon<N>_s<seed> and bon1_s<seed>")
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--judge", default=None, help="the judge's reward-model folder: rescore every candidate")
    p.add_argument("--judge-dtype", default="float32", help="the rescoring's dtype (rlft's --dtype values)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json / --markdown")
    args = p.parse_args(argv)
    read = [args.runs / f"bon{n}_s{s}" / name for s in args.seeds for n in (args.n, 1)
            for name in ("winrate.jsonl", "winrate.json", "policy_candidates.jsonl")]
    check_outputs({"--json": args.json, "--markdown": args.markdown}, read, overwrite=args.overwrite)
    judge = None
    if args.judge:
        from rlft.rewards.reward_model import RewardModelScorer

        judge = RewardModelScorer(args.judge, batch_size=8, dtype=args.judge_dtype)
    reports = [seed_report(args.runs, args.n, s, judge) for s in args.seeds]
    check_same_reference({f"seed {r['seed']}": r["_rows"] for r in reports})
    pooled = pool(reports, args.n)
    table = markdown(reports, args.n, pooled)
    print(table)
    if args.markdown:
        atomic_write_text(args.markdown.expanduser(), table)
    if args.json:
        clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in reports]
        atomic_write_json(args.json.expanduser(), {"seeds": clean, "pooled": pooled}, indent=1)


if __name__ == "__main__":
    run_script(main)
