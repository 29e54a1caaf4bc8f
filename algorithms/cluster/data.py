"""Reading the items to cluster from JSON Lines: one object per line with ``"x"`` (a list of numbers) or
``"text"`` (a string), and an optional ``"id"``. Blank lines are skipped; every line has the same kind."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError


@dataclass
class Items:
    """What a JSONL file holds: ids, and either points (n, dim) or texts."""

    ids: list[str]
    points: np.ndarray | None = None
    texts: list[str] | None = None

    def __len__(self) -> int:
        return len(self.ids)


def parse_jsonl(text: str) -> Items:
    """The items in JSONL ``text``; a bad line raises InputError naming the line and the field."""
    ids: list[str] = []
    points: list[list[float]] = []
    texts: list[str] = []
    kind = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"line {number}", "a JSON object", f"{line[:60]!r} ({exc.msg})") from exc
        except RecursionError:
            raise InputError(f"line {number}", "a JSON object", "JSON nested too deep to parse") from None
        if not isinstance(record, dict):
            raise InputError(f"line {number}", "a JSON object", type(record).__name__)
        here = "x" if "x" in record else "text" if "text" in record else None
        if here is None:
            raise InputError(f"line {number}", 'an object with "x" (numbers) or "text" (a string)', sorted(record))
        if kind is not None and here != kind:
            raise InputError(f"line {number}.{here}", f'"{kind}" like the lines before it', here)
        kind = here
        if here == "x":
            x = record["x"]
            if not isinstance(x, list) or not x or any(
                    isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in x):
                raise InputError(f"line {number}.x", "a non-empty list of finite numbers", x)
            if points and len(x) != len(points[0]):
                raise InputError(f"line {number}.x", f"{len(points[0])} numbers like line 1", len(x))
            points.append([float(v) for v in x])
        else:
            if not isinstance(record["text"], str):
                raise InputError(f"line {number}.text", "a string", record["text"])
            texts.append(record["text"])
        ident = record.get("id", len(ids))
        if not isinstance(ident, (str, int)) or isinstance(ident, bool):
            raise InputError(f"line {number}.id", "a string or an integer", ident)
        ids.append(str(ident))
    if not ids:
        raise InputError("data", "at least one JSONL record", "an empty file")
    if len(set(ids)) != len(ids):
        raise InputError("id", "unique ids", "a repeated id")
    if kind == "x":
        return Items(ids, points=np.array(points))
    return Items(ids, texts=texts)


def load_jsonl(path: str | Path) -> Items:
    """:func:`parse_jsonl` of a UTF-8 file."""
    if Path(path).is_dir():  # IsADirectoryError was a raw traceback (issue 31 item 16)
        raise InputError("data", "a UTF-8 JSONL file", f"the directory {path!s}")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError("data", "a UTF-8 JSONL file", str(path)) from exc
    except PermissionError as exc:
        raise InputError("data", "a readable UTF-8 JSONL file", f"{path}: {exc.strerror}") from None
    return parse_jsonl(text)
