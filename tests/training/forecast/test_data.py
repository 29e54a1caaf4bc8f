"""CSV loading, chronological splits, train-only standardisation and sliding windows, on files made here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from veil.training.forecast import ForecastDataConfig, Series, load_bundled, load_csv, make_splits, windows
from veil.training.forecast.data import split_ranges


def write_csv(path: Path, rows: list[list[object]], header: str = "date,OT,HUFL") -> Path:
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return path


def test_csv_date_column_channels_and_gaps(tmp_path) -> None:
    path = write_csv(tmp_path / "ett.csv", [["2016-07-01 00:00", 1.0, 10], ["2016-07-01 01:00", "", 11],
                                            ["2016-07-01 02:00", 3.0, 12]])
    series = load_csv(path)
    assert series.channels == ["OT", "HUFL"] and series.dates[0] == "2016-07-01 00:00"
    np.testing.assert_array_equal(series.values, [[1, 10], [2, 11], [3, 12]])  # the gap is interpolated
    assert load_csv(path, channels=["HUFL"]).values.shape == (3, 1)
    undated = write_csv(tmp_path / "plain.csv", [[1, 2], [3, 4]], header="a,b")
    assert load_csv(undated).channels == ["a", "b"] and load_csv(undated).dates == []


@pytest.mark.parametrize(("rows", "kwargs", "message"), [
    ([["d", "x", 1]], {}, r"row 2, column 'OT': expected a finite number, received 'x'"),
    ([["d", 1]], {}, r"row 2 has 2 fields, expected 3"),
    ([["d", 1, 2]], {"channels": ["nope"]}, r"channels expected among \['OT', 'HUFL'\], received \['nope'\]"),
    ([["d", 1, 2]], {"date_column": "when"}, r"date column 'when' not in the header"),
])
def test_bad_csv_is_refused_naming_the_field(tmp_path, rows, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_csv(write_csv(tmp_path / "bad.csv", rows), **kwargs)


def test_missing_file_names_the_flag(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="--data"):
        load_csv(tmp_path / "none.csv")


@pytest.mark.parametrize("split", [[0.7, 0.1, 0.2], [0.6, 0.2, 0.2]])
def test_chronological_splits_borrow_the_lookback(split) -> None:
    ranges = split_ranges(1000, 24, split)
    n_train, n_test = int(1000 * split[0]), int(1000 * split[2])
    assert ranges == {"train": (0, n_train), "val": (n_train - 24, 1000 - n_test), "test": (1000 - n_test - 24, 1000)}
    assert split_ranges(1000, 24, split, context=False)["test"] == (1000 - n_test, 1000)


def test_standardisation_uses_the_train_split_only() -> None:
    values = np.arange(200.0)[:, None] * np.array([[1.0, -2.0]])
    series = Series(values, ["a", "b"], [])
    splits = make_splits(series, 8, 2, ForecastDataConfig(split=[0.5, 0.25, 0.25]))
    np.testing.assert_allclose(splits.scaler.mean, values[:100].mean(0))
    np.testing.assert_allclose(splits.scaler.std, values[:100].std(0))
    changed = Series(values.copy(), ["a", "b"], [])
    changed.values[150:] *= 100  # the test split changes, the statistics do not
    np.testing.assert_allclose(make_splits(changed, 8, 2, ForecastDataConfig(split=[0.5, 0.25, 0.25])).scaler.mean,
                               splits.scaler.mean)
    assert len(splits.test.x) == 50 - 2 + 1  # every test step is forecast once as a first step


def test_windows_slide_one_step() -> None:
    values = np.arange(20.0).reshape(10, 2)
    w = windows(values, 3, 2)
    assert w.x.shape == (6, 3, 2) and w.y.shape == (6, 2, 2)
    np.testing.assert_array_equal(w.x[1], values[1:4])
    np.testing.assert_array_equal(w.y[1], values[4:6])
    assert windows(values, 3, 2, stride=2).x.shape[0] == 3
    with pytest.raises(ValueError, match="shorter than lookback"):
        windows(values, 8, 4)


def test_bundled_series_ship_with_statsmodels() -> None:
    co2, elnino = load_bundled("co2"), load_bundled("elnino")
    assert co2.values.shape == (2284, 1) and not np.isnan(co2.values).any()
    assert elnino.values.shape == (732, 1) and elnino.dates[:2] == ["1950-01", "1950-02"]
    with pytest.raises(ValueError, match=r"expected one of \['co2'"):
        load_bundled("ettH1")
