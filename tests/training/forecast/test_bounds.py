"""`veil train forecast` refuses, before building any array, a fit that would not fit in memory, and a CSV whose
header repeats a column name (issue 31 items 9 and 15)."""

from __future__ import annotations

import numpy as np
import pytest
from veil.training.forecast import trainer
from veil.training.forecast.config import ForecastDataConfig, ForecastFitConfig, ForecastModelConfig
from veil.training.forecast.data import Series, load_csv

from veil.cli import main


@pytest.fixture
def splits_built(monkeypatch) -> list[int]:
    """How many times the windows were built (make_splits is where the fit's arrays start)."""
    calls: list[int] = []
    real = trainer.make_splits
    monkeypatch.setattr(trainer, "make_splits", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize(("steps", "channels", "layout", "lookback", "fit"), [
    (400, 5000, "mixed", 24, "ols"),  # 12.5 GB before a raw traceback
    (200_000, 1, "shared", 4000, "rrr"),  # grew to 15 GB and was killed by the kernel
])
def test_a_fit_beyond_the_memory_budget_is_refused_before_any_array(splits_built, steps, channels, layout, lookback,
                                                                    fit) -> None:
    series = Series(np.zeros((steps, channels)), [f"c{i}" for i in range(channels)], [], "big")
    model = ForecastModelConfig(lookback=lookback, horizon=24, channels=layout)
    with pytest.raises(ValueError, match=r"fitting needs about [\d.]+ GiB .* expected at most 4\.0 GiB "
                                         r"\(--max-memory-gb\); lower --lookback"):
        trainer.train_forecaster(series, model, ForecastFitConfig(fit=fit), ForecastDataConfig(),
                                 max_memory_bytes=4 * 2**30)
    assert splits_built == []


def test_the_estimate_bounds_a_real_fit_and_small_fits_pass(splits_built) -> None:
    series = Series(np.random.default_rng(0).normal(size=(3000, 3)).cumsum(0), ["a", "b", "c"], [], "s")
    model, fit, data = ForecastModelConfig(lookback=48, horizon=12), ForecastFitConfig(fit="rrr"), ForecastDataConfig()
    need = trainer.fit_memory_bytes(3000, 3, model, fit, data)
    assert 2**20 < need < 2**28
    trainer.train_forecaster(series, model, fit, data, max_memory_bytes=need)
    assert splits_built == [1]


def test_cli_refusal_is_one_line_naming_the_flag(tmp_path, capsys) -> None:
    header = "date," + ",".join(f"c{i}" for i in range(300))
    rows = [f"2020-01-{1 + i % 28:02d}," + ",".join(str((i * j) % 7) for j in range(300)) for i in range(120)]
    (tmp_path / "wide.csv").write_text("\n".join([header, *rows]) + "\n")
    assert main(["train", "forecast", "--data", str(tmp_path / "wide.csv"), "--channels", "mixed", "--lookback", "24",
                 "--horizon", "6", "--max-memory-gb", "1", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-memory-gb" in err and "--channels mixed" in err
    assert not (tmp_path / "out").exists()


def test_duplicate_column_names_are_refused(tmp_path) -> None:
    """Issue 31 item 15: a CSV with two columns named 'a' silently used the first one twice."""
    (tmp_path / "dup.csv").write_text("date,a,b,a\n2020-01-01,1,2,3\n2020-01-02,4,5,6\n")
    with pytest.raises(ValueError, match=r"header expected distinct column names, received \['a'\] more than once"):
        load_csv(tmp_path / "dup.csv")
    (tmp_path / "ok.csv").write_text("date,a,b\n2020-01-01,1,2\n2020-01-02,4,5\n")
    with pytest.raises(ValueError, match="--columns: expected distinct channel names"):
        load_csv(tmp_path / "ok.csv", channels=["a", "a"])
    assert load_csv(tmp_path / "ok.csv").channels == ["a", "b"]
