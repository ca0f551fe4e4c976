"""scripts/test_time_study.py on fake evaluation files: the table's numbers, the long-search comparison at equal
tokens and its interpolation (worked by hand), the plot written, and the errors on mismatched files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlft.eval.best_of_n import bracket, equal_cost_comparison
from rlft.eval.countdown import CountdownEvalResult
from rlft.run_folder import OutputPathError
from rlft.lab.script_io import ScriptError
from tests.conftest import load_script

Z = 1.959963984540054


def script():
    return load_script("test_time_study")


TASKS = [{"nums": [1, 2, 3], "target": t} for t in (6, 7, 8)]


def write(path: Path, task_scores, task_tokens, k=4, mode="sampled", tasks=TASKS, **extra) -> str:
    """An evaluation file with only the fields the study reads filled in meaningfully."""
    result = CountdownEvalResult(num_tasks=len(task_scores), k=k, mode=mode, mean_score=0.0, accuracy=0.0,
                                 format_rate=0.0, pass_at_k={1: 0.0}, mean_completion_tokens=0.0, truncated_rate=0.0,
                                 task_scores=task_scores, task_tokens=task_tokens, tasks=tasks, **extra)
    path.write_text(json.dumps(result.to_dict()))
    return str(path)


SAMPLED = dict(task_scores=[[0.1, 1.0, 1.0, 0.1], [0.0, 0.1, 1.0, 1.0], [1.0, 0.1, 0.1, 0.1]],
               task_tokens=[[10, 20, 30, 40], [10, 10, 10, 10], [5, 5, 5, 5]],
               task_values=[[5.0, 9.0, 9.0, 5.0], [None, 2.0, 9.0, 9.0], [16.0, 3.0, 3.0, 3.0]],
               task_certainty=[[None] * 4] * 3)


def ci_cell(score: float, d: list[float]) -> str:
    m = sum(d) / len(d)
    half = Z * math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1)) / math.sqrt(len(d))
    return f"{score:.3f} ({m:+.3f} [{m - half:+.3f}, {m + half:+.3f}])"


def test_bracket_and_equal_cost_comparison_by_hand():
    """majority: 10 tokens .2, 30 tokens .5, 100 tokens .6; self-certainty: 10 .1, 30 .4; oracle: higher, ignored.
    At 20 tokens: w = .5, majority .35 > self-certainty .25; against a long search of .3: +.05. Per task, the mixture
    of majority@1 (0, .4) and @2 (.5, .5) is (.25, .45); minus (.3, .3): d = (-.05, .15), sd = .1 * sqrt 2, half width
    1.96 * .1. At 65 tokens: only majority reaches it, w = .5 -> .55. Outside 10..100: None."""
    m = script()
    assert bracket([10, 30, 100], 20) == (0, 1, 0.5)
    assert bracket([10, 30, 100], 100) == (1, 2, 1.0)
    assert bracket([10, 30, 100], 9.9) is None and bracket([10, 30, 100], 101) is None
    curves = {
        "majority": [{"n": 1, "tokens_per_task": 10, "score": 0.2, "chosen": [0.0, 0.4]},
                     {"n": 2, "tokens_per_task": 30, "score": 0.5, "chosen": [0.5, 0.5]},
                     {"n": 4, "tokens_per_task": 100, "score": 0.6, "chosen": [0.6, 0.6]}],
        "self-certainty": [{"n": 1, "tokens_per_task": 10, "score": 0.1, "chosen": [0.1, 0.1]},
                           {"n": 2, "tokens_per_task": 30, "score": 0.4, "chosen": [0.4, 0.4]}],
        "oracle": [{"n": 1, "tokens_per_task": 10, "score": 0.9, "chosen": [0.9, 0.9]},
                   {"n": 4, "tokens_per_task": 100, "score": 1.0, "chosen": [1.0, 1.0]}],
    }
    point = {"tokens": 20.0, "score": 0.3, "task_scores": [[0.3], [0.3]]}
    cmp = equal_cost_comparison(curves, point)
    assert (cmp["selector"], cmp["n_low"], cmp["n_high"]) == ("majority", 1, 2)
    assert (cmp["w"], cmp["score"], cmp["diff"]) == (pytest.approx(0.5), pytest.approx(0.35), pytest.approx(0.05))
    assert (cmp["ci_low"], cmp["ci_high"]) == (pytest.approx(0.05 - Z * 0.1), pytest.approx(0.05 + Z * 0.1))
    unpaired = equal_cost_comparison(curves, point, same_tasks=False)
    assert unpaired["diff"] == pytest.approx(0.05) and unpaired["ci_low"] is None
    far = equal_cost_comparison(curves, {**point, "tokens": 65.0})
    assert (far["selector"], far["n_low"], far["n_high"], far["score"]) == ("majority", 2, 4, pytest.approx(0.55))
    assert equal_cost_comparison(curves, {**point, "tokens": 5.0}) is None
    text = m.verdict("rl", "long", cmp, point, (10, 100))
    assert "majority (between n=1 and n=2, w=0.50) scores 0.350, the long search 0.300: difference +0.050" in text
    assert ("better at equal generated tokens: not resolved (the interval includes 0; "
            "ahead on the point estimate: rl best-of-N)" in text)
    sure = m.verdict("rl", "long", {**cmp, "ci_low": 0.01, "ci_high": 0.09}, point, (10, 100))
    assert sure.endswith("better at equal generated tokens: rl best-of-N.")
    assert m.verdict("rl", "long", {**cmp, "diff": -0.05, "ci_low": -0.09, "ci_high": -0.01}, point,
                     (10, 100)).endswith("better at equal generated tokens: long.")
    assert "outside rl's curve (10-100 tokens per task)" in m.verdict("rl", "long", None, {**point, "tokens": 5.0},
                                                                      (10, 100))


def test_study_on_fake_files(tmp_path, capsys):
    """Greedy (1, .1, 0) at 8 tokens. majority@1 = sample 0 (.1, 0, 1): d = (-.9, -.1, 1); @2 (.1, .1, 1)
    d = (-.9, 0, 1); @4 (.1, 1, .1) d = (-.9, .9, .1). Tokens per task: n=1 25/3, n=2 20, n=4 160/3. The long search
    (1, 1, 0) at 30 tokens: majority between n=2 (20) and n=4 (53.3), w = .3, .4 both sides -> .4 vs 2/3: -0.267; per
    task the mixture (.1, .37, .73) minus (1, 1, 0)."""
    m = script()
    sampled = write(tmp_path / "s.json", **SAMPLED)
    greedy = write(tmp_path / "g.json", [[1.0], [0.1], [0.0]], [[8], [8], [8]], k=1, mode="greedy")
    long = write(tmp_path / "long.json", [[1.0], [1.0], [0.0]], [[30], [30], [30]], k=1, mode="greedy")
    png, md = tmp_path / "plot" / "study.png", tmp_path / "study.md"
    m.main([
        "--model", f"m={sampled},{greedy}", "--direct", f"d={sampled}", "--point", f"long search={long}", "--selectors",
        "majority", "self-certainty", "oracle", "--sizes", "1", "2", "4", "--plot",
        str(png), "--markdown",
        str(md)
    ])
    out = capsys.readouterr()
    text = md.read_text()
    assert text in out.out
    assert "self-certainty skipped" in out.err  # the file has no certainty
    assert f"| m | majority | {ci_cell(1.1 / 3, [-0.9, -0.1, 1.0])} | {ci_cell(1.2 / 3, [-0.9, 0.0, 1.0])} | " \
           f"{ci_cell(1.2 / 3, [-0.9, 0.9, 0.1])} |" in text
    assert f"| m | oracle = pass@n (upper bound) | {ci_cell(1.1 / 3, [-0.9, -0.1, 1.0])} | " \
           f"{ci_cell(2.1 / 3, [0.0, 0.0, 1.0])} | {ci_cell(1.0, [0.0, 0.9, 1.0])} |" in text
    assert "| m | tokens per task | 8 | 20 | 53 |" in text
    assert "| m | greedy: 0.367, 8 tokens per task |" in text
    assert "| d | majority | 0.367 | 0.400 | 0.400 |" in text  # a direct model: no greedy, no interval
    mix, long_scores = [0.1, 0.37, 0.73], [1.0, 1.0, 0.0]
    d = [a - b for a, b in zip(mix, long_scores)]
    mean = sum(d) / 3
    half = Z * math.sqrt(sum((x - mean) ** 2 for x in d) / 2) / math.sqrt(3)
    assert (
        f"m vs long search, at 30 tokens per task: majority (between n=2 and n=4, w=0.30) scores 0.400, the long "
        f"search 0.667: difference {mean:+.3f} [95% CI {mean - half:+.3f}, {mean + half:+.3f}]; better at equal "
        f"generated tokens: not resolved (the interval includes 0; ahead on the point estimate: long search)") in text
    assert "| long search | 0.667 |" in text
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_study_refuses_a_greedy_file_of_other_tasks(tmp_path):
    m = script()
    sampled = write(tmp_path / "s.json", **SAMPLED)
    other = write(tmp_path / "g.json", [[1.0], [0.1], [0.0]], [[8]] * 3, k=1, mode="greedy", tasks=TASKS[::-1])
    with pytest.raises(ScriptError, match="--model m: .*g.json: task 0 is nums \\[1, 2, 3\\] target 8"):
        m.main(["--model", f"m={sampled},{other}", "--plot", str(tmp_path / "p.png")])
    with pytest.raises(ScriptError, match="no stored greedy baseline"):
        m.main(["--model", f"m={sampled}", "--plot", str(tmp_path / "p.png")])
    with pytest.raises(ValueError, match="does not exist"):
        m.main(["--model", f"m={tmp_path / 'missing.json'}", "--plot", str(tmp_path / "p.png")])


def test_study_refuses_a_greedy_file_of_other_weights(tmp_path):
    """Both files record their weights' SHA-256: another model file's greedy answers are refused; the same hash, or a
    file that records none (archived), is taken."""
    m = script()

    def stamped(path: Path, sha: str | None) -> str:
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "config": {} if sha is None else {"model_sha256": sha}}))
        return str(path)

    sampled = stamped(Path(write(tmp_path / "s.json", **SAMPLED)), "a" * 64)
    greedy = Path(write(tmp_path / "g.json", [[1.0], [0.1], [0.0]], [[8]] * 3, k=1, mode="greedy"))
    run = ["--model", f"m={sampled},{greedy}", "--plot", str(tmp_path / "p.png"), "--sizes", "1", "2", "--overwrite"]
    stamped(greedy, "b" * 64)
    with pytest.raises(ScriptError,
                       match=f"--model m: {greedy} evaluated weights bbbbbbbbbbbbbbbb..., the samples aaaa"):
        m.main(run)
    for sha in ("a" * 64, None):
        stamped(greedy, sha)
        m.main(run)
        assert (tmp_path / "p.png").exists()


def _diff_cell(d: list[float]) -> str:
    m = sum(d) / len(d)
    half = Z * math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1)) / math.sqrt(len(d))
    return f"{m:+.3f} [{m - half:+.3f}, {m + half:+.3f}]"


def test_versus_pairs_two_models_at_the_same_n_and_at_equal_tokens(tmp_path):
    """A = SAMPLED: majority picks (.1, 0, 1) @1, (.1, .1, 1) @2, (.1, 1, .1) @4 at 25/3, 20, 160/3 tokens a task.
    B: every sample scores .1 with the same value, 10 tokens each: .1 at 10, 20, 40 tokens. Same n: A - B =
    (0, -.1, .9), (0, 0, .9), (0, .9, 0). At B's tokens: 10 lies between A's n=1 and n=2,
    w = (10 - 25/3) / (35/3) = 1/7: A's mixture (.1, 1/70, 1); 20 is A's n=2 (w = 1); 40 lies between n=2 and n=4,
    w = .6: (.1, .64, .46)."""
    m = script()
    a = write(tmp_path / "a.json", **SAMPLED)
    b = write(tmp_path / "b.json", [[0.1] * 4] * 3, [[10] * 4] * 3, task_values=[[1.0] * 4] * 3,
              task_certainty=[[None] * 4] * 3)
    greedy = write(tmp_path / "g.json", [[1.0], [0.1], [0.0]], [[8]] * 3, k=1, mode="greedy")
    md = tmp_path / "study.md"
    m.main(["--model", f"A, rl={a},{greedy}", "--model", f"B={b},{greedy}", "--versus", "A, rl", "B", "--selectors",
            "majority", "oracle", "--sizes", "1", "2", "4", "--plot", str(tmp_path / "p.png"), "--markdown", str(md)])
    text = md.read_text()
    assert "## A, rl against B, task by task" in text
    assert f"| majority | 1 | 0.367 - 0.100 = {_diff_cell([0, -0.1, 0.9])} | 8 / 10 | " \
           f"0.371 (n=1-2) - 0.100 = {_diff_cell([0, 1 / 70 - 0.1, 0.9])} |" in text
    assert f"| majority | 2 | 0.400 - 0.100 = {_diff_cell([0, 0, 0.9])} | 20 / 20 | " \
           f"0.400 (n=1-2) - 0.100 = {_diff_cell([0, 0, 0.9])} |" in text
    assert f"| majority | 4 | 0.400 - 0.100 = {_diff_cell([0, 0.9, 0])} | 53 / 40 | " \
           f"0.400 (n=2-4) - 0.100 = {_diff_cell([0, 0.54, 0.36])} |" in text
    assert (f"| oracle = pass@n (upper bound) | 4 | 1.000 - 0.100 = {_diff_cell([0.9, 0.9, 0.9])} | 53 / 40 | - |"
            in text)
    with pytest.raises(ScriptError, match="expected two different --model names"):
        m.main(["--model", f"B={b},{greedy}", "--versus", "A", "B", "--plot", str(tmp_path / "q.png")])


def test_outputs_never_replace_an_input_or_an_existing_file(tmp_path, capsys):
    """--markdown or --plot naming an input evaluation is refused even with --overwrite (the file is unchanged); an
    existing output needs --overwrite; a folder never. Checked before any file is read: a missing input is not
    reached."""
    m = script()
    sampled = write(tmp_path / "s.json", **SAMPLED)
    greedy = write(tmp_path / "g.json", [[1.0], [0.1], [0.0]], [[8], [8], [8]], k=1, mode="greedy")
    before = Path(greedy).read_bytes()
    base = ["--model", f"m={sampled},{greedy}", "--sizes", "1", "2"]
    for extra in ([], ["--overwrite"]):
        with pytest.raises(OutputPathError, match=f"--markdown {greedy} is the input"):
            m.main([*base, "--markdown", greedy, "--plot", str(tmp_path / "p.png"), *extra])
        with pytest.raises(ScriptError, match=f"--plot {sampled}: name a .png"):  # an input is never a picture's name
            m.main([*base, "--plot", sampled, *extra])
    assert Path(greedy).read_bytes() == before and not (tmp_path / "p.png").exists()
    md = tmp_path / "study.md"
    md.write_text("an earlier study")
    with pytest.raises(OutputPathError, match="study.md already exists; pass --overwrite"):
        m.main(["--model", f"m={tmp_path / 'missing.json'}", "--markdown", str(md), "--plot", str(tmp_path / "p.png")])
    assert md.read_text() == "an earlier study"
    with pytest.raises(OutputPathError, match="--markdown and --plot name the same file"):
        m.main([*base, "--markdown", str(tmp_path / "x.png"), "--plot", str(tmp_path / "x.png")])
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(OutputPathError, match="is a folder"):
        m.main([*base, "--plot", str(tmp_path / "folder.png")])
    m.main([*base, "--markdown", str(md), "--plot", str(tmp_path / "p.png"), "--overwrite"])
    assert md.read_text().startswith("## Score against N")


def test_a_name_given_twice_is_refused(tmp_path):
    """Two --model (or --model and --direct) of one name: the first would vanish from the table and plot."""
    m = script()
    a = write(tmp_path / "a.json", **SAMPLED)
    greedy = write(tmp_path / "g.json", [[1.0], [0.1], [0.0]], [[8], [8], [8]], k=1, mode="greedy")
    with pytest.raises(ScriptError, match="--model / --direct name 'rl' given twice"):
        m.main(["--model", f"rl={a},{greedy}", "--model", f"rl ={a},{greedy}", "--plot", str(tmp_path / "p.png")])
    with pytest.raises(ScriptError, match="--model / --direct name 'rl' given twice"):
        m.main(["--model", f"rl={a},{greedy}", "--direct", f"rl={a}", "--plot", str(tmp_path / "p.png")])
    with pytest.raises(ScriptError, match="--point label 'long' given twice"):
        m.main([
            "--model", f"rl={a},{greedy}", "--point", f"long={greedy}", "--point", f"long={a}", "--plot",
            str(tmp_path / "p.png")
        ])
    assert not (tmp_path / "p.png").exists()


def test_a_greedy_file_of_another_prompt_template_or_budget_is_refused(tmp_path):
    """The samples were prompted with 'short': a greedy file prompted with 'base' (or cut at another max_new_tokens) is
    refused; the same values, or a file that records none, is taken."""
    m = script()

    def configured(path: Path, **config) -> str:
        path.write_text(json.dumps({**json.loads(path.read_text()), "config": config}))
        return str(path)

    sampled = configured(Path(write(tmp_path / "s.json", **SAMPLED)), prompt_template="short", max_new_tokens=256)
    greedy = Path(write(tmp_path / "g.json", [[1.0], [0.1], [0.0]], [[8]] * 3, k=1, mode="greedy"))
    run = ["--model", f"m={sampled},{greedy}", "--plot", str(tmp_path / "p.png"), "--sizes", "1", "--overwrite"]
    configured(greedy, prompt_template="base", max_new_tokens=256)
    with pytest.raises(
            ScriptError, match=f"--model m: {greedy} was evaluated with other settings \\(prompt_template 'short' "
            "in the samples, 'base' there\\)"):
        m.main(run)
    configured(greedy, prompt_template="short", max_new_tokens=1024)
    with pytest.raises(ScriptError, match="max_new_tokens 256 in the samples, 1024 there"):
        m.main(run)
    for config in ({"prompt_template": "short", "max_new_tokens": 256}, {}):
        configured(greedy, **config)
        m.main(run)


def test_sizes_above_every_k_are_refused(tmp_path):
    """The sampled file has k=4: --sizes 8 would draw nothing (the table's column empty); 0 is refused too."""
    m = script()
    sampled = write(tmp_path / "s.json", **SAMPLED)
    greedy = write(tmp_path / "g.json", [[1.0], [0.1], [0.0]], [[8]] * 3, k=1, mode="greedy")
    with pytest.raises(ScriptError, match="--sizes 8 16: more than every model's samples per task \\(k 4\\)"):
        m.main(["--model", f"m={sampled},{greedy}", "--sizes", "1", "8", "16", "--plot", str(tmp_path / "p.png")])
    with pytest.raises(ScriptError, match="--sizes must be >= 1"):
        m.main(["--model", f"m={sampled},{greedy}", "--sizes", "0", "--plot", str(tmp_path / "p.png")])
    with pytest.raises(ScriptError,
                       match="--plot .*study.md: name a .png, .pdf or .svg file"):  # found before any output
        m.main([
            "--model", f"m={sampled},{greedy}", "--markdown",
            str(tmp_path / "s.md"), "--plot",
            str(tmp_path / "study.md")
        ])
    assert not (tmp_path / "s.md").exists()
    with pytest.raises(ScriptError, match="expected two different --model names"):
        m.main(["--model", f"m={sampled},{greedy}", "--versus", "m", "m", "--plot", str(tmp_path / "p.png")])


def test_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    """As a program (run_script): a refusal, a bad file and a bad flag each print one line and exit 2."""
    m = script()
    sampled = write(tmp_path / "s.json", **SAMPLED)
    (tmp_path / "bad.json").write_text('{"num_tasks": 3, "k": ')
    for argv, message in ([["--model", f"m={sampled}", "--markdown", sampled], "is the input"
                           ], [["--model", f"m={tmp_path / 'bad.json'}", "--plot",
                                str(tmp_path / "p.png")], "bad.json: not an `rlft eval countdown` JSON"],
                          [["--model", f"m={sampled}", "--sizes", "x"], "argument --sizes: invalid int value"]):
        with pytest.raises(SystemExit) as exit_info:
            m.run_script(m.main, argv, prog="test_time_study.py")
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith(
            "test_time_study.py: error: ") and message in err
