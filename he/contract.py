"""The input contract at the encrypted client: check what a user passes before it is encrypted (numpy only).

A checkpoint records what one input sample must be (``config.json`` ``data.input``: dtype, shape, value scale,
normalisation and, for scaled pixels, the value ``range``); ``veil export he`` copies it into ``veil.json`` as
``input``, which the server returns in the model metadata under ``parameters.veil.input`` and
:class:`~veil.he.client.HeSession` keeps as ``he["input"]``. Under encryption a wrongly scaled input is not an
error the server can see: raw 0-16 digits given to a model trained on pixel / 16 come back as confident
garbage. :func:`check_input` refuses such an array on the client with an :class:`InputContractError` naming
the field, the expected and the received value.

Example:
    >>> contract = {"name": "x", "dtype": "float32", "shape": [1, 8, 8], "range": [0.0, 1.0],
    ...             "scale": "pixel / 16 (sklearn digits 0..16 -> [0, 1])", "normalization": "none"}
    >>> check_input(np.zeros((2, 1, 8, 8)), contract).shape
    (2, 1, 8, 8)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from veil.he.errors import InputContractError

# "[0, 1]" in a contract's free-text scale ("pixel / 16 (sklearn digits 0..16 -> [0, 1])"): what contracts
# written before veil recorded "range" declare
_RANGE_TEXT = re.compile(r"\[\s*([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*,\s*([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*\]")
RANGE_TOLERANCE = 1e-6  # of the range's width: float32 rounding of a scaled pixel stays inside


def declared_range(contract: dict[str, Any] | None) -> tuple[float, float] | None:
    """The value range one input must lie in: the contract's ``range``, else the ``[lo, hi]`` its ``scale``
    text names when no normalisation follows the scaling; None when the contract declares none."""
    if not contract:
        return None
    if contract.get("range") is not None:
        lo, hi = (float(v) for v in contract["range"])
        return lo, hi
    if str(contract.get("normalization", "none")).strip().lower() != "none":
        return None  # e.g. photos32's per-sample standardisation: the scaled range is not the input's
    match = _RANGE_TEXT.search(str(contract.get("scale", "")))
    return (float(match[1]), float(match[2])) if match else None


def _describe(contract: dict[str, Any]) -> str:
    return "; ".join(f"{k}: {contract[k]}" for k in ("scale", "normalization") if contract.get(k))


def check_input(x: Any, contract: dict[str, Any] | None, shape: Sequence[int] | None = None) -> np.ndarray:
    """``x`` as a float64 array (B, *shape) if it meets ``contract``; else :class:`InputContractError`.

    Checks, in order: a numeric dtype (ints, floats, bools; not strings, objects or complex numbers), the
    shape (B, *contract shape) with B >= 1 (``shape`` overrides or stands in for the contract's: the plan's
    input layout), finite values, and values inside the declared range (:func:`declared_range`).
    """
    contract = contract or {}
    name = contract.get("name", "x")
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise InputContractError(f"input '{name}': dtype expected a real number type convertible to float "
                                 f"(contract dtype {contract.get('dtype', 'float32')}), received {arr.dtype}")
    expected = list(shape if shape is not None else contract.get("shape") or arr.shape[1:])
    if arr.ndim != len(expected) + 1 or list(arr.shape[1:]) != [int(s) for s in expected]:
        hint = " (one sample: add the batch axis, x[None])" if list(arr.shape) == [int(s) for s in expected] else ""
        raise InputContractError(f"input '{name}': shape expected (B, {', '.join(map(str, expected))}), "
                                 f"received {tuple(arr.shape)}{hint}")
    if len(arr) == 0:
        raise InputContractError(f"input '{name}': batch expected >= 1 sample, received shape {tuple(arr.shape)}")
    values = arr.astype(np.float64)
    finite = np.isfinite(values)
    if not finite.all():
        first = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise InputContractError(f"input '{name}': values expected finite, received {int((~finite).sum())} "
                                 f"non-finite (first {values[first]} at index {first})")
    bounds = declared_range(contract)
    if bounds is not None:
        lo, hi = bounds
        slack = RANGE_TOLERANCE * max(hi - lo, 1.0)
        low, high = float(values.min()), float(values.max())
        if low < lo - slack or high > hi + slack:
            outside = int(((values < lo - slack) | (values > hi + slack)).sum())
            raise InputContractError(
                f"input '{name}': values expected in [{lo:g}, {hi:g}] (the model's input contract: "
                f"{_describe(contract) or 'range'}), received values in [{low:g}, {high:g}] ({outside} of "
                f"{values.size} outside); scale the array as the contract says before encrypting")
    return values
