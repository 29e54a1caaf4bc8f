"""Fuzz the CSV loader an outsider reaches through `veil train forecast --data`: any file either loads to finite
values with one column per channel, or is refused with a ValueError naming the file."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from veil.training.forecast.data import load_csv

CELLS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=6),
                  st.sampled_from(["", " ", "date", "2020-01-01", "1e309", "nan", "-0"]))
ROWS = st.lists(st.lists(CELLS, min_size=0, max_size=4), min_size=0, max_size=6)


@settings(max_examples=150, deadline=None)
@given(rows=ROWS, raw=st.binary(max_size=40), use_raw=st.booleans())
def test_any_file_loads_or_is_refused_by_name(rows: list[list[str]], raw: bytes, use_raw: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "series.csv"
        if use_raw:
            path.write_bytes(raw)
        else:
            path.write_text("\n".join(",".join(c.replace(",", ";").replace("\n", " ").replace("\r", " ")
                                               .replace('"', "'") for c in row) for row in rows))
        try:
            series = load_csv(path)
        except ValueError as exc:
            assert "series.csv" in str(exc)
            return
        assert series.values.ndim == 2 and series.values.shape[1] == len(series.channels) >= 1
        assert np.isfinite(series.values).all()
