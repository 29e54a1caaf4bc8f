"""Reading a payoff matrix from a file: ``.npy`` (no pickles), ``.csv`` (comma-separated rows) or ``.json``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from ..errors import InputError
from .solvers import check_payoff

SUFFIXES = (".npy", ".csv", ".json")


def parse_payoff(data: bytes, suffix: str) -> np.ndarray:
    """The (m, n) float64 payoff matrix in ``data`` written as ``suffix``; anything else raises InputError."""
    if suffix not in SUFFIXES:
        raise InputError("payoff file", f"a name ending in one of {list(SUFFIXES)}", suffix)
    try:
        if suffix == ".npy":
            value = np.load(io.BytesIO(data), allow_pickle=False)
        elif suffix == ".csv":
            text = data.decode("utf-8")
            rows = [line for line in text.splitlines() if line.strip()]
            value = [[float(cell) for cell in row.split(",")] for row in rows]
            if len({len(row) for row in value}) > 1:
                raise InputError("payoff", "rows of equal length", sorted({len(row) for row in value}))
        else:
            value = json.loads(data.decode("utf-8"))
            if isinstance(value, dict):
                if "payoff" not in value:
                    raise InputError("payoff", 'a JSON list of rows or an object with a "payoff" key', sorted(value))
                value = value["payoff"]
            if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
                raise InputError("payoff", "a JSON list of rows (lists of numbers)", type(value).__name__)
            if len({len(row) for row in value}) > 1:
                raise InputError("payoff", "rows of equal length", sorted({len(row) for row in value}))
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) for row in value for v in row):
                raise InputError("payoff", "numbers only", "a non-number entry")
    except InputError:
        raise
    except RecursionError:  # json.loads of ~100 k nested lists (issue 31 item 16): one line, not a traceback
        raise InputError("payoff", "a JSON list of rows (lists of numbers)", "JSON nested too deep to parse") from None
    except (ValueError, UnicodeDecodeError, EOFError, OSError) as exc:
        raise InputError("payoff", f"a readable {suffix} file", f"{type(exc).__name__}: {str(exc)[:120]}") from exc
    if isinstance(value, np.ndarray) and value.dtype.kind not in "biuf":
        raise InputError("payoff", "a numeric array", str(value.dtype))
    return check_payoff(value)


def load_payoff(path: str | Path) -> np.ndarray:
    """:func:`parse_payoff` of a file (the suffix says the format)."""
    path = Path(path)
    if path.is_dir():
        raise InputError("payoff file", "a file", f"the directory {path!s}")
    try:
        data = path.read_bytes()
    except PermissionError as exc:
        raise InputError("payoff file", "a readable file", f"{path}: {exc.strerror}") from None
    return parse_payoff(data, path.suffix.lower())
