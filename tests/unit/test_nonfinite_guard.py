"""No NaN model saved as a success: ``--dtype float16`` training is refused (float16 weights, no float32 master copy),
and the shared training step stops on a non-finite loss or gradient norm before the update is applied, naming the
step and the quantity, with no final model written and the last good checkpoint intact."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import rlft.recipes.sft as sft_recipe
from rlft.checkpoint import MetricsLog, checkpoint_folders, checkpoint_problem
from rlft.cli import main
from rlft.models import DeviceSpec
from rlft.options import OptimizerOptions
from rlft.precision import NonFiniteError, check_training_dtype, non_finite_tensors
from rlft.recipes.common import TrainingSetup, check_finite_weights, optimizer_step, prepare_training, save_final
from rlft.recipes.optim import make_scheduler
from rlft.validation import OptionError

pytestmark = pytest.mark.usefixtures("one_thread")


def run_cli(capsys, *args) -> tuple[int, list[str]]:
    """``rlft args...`` in-process: (exit code, the stderr lines)."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


# --------------------------------------------------------------------------- float16 weights are not trained


@pytest.mark.parametrize("command", ["sft", "dpo", "rm", "rl", "rloo"])
def test_float16_training_is_refused_at_parse_time(command, tmp_path, capsys):
    """Every training command, --dry-run or not: exit 2, one line naming --dtype, no folder made."""
    for dry in ([], ["--dry-run"]):
        code, err = run_cli(capsys, command, "--dtype", "float16", "--output-dir", tmp_path / "run", *dry)
        assert code == 2 and len(err) == 1 and err[0].startswith(
            f"rlft {command}: error: --dtype float16 would train float16 weights")
        assert "bfloat16 or float32" in err[0]
    assert not (tmp_path / "run").exists()


def test_float16_weights_are_refused_by_prepare_training(tmp_path, tiny_model_dir):
    """Programmatic use (a config built in code, no command line): refused before the model loads."""
    with pytest.raises(OptionError, match="--dtype float16"):
        prepare_training(str(tiny_model_dir), tmp_path, DeviceSpec(torch.device("cpu"), torch.float16),
                         OptimizerOptions(), resume=False, total_steps=1)
    check_training_dtype("bfloat16")  # bfloat16 has float32's range: trained as before
    check_training_dtype(torch.float32)
    check_training_dtype("auto")


def test_demo_refuses_float16_before_anything_runs(tmp_path):
    from rlft.lab.demo import DemoConfig, run_demo

    with pytest.raises(OptionError, match="--dtype float16"):
        run_demo(DemoConfig(dtype="float16", output_dir=str(tmp_path / "demo"), quick=True))
    assert not (tmp_path / "demo").exists()


# --------------------------------------------------------------------------- the guarded step, by hand


def linear_setup(tmp_path: Path, run_dir: Path | None = None) -> TrainingSetup:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = make_scheduler("constant", optim, 0, 10)
    return TrainingSetup(model, optim, sched, 4, MetricsLog(tmp_path / "metrics.jsonl"), None, run_dir, 4)


@pytest.mark.parametrize("poison, loss, message", [
    ("grad", None, "step 5: gradient norm is nan"),
    ("inf-grad", 1.0, "step 5: gradient norm is inf"),
    (None, float("nan"), "step 5: loss is nan"),
    (None, float("inf"), "step 5: loss is inf"),
    (None, torch.tensor(float("-inf")), "step 5: loss is -inf"),
])
def test_a_non_finite_step_raises_before_the_update(tmp_path, poison, loss, message):
    """Resumed at step 4, the fifth step's gradient (or loss) is not finite: NonFiniteError names step 5 and the
    quantity; the weights, the learning rate schedule and the optimizer state are untouched."""
    setup = linear_setup(tmp_path)
    before = {k: v.clone() for k, v in setup.model.state_dict().items()}
    setup.model(torch.ones(1, 3)).sum().backward()
    if poison:
        setup.model.weight.grad[0, 0] = float("nan") if poison == "grad" else float("inf")
    with pytest.raises(NonFiniteError, match=f"^{message}; there is no checkpoint; no final model was written$"):
        optimizer_step(setup, 1.0, loss=loss)
    assert all(torch.equal(before[k], v) for k, v in setup.model.state_dict().items())
    assert setup.scheduler.last_epoch == 0 and not setup.optimizer.state


