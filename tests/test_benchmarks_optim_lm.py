"""benchmarks/optim_lm.py runs end to end in its quick setting and writes only its own outputs."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_optim_lm_benchmark_quick(tmp_path, load_benchmark) -> None:
    module = load_benchmark("optim_lm")
    (tmp_path / "results.md").write_text("# results\n\nkept text\n")
    cache = tmp_path / "cache"
    assert module.main(["--quick", "--seeds", "0,1", "--cache", str(cache), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "kept text" in text and text.count("<!-- optim_lm:begin -->") == 1
    assert "python benchmarks/optim_lm.py --quick --seeds 0,1 --out" in text and "| alice |" in text
    assert "--cache" not in text and "| mean |" in text
    report = json.loads((tmp_path / "results" / "optim_lm.json").read_text())
    rows = report["summary"]["rows"]
    assert {"adamw", "racs", "alice"} <= set(rows) and rows["adamw"]["state_vs_adamw"] == 1.0
    assert all(r["held_out_loss"] < 5.0 for r in rows.values())  # every optimizer learned (init: ~5.55)
    assert rows["racs"]["state_vs_adamw"] < 0.5
    assert set(report["summary"]["seeds"]) == {"0", "1"} and len(list(cache.glob("*.json"))) == 6
    assert report["summary"]["seeds"]["0"]["alice"]["held_out_loss"] == rows["alice"]["held_out_loss"]
    assert (tmp_path / "img" / "optim_lm_loss.png").stat().st_size > 10_000
    module.main(["--quick", "--seeds", "0,1", "--cache", str(cache), "--out", str(tmp_path)])  # from the cache
    assert json.loads((tmp_path / "results" / "optim_lm.json").read_text())["summary"]["rows"] == rows
    module.main(["--quick", "--out", str(tmp_path)])  # a rerun replaces the section
    assert (tmp_path / "results.md").read_text().count("<!-- optim_lm:begin -->") == 1


def test_sweep_extends_past_a_winning_edge(load_benchmark) -> None:
    module = load_benchmark("optim_lm")
    ladder = [0.01, 0.02, 0.05, 0.1, 0.2]
    calls = []

    def run(lr: float) -> dict:  # training loss lowest at lr 0.1
        calls.append(lr)
        return {"lr": lr, "diverged": None, "select_train_loss": abs(lr - 0.1)}

    runs = module.sweep_lrs("racs", [0.01, 0.02, 0.05], ladder, run)
    assert calls == [0.01, 0.02, 0.05, 0.1, 0.2] and [r["lr"] for r in runs] == calls
    calls.clear()
    module.sweep_lrs("racs", [0.05, 0.1, 0.2], ladder, run)  # winner inside: nothing added
    assert calls == [0.05, 0.1, 0.2]
    calls.clear()

    def low(lr: float) -> dict:  # lowest lr wins: extend downwards to the ladder's end
        calls.append(lr)
        return {"lr": lr, "diverged": None, "select_train_loss": lr}

    runs = module.sweep_lrs("racs", [0.05, 0.1], ladder, low)
    assert calls == [0.05, 0.1, 0.02, 0.01] and [r["lr"] for r in runs] == [0.01, 0.02, 0.05, 0.1]


def test_steps_to_reach(load_benchmark) -> None:
    module = load_benchmark("optim_lm")
    history = [{"step": 25, "held_out_loss": 2.0}, {"step": 50, "held_out_loss": 1.6},
               {"step": 75, "held_out_loss": 1.2}]
    assert module.steps_to_reach(history, 1.5) == 75
    assert module.steps_to_reach_interpolated(history, 1.5) == pytest.approx(56.25)
    assert module.steps_to_reach_interpolated(history, 2.5) == 25.0
    assert module.steps_to_reach(history, 1.0) is None and module.steps_to_reach_interpolated(history, 1.0) is None
