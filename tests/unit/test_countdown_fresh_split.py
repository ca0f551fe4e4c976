"""The fresh held-out block of pool.parquet (rlft.tasks.countdown.splits.FRESH): recognised by its rows, deterministic,
disjoint, the right sizes, a training pool without held-out tasks, and test looks counted apart in the ledger."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

import rlft.tasks.countdown.fresh_rows as fresh_rows
import rlft.tasks.countdown.splits as splits
from rlft.tasks.countdown.generator import task_key
from rlft.tasks.countdown.loaders import load_countdown
from rlft.tasks.countdown.options import CountdownDataOptions
from rlft.tasks.countdown.splits import FRESH, ORIGINAL, block_of, load_split, rows_sha256
from rlft.types import CountdownTask
from tests.conftest import SHARED_DATA

POOL = SHARED_DATA / "countdown" / "pool.parquet"
TRAIN = SHARED_DATA / "countdown" / "train.parquet"
needs_shared = pytest.mark.skipif(not (POOL.is_file() and TRAIN.is_file()), reason="needs ../shared/data/countdown")


def rows(n: int, seed: int = 0) -> list[CountdownTask]:
    rng = random.Random(seed)
    return [CountdownTask(tuple(rng.randint(1, 99) for _ in range(3 + i % 2)), rng.randint(10, 100)) for i in range(n)]


def write_jsonl(path, tasks):
    path.write_text("".join(json.dumps({"target": t.target, "nums": list(t.nums)}) + "\n" for t in tasks))
    return str(path)


def test_rows_sha256_by_hand():
    """One line "target:n1,n2,...\\n" per row, numbers in the row's order: hashlib on the same bytes."""
    tasks = [CountdownTask((3, 5, 7), 22), CountdownTask((1, 2, 3, 4), 10)]
    assert rows_sha256(tasks) == hashlib.sha256(b"22:3,5,7\n10:1,2,3,4\n").hexdigest()
    assert rows_sha256(tasks[::-1]) != rows_sha256(tasks)  # order matters
    assert rows_sha256([CountdownTask((5, 3, 7), 22), tasks[1]]) != rows_sha256(tasks)


def test_the_pool_is_recognised_by_its_rows_not_its_name(tmp_path, monkeypatch):
    """A small stand-in for pool.parquet (the constants patched to its rows): any file with exactly these rows gets the
    fresh block, whatever its name; one row more or changed gets the original block. The unused rows (equal to a
    train.parquet task) are neither held out nor trained on, nor is a later row repeating them; a ``limit`` does not
    change the split."""
    tasks = rows(1200, seed=5)
    tasks[900] = CountdownTask(tuple(reversed(tasks[7].nums)), tasks[7].target)  # repeats unused row 7's task
    monkeypatch.setattr(splits, "FRESH_POOL_ROWS", len(tasks))
    monkeypatch.setattr(splits, "FRESH_POOL_SHA256", rows_sha256(tasks))
    monkeypatch.setattr(splits, "FRESH", splits.HeldoutBlock("fresh", 40, 30, 99, None))
    monkeypatch.setattr(fresh_rows, "POOL_ROWS_IN_TRAIN", (3, 7))
    split = load_split(write_jsonl(tmp_path / "anything.jsonl", tasks))
    assert split.heldout == "fresh" and len(split.test) == 40 and len(split.validation) == 30
    unused = {task_key(tasks[3]), task_key(tasks[7])}
    held = split.heldout_keys()
    assert not unused & held and not unused & {task_key(t) for t in split.train}
    assert split.train == [t for t in tasks if task_key(t) not in held | unused]
    assert len(split.train) == 1200 - 70 - 3  # rows 3, 7 and 900 unused
    assert load_split(write_jsonl(tmp_path / "a.jsonl", tasks), limit=50) == split
    assert load_split(write_jsonl(tmp_path / "b.jsonl", tasks + tasks[:1])).heldout == "original"
    changed = [*tasks[:-1], CountdownTask((1, 2, 3), 6)]
    other = load_split(write_jsonl(tmp_path / "c.jsonl", changed))
    assert other.heldout == "original" and len(other.test) == 500 and len(other.validation) == 500
    assert CountdownDataOptions(data=str(tmp_path / "anything.jsonl")).heldout_block() == "fresh"
    assert CountdownDataOptions(data=str(tmp_path / "c.jsonl")).heldout_block() == "original"
    assert CountdownDataOptions().heldout_block() is None


