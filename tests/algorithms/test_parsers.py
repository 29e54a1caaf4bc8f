"""The two parsers an outsider reaches: payoff files (.npy/.csv/.json) and JSONL items. Whatever the bytes, they
return a valid value or raise InputError naming the field, never another exception (bounded hypothesis runs)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veil.algorithms.cluster import parse_jsonl
from veil.algorithms.errors import InputError
from veil.algorithms.games import parse_payoff

FINITE = st.floats(-1e6, 1e6, allow_nan=False)
MATRICES = st.integers(1, 5).flatmap(lambda m: st.lists(st.lists(FINITE, min_size=3, max_size=3), min_size=m,
                                                        max_size=m))


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".npy", ".csv", ".json", ".txt"]))
def test_payoff_parser_returns_a_matrix_or_refuses_by_name(data: bytes, suffix: str) -> None:
    try:
        payoff = parse_payoff(data, suffix)
    except InputError as exc:
        assert str(exc).startswith(("payoff", "payoff file"))
    else:
        assert payoff.ndim == 2 and payoff.dtype == np.float64 and np.all(np.isfinite(payoff))


@settings(max_examples=40, deadline=None)
@given(rows=MATRICES)
def test_payoff_round_trips_through_every_format(rows: list[list[float]]) -> None:
    expected = np.array(rows)
    buffer = io.BytesIO()
    np.save(buffer, expected)
    csv = "\n".join(",".join(repr(v) for v in row) for row in rows).encode()
    for data, suffix in ((buffer.getvalue(), ".npy"), (csv, ".csv"), (json.dumps(rows).encode(), ".json")):
        assert np.array_equal(parse_payoff(data, suffix), expected)


def test_a_pickled_npy_is_refused() -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match=r"^payoff: expected a readable \.npy file"):
        parse_payoff(buffer.getvalue(), ".npy")


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=200))
def test_jsonl_parser_returns_items_or_refuses_by_name(text: str) -> None:
    try:
        items = parse_jsonl(text)
    except InputError as exc:
        assert str(exc).split(":")[0].startswith(("line ", "data", "id"))
    else:
        assert len(items) >= 1 and (items.points is None) != (items.texts is None)


@settings(max_examples=40, deadline=None)
@given(points=st.integers(1, 3).flatmap(lambda d: st.lists(st.lists(FINITE, min_size=d, max_size=d), min_size=1,
                                                           max_size=8)))
def test_jsonl_points_round_trip(points: list[list[float]]) -> None:
    text = "\n".join(json.dumps({"id": f"p{i}", "x": x}) for i, x in enumerate(points)) + "\n\n"
    items = parse_jsonl(text)
    assert items.ids == [f"p{i}" for i in range(len(points))] and np.array_equal(items.points, np.array(points))


@pytest.mark.parametrize("text, message", [
    ('{"x": [1, 2]}\n{"x": [1]}', r"^line 2.x: expected 2 numbers like line 1, received 1"),
    ('{"x": [1]}\n{"text": "a"}', r'^line 2.text: expected "x" like the lines before it'),
    ('{"y": 1}', r"^line 1: expected an object with"),
    ('{"x": [1, NaN]}', r"^line 1.x: expected a non-empty list of finite numbers"),
    ('{"text": "a", "id": 1}\n{"text": "b", "id": "1"}', r"^id: expected unique ids"),
    ("", r"^data: expected at least one JSONL record"),
])
def test_bad_jsonl_lines_are_refused_with_the_line_and_field(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_jsonl(text)
