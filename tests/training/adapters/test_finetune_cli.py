"""`veil finetune`: help, tasks, a tiny in-process run that writes a PEFT-layout adapter, and (slow) LoRA beats
the frozen-encoder linear probe."""

from __future__ import annotations

import json

import pytest
from veil.training.adapters.cli import run
from veil.training.adapters.data import TASKS, make_task

from veil.cli import main as veil_main

TINY = ["--train-size", "16", "--val-size", "8", "--test-size", "8", "--epochs", "1", "--no-progress"]


def test_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert veil_main(["finetune", "--help"]) == 0
    out = capsys.readouterr().out
    assert "example:" in out and "--method" in out and "--task" in out


@pytest.mark.parametrize("name", sorted(TASKS))
def test_tasks_are_deterministic_balanced_and_disjoint(name: str) -> None:
    a, b = make_task(name, (200, 50, 50), seed=3), make_task(name, (200, 50, 50), seed=3)
    assert a == b and len(a.test.texts) == 50
    assert not set(a.train.texts) & set(a.test.texts)
    counts = [a.train.labels.count(k) for k in range(len(TASKS[name]))]
    assert min(counts) >= 0.6 * max(counts)


def test_unknown_task_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert veil_main(["finetune", "--task", "poetry"]) == 2
    assert "invalid choice: 'poetry'" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["lora", "psoft"])
def test_tiny_run_writes_a_peft_adapter(method: str, tmp_path) -> None:
    import peft
    from veil.training.adapters.finetune import build_classifier

    metrics = run(["--method", method, "--task", "number", "--out", str(tmp_path / "a"), *TINY])
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and metrics["history"][0]["epoch"] == 1
    folder = tmp_path / "a" if method == "lora" else tmp_path / "a" / "as_lora"
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["modules_to_save"] == ["classifier"]
    base, _ = build_classifier("bundled:all-MiniLM-L6-v2", 2, seed=0)
    loaded = peft.PeftModel.from_pretrained(base, folder)  # the head comes back from modules_to_save
    assert any("classifier" in n for n, _ in loaded.named_parameters())
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["method"] == method


@pytest.mark.slow
def test_lora_beats_the_linear_probe_on_sentiment(tmp_path) -> None:
    probe = run(["--method", "probe", "--task", "sentiment", "--lr", "1e-2", "--epochs", "3",
                 "--out", str(tmp_path / "p"), "--no-progress"])
    lora = run(["--method", "lora", "--task", "sentiment", "--out", str(tmp_path / "l"), "--no-progress"])
    assert lora["test_accuracy"] >= 0.9
    assert lora["test_accuracy"] >= probe["test_accuracy"] + 0.15
