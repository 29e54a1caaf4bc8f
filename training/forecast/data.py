"""Series for the linear forecasters: CSV files, bundled real series, the spec's synthetic series; splits,
train-only standardisation and sliding windows.

CSV format (ETT / Weather / Electricity): a header row, a date column, then one numeric column per channel.

    series = load_csv("ETTh1.csv")                         # date column found by name or as the first column
    splits = make_splits(series, lookback=96, horizon=24, config=ForecastDataConfig(split=[0.6, 0.2, 0.2]))
    splits.train.x.shape                                   # (N, L, C) standardised windows, splits.train.y (N, H, C)
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import ForecastDataConfig

DATE_NAMES = ("date", "datetime", "time", "timestamp")
# bundled series (statsmodels.datasets, shipped inside the PyPI package): name -> seasonal period, about
BUNDLED: dict[str, tuple[int, str]] = {
    "co2": (52, "Mauna Loa weekly CO2, 1958-2001 (2284 weeks; missing weeks linearly interpolated)"),
    "elnino": (12, "monthly sea surface temperature of the El Niño region, 1950-2010 (732 months)"),
    "sunspots": (11, "yearly sunspot activity, 1700-2008 (309 years)"),
    "macrodata": (4, "US quarterly macro series 1959-2009: realgdp, realcons, realinv (log differences x 100)"),
}


@dataclass
class Series:
    """A multichannel series: values (T, C) in time order, channel names and the date strings (may be empty)."""

    values: np.ndarray
    channels: list[str]
    dates: list[str]
    name: str = ""


@dataclass
class Windows:
    """Sliding windows: x (N, L, C) and y (N, H, C), on the standardised scale."""

    x: np.ndarray
    y: np.ndarray


@dataclass
class Standardizer:
    """Per-channel z-score fitted on the train split only: z = (v - mean) / std."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, values: np.ndarray, enabled: bool = True) -> Standardizer:
        c = values.shape[1]
        if not enabled:
            return cls(np.zeros(c), np.ones(c))
        std = values.std(axis=0)
        return cls(values.mean(axis=0), np.where(std > 1e-12, std, 1.0))

    def transform(self, values: np.ndarray) -> np.ndarray:
        return (values - self.mean) / self.std

    def inverse(self, values: np.ndarray) -> np.ndarray:
        return values * self.std + self.mean


@dataclass
class Splits:
    """Windows of the three chronological splits, the standardizer and the row ranges [start, end) used."""

    train: Windows
    val: Windows
    test: Windows
    scaler: Standardizer
    ranges: dict[str, tuple[int, int]]


