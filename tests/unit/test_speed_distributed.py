"""``--max-tokens-per-micro-batch`` and ``--compile`` under torchrun with FSDP2 (gloo, CPU, 2 processes): the ranks
cut their shards into different numbers of micro-batches (the one with fewer runs filler passes, or FSDP2's
collectives would hang), the compiled layers keep FSDP2's hooks, and the run equals the one-process run."""

from __future__ import annotations

import pytest

from rlft import distributed
from rlft.recipes.memory import COMPILE_BACKEND_ENV, cut_by_tokens, padded_tokens
from rlft.recipes.sft import load_sft_examples, train_sft

from tests.conftest import write_jsonl_rows
from tests.unit.test_distributed import NORM_RTOL, assert_same_run, sft_cfg, torchrun


def rows() -> list[dict]:
    sizes = [(3, 2), (4, 3), (5, 3), (6, 20), (5, 24), (7, 30)]  # (prompt words, completion words)
    return [{"prompt": "Q:" + " cat" * p + "\nA:", "completion": " dog" * c} for p, c in sizes]


@pytest.mark.parametrize("compile_", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_fsdp2_token_budget_two_processes_equal_one(tiny_model_dir, tmp_path, monkeypatch, smol_tokenizer, compile_):
    """Without --compile ~16 s; with it (aot_eager) ~50 s, so that case is marked slow."""
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "aot_eager")  # torchrun's workers inherit it
    data = write_jsonl_rows(tmp_path / "sft.jsonl", rows())
    options = dict(data=str(data), data_format="prompt_completion", batch_size=6, max_steps=2, save_every=0,
                   distributed="fsdp2", compile=compile_)
    examples, _ = load_sft_examples(sft_cfg(tiny_model_dir, tmp_path / "x", **options), smol_tokenizer)
    lengths = sorted(len(e.input_ids) for e in examples)
    shards = [distributed.shard(lengths, r, 2) for r in range(2)]

    def counts(budget: int) -> list[int]:
        return [len(cut_by_tokens(s, padded_tokens, budget)) for s in shards]

    budget = next(b for b in range(8, 400) if len(set(counts(b))) > 1)  # ranks with different numbers of passes
    options["max_tokens_per_micro_batch"] = budget
    train_sft(sft_cfg(tiny_model_dir, tmp_path / "one", **options))
    done = torchrun("sft", sft_cfg(tiny_model_dir, tmp_path / "two", **options))
    assert "FSDP2: 2 decoder layers sharded over 2 ranks" in done.stdout + done.stderr
    assert ("--compile: 2 decoder layers compiled" in done.stdout + done.stderr) == compile_
    assert_same_run(tmp_path / "one", tmp_path / "two", norm_rtol=NORM_RTOL)

