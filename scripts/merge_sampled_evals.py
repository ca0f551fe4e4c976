"""Merge sampled Countdown evaluations of one model into one file with all their samples (best-of-N past one run's k).

An evaluation with k=16 on this CPU is one long job that a killed process loses whole. Four k=4 evaluations of the
same model on the same tasks at different ``--seed`` are the same 16 independent samples per task, each saved on its
own. This script joins them (:func:`rlft.eval.countdown.merge_samples`: per task, the first file's samples, then the
second's, ...) and recomputes every rate; ``scripts/test_time_study.py`` then reads the result like any k=16 file.

    python scripts/merge_sampled_evals.py runs/tts/sft_s0.json runs/tts/sft_s1.json runs/tts/sft_s2.json \\
        runs/tts/sft_s3.json --output runs/tts/sft_k16.json

Refused, naming the file: a file that is not an ``rlft eval countdown --output`` JSON, a greedy one, other tasks,
another model or sampling setting (``model``, its weights' ``model_sha256``, ``temperature``, ``top_p``,
``max_new_tokens``, ``prompt_template``, ``select_reward_model``), a seed used twice (the samples would repeat),
reward-model scores in some files only; before any file is read, an ``--output`` that is a folder, one of the inputs
(even with ``--overwrite``) or an existing file without ``--overwrite``. Errors are one line, exit code 2
(:mod:`rlft.lab.script_io`). The output's
``selection`` is empty (give test_time_study the greedy file); its ``config`` is the first file's with ``k`` the
total, ``seed`` None, ``merged_from`` the files and ``seeds``.
"""

from __future__ import annotations

from pathlib import Path

from rlft.eval.countdown import CountdownEvalResult, merge_samples, read_eval_file
from rlft.fsio import atomic_write_json
from rlft.lab.script_io import ArgumentParser, check_outputs, fail, run_script

SAME = ("model", "model_sha256", "temperature", "top_p", "max_new_tokens", "prompt_template", "select_reward_model")
"""Config fields every merged file must share."""


def check_configs(paths: list[Path], configs: list[dict]) -> None:
    """ScriptError when a file used another model or sampling setting than the first, or a seed repeats."""
    for path, config in zip(paths[1:], configs[1:]):
        for key in SAME:
            if config.get(key) != configs[0].get(key):
                fail(f"{path}: {key} is {config.get(key)!r}, but {paths[0]} has {configs[0].get(key)!r}")
    seeds = [config.get("seed") for config in configs]
    for i, seed in enumerate(seeds):
        if seed is None or seeds.index(seed) != i:
            why = ("no seed (its samples cannot be shown to differ)" if seed is None
                   else f"seed {seed}, as {paths[seeds.index(seed)]}")
            fail(f"{paths[i]}: {why}; merge evaluations sampled with different --seed")


def main(argv: list[str] | None = None) -> CountdownEvalResult:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("evals", nargs="+", type=Path,
                        help="sampled `rlft eval countdown --output` files, same model and tasks")
    parser.add_argument("--output", type=Path, required=True, help="the merged evaluation (JSON)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    check_outputs({"--output": args.output}, args.evals, overwrite=args.overwrite)
    if twice := sorted({str(p) for p in args.evals if [q.resolve() for q in args.evals].count(p.resolve()) > 1}):
        fail(f"{', '.join(twice)} named twice: merge each evaluation once")
    loaded = [read_eval_file(path) for path in args.evals]
    results, configs = [r for r, _ in loaded], [c for _, c in loaded]
    check_configs(args.evals, configs)
    try:
        merged = merge_samples(results)
    except ValueError as e:
        fail(f"{', '.join(map(str, args.evals))}: {e}")
    config = {**configs[0], "k": merged.k, "seed": None, "merged_from": [str(p) for p in args.evals],
              "seeds": [c["seed"] for c in configs]}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.output, {**merged.to_dict(), "config": config})
    print(f"{args.output}: {merged.num_tasks} tasks x {merged.k} samples (seeds {config['seeds']}): score "
          f"{merged.mean_score:.4f}, pass@{merged.k} {merged.pass_at_k[merged.k]:.4f}, "
          f"{merged.mean_completion_tokens:.1f} tokens a sample")
    return merged


if __name__ == "__main__":
    run_script(main)