def load_csv(path: str | Path, date_column: str | None = None, channels: list[str] | None = None) -> Series:
    """Read a long-horizon CSV: a date column (``date_column``, a column named date/time..., else the first
    column if it is not numeric) and numeric channel columns (``channels``: a subset, default all others)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--data: expected a CSV file, {str(path)!r} does not exist")
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = [row for row in csv.reader(handle) if any(cell.strip() for cell in row)]  # blank lines skipped
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{path}: expected a UTF-8 CSV file, {exc}") from None
    if len(rows) < 2:
        raise ValueError(f"{path}: expected a header row and at least one data row, received {len(rows)} rows")
    header, body = [h.strip() for h in rows[0]], rows[1:]
    repeated = sorted({h for h in header if header.count(h) > 1})
    if repeated:  # the first column of a repeated name was used for both (issue 31 item 15)
        raise ValueError(f"{path}: header expected distinct column names, received {repeated} more than once "
                         "(rename them)")
    if channels is not None and len(set(channels)) != len(channels):
        raise ValueError(f"--columns: expected distinct channel names, received {channels}")
    if date_column is None:
        named = [h for h in header if h.lower() in DATE_NAMES]
        date_column = named[0] if named else (header[0] if not _numeric(body[0][0]) else None)
    elif date_column not in header:
        raise ValueError(f"{path}: date column {date_column!r} not in the header {header}")
    wanted = channels or [h for h in header if h != date_column]
    missing = [c for c in wanted if c not in header]
    if missing or not wanted:
        raise ValueError(f"{path}: channels expected among {[h for h in header if h != date_column]}, received {wanted}")
    cols = [header.index(c) for c in wanted]
    values = np.empty((len(body), len(cols)))
    for i, row in enumerate(body):
        if len(row) != len(header):
            raise ValueError(f"{path}: row {i + 2} has {len(row)} fields, expected {len(header)} (the header's)")
        for j, col in enumerate(cols):
            try:
                values[i, j] = float(row[col]) if row[col].strip() else math.nan
                if math.isinf(values[i, j]):
                    raise ValueError
            except ValueError:
                raise ValueError(f"{path}: row {i + 2}, column {wanted[j]!r}: expected a finite number, received "
                                 f"{row[col]!r}") from None
    dates = [row[header.index(date_column)] for row in body] if date_column else []
    return Series(_fill_gaps(values, str(path)), wanted, dates, path.stem)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _fill_gaps(values: np.ndarray, what: str) -> np.ndarray:
    """Interpolate missing values linearly in time (ends: nearest value); refuse an all-missing channel."""
    out = values.copy()
    t = np.arange(len(out))
    for j in range(out.shape[1]):
        bad = np.isnan(out[:, j])
        if bad.all():
            raise ValueError(f"{what}: channel {j} has no numeric value")
        if bad.any():
            out[bad, j] = np.interp(t[bad], t[~bad], out[~bad, j])
    return out


def load_bundled(name: str) -> Series:
    """A real series shipped inside statsmodels (``BUNDLED``); nothing is downloaded."""
    if name not in BUNDLED:
        raise ValueError(f"bundled series: expected one of {sorted(BUNDLED)}, received {name!r}")
    from statsmodels import datasets

    if name == "co2":
        frame = datasets.co2.load_pandas().data
        return Series(_fill_gaps(frame[["co2"]].to_numpy(float), name), ["co2"],
                      [str(d.date()) for d in frame.index], name)
    if name == "elnino":
        frame = datasets.elnino.load_pandas().data
        months = frame.columns[1:]
        values = frame[months].to_numpy(float).reshape(-1, 1)  # (years, 12) -> month after month
        dates = [f"{int(y)}-{m + 1:02d}" for y in frame["YEAR"] for m in range(12)]
        return Series(values, ["sst"], dates, name)
    if name == "sunspots":
        frame = datasets.sunspots.load_pandas().data
        return Series(frame[["SUNACTIVITY"]].to_numpy(float), ["sunactivity"],
                      [str(int(y)) for y in frame["YEAR"]], name)
    frame = datasets.macrodata.load_pandas().data
    cols = ["realgdp", "realcons", "realinv"]
    values = 100 * np.diff(np.log(frame[cols].to_numpy(float)), axis=0)
    dates = [f"{int(y)}Q{int(q)}" for y, q in zip(frame["year"][1:], frame["quarter"][1:], strict=True)]
    return Series(values, cols, dates, name)


def synthetic_series(n: int = 6000, step: float = 0.01, sigma: float = 0.5, seed: int = 0) -> Series:
    """The spec's series y = sin(2x) + cos(5x) + 0.5x + σ·N(0, 1), x = 0, step, 2·step, ... (§3.2, §7).

    Its characteristic roots are e^{±0.02i}, e^{±0.05i} (the two sines at this step) and a double root at 1
    (the trend): six roots in all.
    """
    x = np.arange(n) * step
    clean = np.sin(2 * x) + np.cos(5 * x) + 0.5 * x
    noise = np.random.default_rng(seed).normal(size=n) if sigma else 0.0
    return Series((clean + sigma * noise)[:, None], ["y"], [], f"synthetic-sigma{sigma}")


def windows(values: np.ndarray, lookback: int, horizon: int, stride: int = 1) -> Windows:
    """Every (lookback + horizon)-step window of ``values`` (T, C), ``stride`` apart: x (N, L, C), y (N, H, C)."""
    total = lookback + horizon
    if len(values) < total:
        raise ValueError(f"windows: a split of {len(values)} steps is shorter than lookback + horizon = {total}")
    view = np.lib.stride_tricks.sliding_window_view(values, total, axis=0)[::stride]  # (N, C, L+H)
    view = np.ascontiguousarray(view.transpose(0, 2, 1))  # (N, L+H, C)
    return Windows(view[:, :lookback], view[:, lookback:])


def split_ranges(length: int, lookback: int, fractions: list[float], context: bool = True) -> dict[str, tuple[int, int]]:
    """Row ranges [start, end) of train/val/test; with ``context`` val and test start ``lookback`` rows early."""
    n_train = int(length * fractions[0])
    n_test = int(length * fractions[2])
    n_val = length - n_train - n_test
    back = lookback if context else 0
    return {"train": (0, n_train), "val": (max(0, n_train - back), n_train + n_val),
            "test": (max(0, length - n_test - back), length)}


def make_splits(series: Series, lookback: int, horizon: int, config: ForecastDataConfig | None = None) -> Splits:
    """Chronological splits of ``series``, standardised with the train split's statistics, as windows."""
    config = config or ForecastDataConfig()
    ranges = split_ranges(len(series.values), lookback, config.split, config.context)
    scaler = Standardizer.fit(series.values[slice(*ranges["train"])], config.standardize)
    scaled = scaler.transform(series.values)
    parts = {}
    for name, (start, end) in ranges.items():
        try:
            parts[name] = windows(scaled[start:end], lookback, horizon, config.stride)
        except ValueError as exc:
            raise ValueError(f"{series.name or 'series'} ({len(series.values)} steps, split {config.split}): the "
                             f"{name} split: {exc}") from None
    return Splits(parts["train"], parts["val"], parts["test"], scaler, ranges)
