"""Atomic writes (rlft.fsio): the target holds the old or the new content, never a mix; no temp file is left
after a failed write; permissions as a plain write gives them."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from rlft.fsio import atomic_open, atomic_write_bytes, atomic_write_json, atomic_write_text


def test_writes_and_replaces(tmp_path):
    path = tmp_path / "a.txt"
    atomic_write_text(path, "one\n")
    atomic_write_text(path, "two\n")
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\xff")
    atomic_write_json(tmp_path / "c.json", {"x": [1, 2]})
    assert path.read_text() == "two\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert (tmp_path / "c.json").read_text() == json.dumps({"x": [1, 2]}, indent=2) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin", "c.json"]  # no temp files left


def test_a_json_name_ending_gz_is_written_gzip_compressed_and_reproducibly(tmp_path):
    obj = {"task_scores": [[1.0, 0.1]] * 50}
    atomic_write_json(tmp_path / "e.json.gz", obj)
    first = (tmp_path / "e.json.gz").read_bytes()
    assert first[:2] == b"\x1f\x8b"  # the gzip magic
    assert gzip.decompress(first).decode() == json.dumps(obj, indent=2) + "\n"
    atomic_write_json(tmp_path / "e.json.gz", obj)
    assert (tmp_path / "e.json.gz").read_bytes() == first  # no time stamp in the header


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_open(path) as f:
            f.write("half of the new")
            raise RuntimeError("killed")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]
    with pytest.raises(TypeError):
        atomic_write_json(path, {"x": object()})
    assert path.read_text() == "old"


def test_the_temp_file_is_hidden_beside_the_target(tmp_path):
    path = tmp_path / "latest"
    with atomic_open(path) as f:
        (tmp,) = [p for p in tmp_path.iterdir()]
        assert tmp.name.startswith(".latest.") and tmp.name.endswith(".tmp")  # what remove_partial_saves looks for
        f.write("x")
    assert not tmp.exists() and path.read_text() == "x"


def test_permissions_are_those_of_a_plain_write(tmp_path):
    (tmp_path / "plain").write_text("x")
    atomic_write_text(tmp_path / "atomic", "x")
    assert os.stat(tmp_path / "atomic").st_mode == os.stat(tmp_path / "plain").st_mode


def test_bad_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="mode must be 'w' or 'wb'"):
        with atomic_open(tmp_path / "a", "a"):
            pass