def test_blocks_as_defined():
    assert (FRESH.n_test, FRESH.n_validation, FRESH.seed, FRESH.pool) == (1000, 1000, 7373, None)
    assert (ORIGINAL.n_test, ORIGINAL.n_validation, ORIGINAL.seed, ORIGINAL.pool) == (500, 500, 1234, 10_240)
    assert block_of(rows(100)) == ORIGINAL


@needs_shared
def test_pool_file_claims():
    """The issue's claims about pool.parquet: 86,748 rows of 3 and 4 numbers; no row is a row of train.parquet, but
    333 rows (324 tasks) repeat a train.parquet task with the numbers in another order: exactly POOL_ROWS_IN_TRAIN."""
    pool, train = load_countdown(str(POOL)), load_countdown(str(TRAIN))
    assert len(pool) == 86_748 and {len(t.nums) for t in pool} == {3, 4}
    assert sum(len(t.nums) == 4 for t in pool) == 43_995
    assert not {(t.nums, t.target) for t in pool} & {(t.nums, t.target) for t in train}
    train_keys = {task_key(t) for t in train}
    seen = tuple(i for i, t in enumerate(pool) if task_key(t) in train_keys)
    assert seen == fresh_rows.POOL_ROWS_IN_TRAIN and len(seen) == 333
    assert len({task_key(pool[i]) for i in seen}) == 324


@needs_shared
def test_fresh_split_of_the_pool_is_fixed_disjoint_and_sized():
    """The fresh block: 1,000 test and 1,000 validation rows, 500 of each count of numbers, distinct tasks, disjoint
    from each other, from every train.parquet task (so from the original held-out rows too), and from the training
    pool; the pool's training rows hold no original held-out task either. The row indices (first occurrence in the
    file) are recorded by hand (first six) and by the SHA-256 of the whole list."""
    pool = load_countdown(str(POOL))
    split = load_split(str(POOL))
    assert split.heldout == "fresh" and len(split.test) == len(split.validation) == 1000
    for part in (split.test, split.validation):
        assert sum(len(t.nums) == 3 for t in part) == 500 and len({task_key(t) for t in part}) == 1000
        assert [len(t.nums) for t in part[:4]] == [3, 4, 3, 4]
    first = {}
    for i, t in enumerate(pool):
        first.setdefault(t, i)
    test_rows, validation_rows = [first[t] for t in split.test], [first[t] for t in split.validation]
    assert test_rows[:6] == [54074, 31176, 34511, 74508, 1667, 43687]
    assert validation_rows[:6] == [54843, 13712, 70427, 5237, 20967, 30034]
    assert pool[54074] == CountdownTask((67, 6, 52), 90) and pool[31176] == CountdownTask((33, 54, 17, 5), 88)
    digest = lambda rows_: hashlib.sha256(",".join(map(str, rows_)).encode()).hexdigest()  # noqa: E731
    assert digest(test_rows) == "bfc6343c26cb091c1da0d0f25f264cf2af583c1ffbef86535a9377c667ee9f75"
    assert digest(validation_rows) == "8af716a70d321b5339bd614c46df4d326e1109a876d78a0ac4bb7831e0cda9da"
    test_keys, validation_keys = {task_key(t) for t in split.test}, {task_key(t) for t in split.validation}
    assert not test_keys & validation_keys
    train_keys = {task_key(t) for t in split.train}
    assert not train_keys & (test_keys | validation_keys)
    every_old_task = {task_key(t) for t in load_countdown(str(TRAIN))}
    assert not every_old_task & (test_keys | validation_keys)
    assert not train_keys & load_split(str(TRAIN)).heldout_keys()  # the development rows stay out of training
    unused = {task_key(pool[i]) for i in fresh_rows.POOL_ROWS_IN_TRAIN}
    assert split.train == [t for t in pool if task_key(t) not in test_keys | validation_keys | unused]
    assert len(split.train) == 84_343
    assert load_split(str(TRAIN)).heldout == "original"  # the original block is unchanged (its test rows: 500)


