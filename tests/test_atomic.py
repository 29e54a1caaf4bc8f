"""veil.atomic: readers see the old file or folder or the whole new one, never a half; killed writers' temporaries
are swept."""

from __future__ import annotations

import os

import pytest

from veil.atomic import write_atomic


def test_write_atomic_replaces_whole_file_and_leaves_no_temp(tmp_path) -> None:
    target = tmp_path / "sub" / "f.json"
    write_atomic(target, "old")
    write_atomic(target, b"new")
    assert target.read_text() == "new"
    assert os.listdir(target.parent) == ["f.json"]


def test_atomic_dir_swaps_whole_folders_and_keeps_the_old_one_on_error(tmp_path) -> None:
    from veil.atomic import atomic_dir

    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("v1")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("crash while writing")
    assert (target / "a.txt").read_text() == "v1"  # untouched by the failed write
    with atomic_dir(target) as tmp:
        (tmp / "b.txt").write_text("v2")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary or old folders left


# -- crash safety of atomic writes (issue 19, item 14) -------------------------------------------------------------
_KILLER = r"""
import os, shutil, signal, sys
from pathlib import Path
import veil.atomic as atomic

target, version, die_at, no_exchange = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
calls = [0]

def step(fn):
    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == die_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a kill *before* this filesystem step
        return fn(*args, **kwargs)
    return wrapped

os.rename, os.replace, shutil.rmtree = step(os.rename), step(os.replace), step(shutil.rmtree)
atomic._exchange = step((lambda a, b: False) if no_exchange else atomic._exchange)
with atomic.atomic_dir(target) as tmp:
    for i in range(3):
        (tmp / f"part{i}.txt").write_text(version)
"""


def _run_killed_writer(tmp_path, target, version: str, die_at: int, no_exchange: bool) -> int:
    import subprocess
    import sys

    script = tmp_path / "writer.py"
    script.write_text(_KILLER)
    return subprocess.run([sys.executable, str(script), str(target), version, str(die_at), str(int(no_exchange))],
                          capture_output=True, timeout=60).returncode


def _whole_version(target) -> str | None:
    """The version every part of ``target`` holds, or None when it is missing or mixed."""
    if not target.is_dir():
        return None
    parts = {p.read_text() for p in target.iterdir()}
    return parts.pop() if len(parts) == 1 and len(list(target.iterdir())) == 3 else None


@pytest.mark.parametrize("die_at", [1, 2, 3, 4])
def test_a_writer_killed_at_any_step_leaves_the_old_folder_or_the_new_one(tmp_path, die_at: int) -> None:
    """SIGKILL before each filesystem step of the publish: ``final`` is always one whole version, never none
    (the two-rename swap left nothing when killed between its renames), and the next write sweeps the leftovers."""
    from veil.atomic import atomic_dir

    target = tmp_path / "repo" / "model"
    assert _run_killed_writer(tmp_path, target, "v1", 0, False) == 0
    _run_killed_writer(tmp_path, target, "v2", die_at, False)
    assert _whole_version(target) in ("v1", "v2")
    with atomic_dir(target) as tmp:
        for i in range(3):
            (tmp / f"part{i}.txt").write_text("v3")
    assert _whole_version(target) == "v3"
    assert sorted(p.name for p in target.parent.iterdir()) == ["model"]  # killed writer's temporaries swept


def test_without_folder_exchange_a_kill_between_the_renames_is_repaired_on_the_next_write(tmp_path) -> None:
    """The fallback for filesystems without RENAME_EXCHANGE: the old folder moved aside is put back."""
    from veil.atomic import sweep_stale

    target = tmp_path / "model"
    assert _run_killed_writer(tmp_path, target, "v1", 0, True) == 0
    assert _run_killed_writer(tmp_path, target, "v2", 3, True) != 0  # killed between os.rename #1 and #2
    assert not target.exists()
    sweep_stale(tmp_path)
    assert _whole_version(target) == "v1"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_replacing_a_folder_swaps_in_one_step(tmp_path, monkeypatch) -> None:
    """With the old folder present, publishing makes no os.rename / os.replace call at all (one exchange)."""
    from veil import atomic

    target = tmp_path / "model"
    with atomic.atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("v1")

    def refuse(*args, **kwargs):
        raise AssertionError("a second, separate rename step")

    monkeypatch.setattr(os, "rename", refuse)
    monkeypatch.setattr(os, "replace", refuse)
    with atomic.atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("v2")
    assert (target / "a.txt").read_text() == "v2"


def test_stale_temporaries_of_dead_or_old_writers_are_swept_live_ones_kept(tmp_path) -> None:
    import subprocess
    import sys
    import time

    from veil.atomic import HOST, STALE_AFTER_S, write_atomic

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale_dir = tmp_path / f".model.tmp-{HOST}-{dead}-0123abcd"
    stale_file = tmp_path / f".f.json.tmp-{HOST}-{dead}-89abcdef"
    live = tmp_path / f".other.tmp-{HOST}-{os.getpid()}-00000000"
    old = tmp_path / f".aged.tmp-{HOST}-{os.getpid()}-11111111"
    elsewhere = tmp_path / f".remote.tmp-{'0000' if HOST != '0000' else '0001'}-{dead}-22222222"  # another host
    legacy = tmp_path / ".f.json.k3j_x9aq.tmp"  # mkstemp name of earlier releases
    stale_dir.mkdir()
    (stale_dir / "model.onnx").write_bytes(b"half")
    for path in (stale_file, live, old, elsewhere, legacy):
        path.write_text("x")
    hour_ago = time.time() - STALE_AFTER_S - 60
    os.utime(old, (hour_ago, hour_ago))
    os.utime(legacy, (hour_ago, hour_ago))
    unrelated = tmp_path / ".hidden-by-the-user"
    unrelated.write_text("keep")
    write_atomic(tmp_path / "f.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["f.json", live.name, elsewhere.name, unrelated.name])


def test_files_and_folders_follow_the_umask_and_an_explicit_mode(tmp_path) -> None:
    from veil.atomic import atomic_dir

    previous = os.umask(0o022)
    try:
        write_atomic(tmp_path / "plain.txt", "x")
        write_atomic(tmp_path / "secret.bin", b"k", mode=0o600)
        with atomic_dir(tmp_path / "folder") as tmp:
            (tmp / "a.txt").write_text("y")
        os.umask(0o077)
        write_atomic(tmp_path / "private.txt", "z")
    finally:
        os.umask(previous)
    mode = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert mode == {"plain.txt": 0o644, "secret.bin": 0o600, "folder": 0o755, "private.txt": 0o600}
