"""scripts/studies/reuse_report.py on hand-written run folders: the reuse factor of each variant kind, the leader rule's
outcomes, the table's paired differences (end and step-10 models) worked by hand, and the missing reference's one-line
error."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest

from rlft.lab.script_io import ScriptError
from tests.conftest import load_script
from tests.unit.test_eval_compare import eval_file as by_hand

TASKS = [{"nums": [1, 2, 3], "target": t} for t in range(4)]


def script():
    return load_script("reuse_report")


def eval_file(path: Path, scores: list[float], cut: list[bool] | None = None) -> None:
    by_hand(path, scores, cut, tasks=TASKS)


def run_folder(out: Path, name: str, evals: dict[int, float], end: list[float] | None, replay: float | None = None,
               cut: list[bool] | None = None, half: list[float] | None = None) -> None:
    folder = out / name / "s0"
    (folder / "run").mkdir(parents=True)
    records = []
    for step in range(1, 21):
        record = {"step": step, "samples/total": 100 * step, "tokens/generated_total": 1000 * step,
                  "tokens/trained_total": 300 * step, "flops/estimated": 1e12 * step, "time/step_s": 60.0}
        if replay is not None:
            record["replay/share"] = replay
        if step in evals:
            record["eval/score"] = evals[step]
        records.append(record)
    (folder / "run" / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
    (folder / "run" / "config.yaml").write_text("eval_limit: 4\n")
    if end is not None:
        eval_file(folder / "eval_val_greedy_4.json", end, cut)
    if half is not None:  # the step-10 model's evaluation (countdown_ablation.py checkpoint)
        (folder / "step10").mkdir()
        eval_file(folder / "step10" / "eval_val_greedy_4.json", half)


def variants_file(path: Path) -> Path:
    path.write_text("reuse_ppo_r2: {kind: rl, loss: ppo, ppo_epochs: 2}\n"
                    "reuse_topr_r1: {kind: rl, loss: topr}\n"
                    "reuse_topr_r4: {kind: rl, loss: topr, replay_size: 24, max_staleness: 3}\n")
    return path


def test_reuse_factor_and_method():
    s = script()
    assert s.reuse_factor({}) == 1 and s.method({}) == "on-policy"
    assert s.reuse_factor({"ppo_epochs": 4}) == 4 and s.method({"ppo_epochs": 4}) == "PPO epochs"
    assert s.reuse_factor({"loss": "topr"}) == 1 and s.method({"loss": "topr"}) == "TOPR"
    spec = {"loss": "topr", "replay_size": 8, "max_staleness": 1}
    assert s.reuse_factor(spec) == 2 and s.method(spec) == "TOPR replay"
    assert s.reuse_factor({**spec, "ppo_epochs": 2, "max_staleness": 3}) == 8  # both kinds multiply


def rows(s, reference_score, runs):
    reference = {"name": "ref", "r": 1, "score": reference_score, "inloop": {10: 0.99, 20: 0.99}, "end": Path("x")}
    return reference, [{"name": n, "r": r, "score": sc, "half_score": half, "inloop": {10: 0.99},
                        "end": None if sc is None else Path("x")} for n, r, sc, half in runs]


def test_leader_rule():
    """As amended on 2026-11-29: the half-sample clause reads the step-10 model's evaluation (the in-loop points,
    0.99 everywhere here, no longer count)."""
    s = script()
    # the best finished r >= 2 run beats the reference at its end: it goes on (r = 1 runs never lead)
    ref, runs = rows(s, 0.50, [("a", 2, 0.52, None), ("b", 4, 0.49, 0.70), ("topr", 1, 0.90, 0.90),
                               ("c", 4, None, 0.99)])
    assert s.leader(ref, runs)[0] == "a"
    # nobody beats the end score; the best one's step-10 model reaches the reference's end score
    ref, runs = rows(s, 0.60, [("a", 2, 0.52, 0.60), ("b", 4, 0.49, 0.70)])
    name, why = s.leader(ref, runs)
    assert name == "a"  # not b's
    assert "step-10 model (half the samples) scores 0.600 >= the on-policy run's 0.600" in why
    # the best one's step-10 model not evaluated yet: no leader, and why says what to run
    ref, runs = rows(s, 0.60, [("a", 2, 0.52, None), ("b", 4, 0.49, 0.70)])
    name, why = s.leader(ref, runs)
    assert name is None and why.startswith("undecided") and "countdown_ablation.py checkpoint" in why
    # neither: none goes on, and why says by how much
    ref, runs = rows(s, 0.60, [("a", 2, 0.52, 0.55)])
    name, why = s.leader(ref, runs)
    assert name is None and "0.520 < the on-policy 0.600" in why and "step-10 model 0.550 < 0.600" in why
    assert s.leader(ref, [])[0] is None


def test_report_end_to_end(tmp_path, capsys):
    out = tmp_path / "ablation"
    run_folder(out, "real_sft_patient_grpo", {10: 0.5, 20: 0.5}, [1.0, 0.0, 0.1, 1.0])  # mean 0.525
    run_folder(out, "reuse_ppo_r2", {5: 0.4, 10: 0.6}, [1.0, 1.0, 0.1, 0.0], cut=[False, False, False, True],
               half=[1.0, 0.0, 0.1, 0.0])
    run_folder(out, "reuse_topr_r4", {5: 0.3}, None, replay=0.75)  # still training
    (out / "real_sft_patient" / "s0").mkdir(parents=True)
    eval_file(out / "real_sft_patient" / "s0" / "eval_val_greedy_4.json", [0.0, 0.0, 0.1, 1.0])
    import rlft.eval.report  # noqa: F401  (pyplot copies Axes.errorbar's docstring on import: import it before the patch)

    s, drawn = script(), []

    def spy(xs, ys, **kw):
        drawn.append((kw["label"], xs, ys))

    with mock.patch("matplotlib.axes.Axes.errorbar", side_effect=spy):
        s.main(["--out", str(out), "--tasks", "4", "--variants-file", str(variants_file(tmp_path / "v.yaml"))])
    text = capsys.readouterr().out
    # the paired plot: step-10 (1,000 samples) and end (2,000) models minus the reference's end; two points at 2,000
    # are spread 1% of the span apart; the run still training has none
    assert [(label, list(xs), [round(y, 3) for y in ys]) for label, xs, ys in drawn] == [
        ("real_sft_patient_grpo (r=1)", [1990.0], [0.0]), ("reuse_ppo_r2 (r=2)", [1000, 2010.0], [-0.25, 0.0])]
    assert (out / "reuse_paired_vs_samples_validation_s0.png").name in text
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    # d = (0, +1, 0, -1): mean 0, sd sqrt(2/3), half-width 1.96 * sqrt(2/3) / 2 = 0.800
    assert "| 0.525 (25%) | +0.000 [-0.800, +0.800] |" in lines["reuse_ppo_r2"]
    # step 10: d = (0, 0, 0, -1): mean -0.25, sd 0.5, half-width 1.96 * 0.5 / 2 = 0.490
    assert lines["reuse_ppo_r2"].endswith("| 0.275 (0%) | -0.250 [-0.740, +0.240] |")
    assert "| PPO epochs | 2 | 20 | 2,000 | 20,000 | 6,000 | 2.00e+13 | 20.0 | 0.00 | 5: 0.400, 10: 0.600 |" in lines[
        "reuse_ppo_r2"]
    assert "| TOPR replay | 4 |" in lines[
        "reuse_topr_r4"] and "| 0.75 | 5: 0.300 | still training | - | - | - |" in lines["reuse_topr_r4"]
    assert "| 0.525 (0%) | - | - | - |" in lines["real_sft_patient_grpo"]
    # equal end scores (0.525 >= 0.525): the r = 2 run goes on
    assert "amended on 2026-11-29): reuse_ppo_r2 (reuse_ppo_r2 scores 0.525 >= the on-policy 0.525)" in text
    assert (out / "reuse_samples_vs_score_s0.png").stat().st_size > 0


def test_missing_reference_is_one_line(tmp_path):
    s = script()
    with pytest.raises(ScriptError, match="real_sft_patient_grpo/s0/eval_val_greedy_4.json: the on-policy reference"):
        s.main(["--out", str(tmp_path), "--tasks", "4", "--variants-file", str(variants_file(tmp_path / "v.yaml"))])


def test_on_the_test_rows_only_the_runs_evaluated_there_are_listed(tmp_path, capsys):
    """--split test (the confirmation): a run with only validation evaluations is left out, and there is no leader
    rule and no in-loop plot."""
    out = tmp_path / "ablation"
    run_folder(out, "real_sft_patient_grpo", {10: 0.5, 20: 0.5}, [1.0, 0.0, 0.1, 1.0])
    run_folder(out, "reuse_ppo_r2", {5: 0.4}, [1.0, 1.0, 0.1, 0.0])
    run_folder(out, "reuse_topr_r1", {5: 0.4}, [1.0, 1.0, 0.1, 0.0])
    for name, scores in [("real_sft_patient_grpo", [1.0, 0.0, 0.1, 1.0]), ("reuse_ppo_r2", [0.0, 0.0, 0.1, 1.0])]:
        eval_file(out / name / "s0" / "eval_greedy_4.json", scores)
    script().main(["--out", str(out), "--tasks", "4", "--split", "test",
                   "--variants-file", str(variants_file(tmp_path / "v.yaml"))])
    text = capsys.readouterr().out
    rows = [
        line.split(" | ")[0].strip("| ") for line in text.splitlines() if line.startswith("| ") and "---" not in line
    ]
    assert rows == ["run", "real_sft_patient_grpo", "reuse_ppo_r2"]
    assert "| 0.275 (0%) | -0.250 [-0.740, +0.240] |" in text  # d = (-1, 0, 0, 0), worked as in the test above
    assert "leader" not in text and not (out / "reuse_samples_vs_score_s0.png").exists()
    assert (out / "reuse_paired_vs_samples_test_s0.png").exists()