@needs_shared
def test_training_tasks_from_the_pool_exclude_both_heldout_parts():
    """rl and pairs countdown with --data pool.parquet: training rows are the pool's, the in-loop held-out rows its
    fresh part; no training task is a held-out one."""
    from rlft.tasks.countdown.options import CountdownTrainingOptions

    train, held = CountdownTrainingOptions(data=str(POOL)).training_tasks(5000, heldout="test")
    split = load_split(str(POOL))
    assert held == split.test and train == split.train[:5000]
    assert not {task_key(t) for t in train} & split.heldout_keys()


def test_ledger_counts_fresh_and_original_test_looks_apart(tmp_path, capsys):
    """`rlft eval ledger` prints the looks per test rows: a look records its block (``heldout``); a line written
    before the field with a --data file was of the original rows, one without --data of generated tasks."""
    from rlft.cli import main
    from rlft.eval.countdown import summarize
    from rlft.lab.ledger import LEDGER_NAME, looked_rows, read_looks, record_test_look

    result = summarize("greedy", task_scores=[[1.0], [0.0]], tasks=[{"nums": [1, 2, 3], "target": 6}] * 2,
                       task_truncated=[[False]] * 2, task_tokens=[[5]] * 2, task_values=[[None]] * 2,
                       task_certainty=[[None]] * 2)
    ledger = tmp_path / LEDGER_NAME
    ledger.write_text(json.dumps({"time": "t0", "score": 0.5, "split": "test", "data": "train.parquet"}) + "\n")
    for heldout, data in (("fresh", "pool.parquet"), ("original", "train.parquet"), ("fresh", "pool.parquet"),
                          (None, None)):
        config = {"model": "m", "model_sha256": "ab" * 32, "split": "test", "data": data, "heldout": heldout}
        record_test_look(result, config, ledger)
    looks = read_looks(ledger)
    assert [r.get("heldout") for r in looks] == [None, "fresh", "original", "fresh", None]
    assert [looked_rows(r) for r in looks] == ["original", "fresh", "original", "fresh", "generated"]
    capsys.readouterr()
    main(["eval", "ledger", str(ledger)])
    assert capsys.readouterr().out.splitlines()[-1] == "looks by test rows: original 2, fresh 2, generated 1"


def test_eval_countdown_records_which_test_rows_it_looked_at(tmp_path, monkeypatch, smol_tokenizer):
    """End to end on a tiny random model: `rlft eval countdown --data <pool> --split test` scores the fresh test rows
    and its ledger line and output config say ``heldout: fresh``; another file's test rows say ``original``."""
    import torch

    from rlft.eval.countdown_command import EvalCountdownConfig
    from rlft.lab.ledger import read_looks
    from rlft.lab.test_looks import run_eval_countdown_counted
    from tests.conftest import make_tiny_model

    tasks = rows(1200, seed=5)
    monkeypatch.setattr(splits, "FRESH_POOL_ROWS", len(tasks))
    monkeypatch.setattr(splits, "FRESH_POOL_SHA256", rows_sha256(tasks))
    monkeypatch.setattr(splits, "FRESH", splits.HeldoutBlock("fresh", 40, 30, 99, None))
    monkeypatch.setattr(fresh_rows, "POOL_ROWS_IN_TRAIN", (3, 7))
    pool = write_jsonl(tmp_path / "pool.jsonl", tasks)
    other = write_jsonl(tmp_path / "other.jsonl", tasks[:-1])
    model_dir = tmp_path / "tiny"
    make_tiny_model(len(smol_tokenizer)).save_pretrained(model_dir)
    smol_tokenizer.save_pretrained(model_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for data, name in ((pool, "a"), (other, "b")):
            out = tmp_path / "evals" / f"{name}.json"
            result = run_eval_countdown_counted(EvalCountdownConfig(model=str(model_dir), data=data, split="test",
                                                                    limit=2, max_new_tokens=2, device="cpu",
                                                                    output=str(out)))
            assert json.loads(out.read_text())["config"]["heldout"] == ("fresh" if name == "a" else "original")
            if name == "a":
                assert [(e["nums"], e["target"]) for e in result.examples] == \
                    [(list(t.nums), t.target) for t in load_split(pool).test[:2]]
    finally:
        torch.set_num_threads(threads)
    looks = read_looks(tmp_path / "evals" / "test_looks.jsonl")
    assert [r["heldout"] for r in looks] == ["fresh", "original"]