def test_a_finite_step_updates_and_counts_from_checkpoint_if_due(tmp_path):
    """The step named is the one under way: checkpoint_if_due records each finished step."""
    from types import SimpleNamespace

    from rlft.recipes.common import checkpoint_if_due

    setup = linear_setup(tmp_path)
    setup.model(torch.ones(1, 3)).sum().backward()
    before = setup.model.weight.detach().clone()
    info = optimizer_step(setup, 1.0, loss=0.5)
    assert math.isfinite(info["grad_norm"]) and not torch.equal(before, setup.model.weight)
    checkpoint_if_due(setup, tmp_path, 5, 10, None, SimpleNamespace(save_every=0, keep_checkpoints=1))
    setup.model(torch.ones(1, 3)).sum().backward()
    with pytest.raises(NonFiniteError, match="^step 6: loss is nan"):
        optimizer_step(setup, 1.0, loss=float("nan"))


def test_non_finite_weights_are_never_saved(tmp_path, smol_tokenizer):
    """Weights holding NaN are not written as the final model, and the message names the tensor and what stays."""
    from tests.conftest import make_tiny_model

    model = make_tiny_model(len(smol_tokenizer))
    assert non_finite_tensors(model.named_parameters()) == []
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    assert non_finite_tensors(model.named_parameters()) == ["model.layers.1.mlp.up_proj.weight"]
    (tmp_path / "checkpoints" / "step-4").mkdir(parents=True)
    with pytest.raises(
            NonFiniteError, match=r"^the weights hold NaN or infinite values \(model.layers.1.mlp.up_proj.weight\); "
            r"the last good checkpoint .*checkpoints/step-4 stays"):
        save_final(tmp_path, model, smol_tokenizer)
    assert not (tmp_path / "model").exists()
    with pytest.raises(NonFiniteError, match="^step 7: the weights hold NaN"):
        check_finite_weights(model, linear_setup(tmp_path, tmp_path), 7)


# --------------------------------------------------------------------------- end to end: rlft sft


def sft_args(model_dir: Path, out: Path) -> list:
    return [
        "sft", "--model", model_dir, "--data", "countdown", "--preset", "tiny", "--num-train", 16, "--prompt-template",
        "short", "--output-dir", out, "--max-length", 96, "--batch-size", 4, "--micro-batch-size", 4, "--max-steps", 4,
        "--save-every", 1, "--keep-checkpoints", 5, "--lr", 1e-3, "--device", "cpu", "--dtype", "float32"
    ]


@pytest.mark.parametrize("quantity", ["loss", "gradient norm"])
def test_rlft_sft_stops_at_the_bad_step_and_keeps_the_last_good_checkpoint(tiny_model_dir, tmp_path, capsys,
                                                                           monkeypatch, quantity):
    """Step 3's loss (or one gradient) is NaN: exit 1, one line naming step 3 and the quantity; checkpoints 1 and 2
    stay complete and finite, no step-3 checkpoint, no final model, no metrics record for step 3."""
    real = sft_recipe.sft_backward
    calls = []

    def poisoned(model, examples, *args, **kwargs):
        loss, seen = real(model, examples, *args, **kwargs)
        calls.append(1)
        if len(calls) == 3:
            if quantity == "loss":
                return float("nan"), seen
            next(p for p in model.parameters() if p.requires_grad).grad.view(-1)[0] = float("nan")
        return loss, seen

    monkeypatch.setattr(sft_recipe, "sft_backward", poisoned)
    out = tmp_path / "run"
    code, err = run_cli(capsys, *sft_args(tiny_model_dir, out))
    last = out / "checkpoints" / "step-00000002"
    assert code == 1 and err[-1] == (
        f"rlft sft: error: step 3: {quantity} is nan; the last good checkpoint {last} stays "
        "(--resume continues from it); no final model was written")
    assert [c.name for c in checkpoint_folders(out)] == ["step-00000002", "step-00000001"
                                                         ] and checkpoint_problem(last) is None
    from safetensors.torch import load_file

    assert non_finite_tensors(load_file(last / "model.safetensors").items()) == []
    assert not (out / "model").exists()
    steps = [line for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(steps) == 2

    # The run resumes from the last good checkpoint once the cause is gone.
    monkeypatch.setattr(sft_recipe, "sft_backward", real)
    code, err = run_cli(capsys, *sft_args(tiny_model_dir, out), "--resume")
    assert code == 0 and (out / "model" / "config.json").is_file()
