"""Every figure in a guide's result table comes from a benchmark's JSON.

A table in a guide (docs/*.md, not docs/results.md, which the benchmarks write) declares its source with a comment
on the line just above it::

    <!-- figures: adapters_mtlora -->
    | method | trainable params | mean R² |
    |---|---:|---:|
    | LoRA (shared) | 5,760 | 0.9813 |

Every number in the table's body, outside its first column (the row labels, where settings such as ``r = 8``
sit), must be one of the numbers in ``docs/results/<source>.json``: equal as written (``0.9813`` for
0.98126..., rounded to the decimals shown), or the JSON value rounded to 3 significant digits (``151,000`` for
150,536). A cell with ``%`` may also show a
JSON fraction as a percentage (``85.0 %`` for 0.85). The pages that once carried hand-written numbers (issue 32)
must carry no table of numbers without such a marker.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
GUIDES = sorted(p for p in DOCS.glob("*.md") if p.name != "results.md")
MARKER = re.compile(r"^<!--\s*figures:\s*([A-Za-z0-9_]+)\s*-->\s*$")
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
# (page, the heading its checked part starts at or None for the whole page): the places issue 32.5 named
UNBACKED_BEFORE = [("he.md", "### Measured sizes"), ("adapters.md", None), ("compress_safety.md", None)]


def tables(lines: list[str]) -> list[tuple[int, str | None, list[list[str]]]]:
    """(first line index, marker source or None, body rows as cells) for each markdown table in ``lines``."""
    found, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|\s*$", lines[i + 1]):
            start, j = i, i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            marker = MARKER.match(lines[start - 1].strip()) if start > 0 else None
            rows = [cells(line) for line in lines[start + 2:j]]
            found.append((start, marker.group(1) if marker else None, rows))
            i = j
        else:
            i += 1
    return found


def cells(row: str) -> list[str]:
    """The cells of one table row (``\\|`` is a literal bar inside a cell)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def numbers_in(text: str) -> list[tuple[float, str]]:
    """(value, as written) for each number in a cell; the Unicode minus counts, markup and code are dropped."""
    text = re.sub(r"`[^`]*`", " ", text).replace("**", "").replace("\u2212", "-")
    return [(float(m.group().replace(",", "")), m.group()) for m in NUMBER.finditer(text)]


def is_numeric(cell: str) -> bool:
    """A cell that states a figure: it starts with a number (after markup)."""
    found = numbers_in(cell)
    stripped = re.sub(r"`[^`]*`", " ", cell).replace("**", "").replace("\u2212", "-").strip()
    return bool(found) and stripped.startswith(found[0][1])


def json_numbers(source: str) -> list[float]:
    values: list[float] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, (int, float)) and not isinstance(node, bool) and math.isfinite(node):
            values.append(float(node))

    walk(json.loads((RESULTS / f"{source}.json").read_text()))
    return values


def matches(value: float, written: str, candidates: list[float], percent: bool) -> bool:
    """``value`` (written as ``written``) is a rounding of some candidate (or of 100 x one, in a % cell)."""
    decimals = len(written.split(".")[1].split("e")[0].split("E")[0]) if "." in written else 0
    half = 0.5 * 10.0 ** -decimals + 1e-9
    for x in candidates:
        for shown in (x, 100 * x) if percent else (x,):
            if abs(shown - value) <= half or float(f"{shown:.3g}") == value:
                return True
    return False


def unmatched(rows: list[list[str]], candidates: list[float]) -> list[str]:
    missing = []
    for row in rows:
        for cell in row[1:]:
            for value, written in numbers_in(cell):
                if not matches(value, written, candidates, percent="%" in cell):
                    missing.append(f"{written} (row {row[0]!r})")
    return missing


def marked_tables() -> list[tuple[str, int, str, list[list[str]]]]:
    return [(page.name, start, source, rows) for page in GUIDES
            for start, source, rows in tables(page.read_text().splitlines()) if source]


@pytest.mark.parametrize("page, start, source, rows",
                         marked_tables() or [pytest.param(None, 0, "", [], marks=pytest.mark.skip("no marked table"))])
def test_marked_table_figures_are_in_the_benchmark_json(page: str, start: int, source: str,
                                                        rows: list[list[str]]) -> None:
    assert (RESULTS / f"{source}.json").exists(), f"docs/{page}:{start + 1}: no docs/results/{source}.json"
    missing = unmatched(rows, json_numbers(source))
    assert not missing, (f"docs/{page}:{start + 1}: figures not in docs/results/{source}.json: "
                         + ", ".join(missing))


def checked_part(page: str, heading: str | None) -> list[str]:
    lines = (DOCS / page).read_text().splitlines()
    if heading is None:
        return lines
    starts = [i for i, line in enumerate(lines) if line.startswith(heading)]
    assert starts, f"docs/{page} has no heading {heading!r}"
    level = len(heading.split()[0])
    end = next((j for j in range(starts[0] + 1, len(lines))
                if re.match(rf"^#{{1,{level}}}\s", lines[j])), len(lines))
    return lines[starts[0]:end]


@pytest.mark.parametrize("page, heading", UNBACKED_BEFORE)
def test_no_unbacked_table_of_numbers(page: str, heading: str | None) -> None:
    bad = [start + 1 for start, source, rows in tables(checked_part(page, heading))
           if source is None and any(is_numeric(cell) for row in rows for cell in row[1:])]
    assert not bad, (f"docs/{page} ({heading or 'whole page'}): tables of numbers without a "
                     f"'<!-- figures: BENCHMARK -->' marker at lines {bad} of that part")


def test_the_checker_catches_a_wrong_figure() -> None:
    lines = ["<!-- figures: x -->", "| method | acc | params |", "|---|---|---|",
             "| LoRA r = 8 | **85.0 %** | 150,536 |", "| other | 0.9813 | \u22121.9 |"]
    [(_, source, rows)] = tables(lines)
    assert source == "x"
    assert unmatched(rows, [0.85, 150536.0, 0.98126, -1.875]) == []
    assert unmatched(rows, [0.85, 150537.0, 0.98126, -1.875]) == ["150,536 (row 'LoRA r = 8')"]
    assert unmatched(rows, [0.85, 150536.0, 0.98126, -1.7]) == ["-1.9 (row 'other')"]
    assert unmatched(rows, [0.86, 150536.0, 0.9815, -1.875]) == ["85.0 (row 'LoRA r = 8')", "0.9813 (row 'other')"]
    assert is_numeric("**0.9968**") and is_numeric("\u22122.7") and not is_numeric("float, 1")
    assert not is_numeric("`layer` \\| `module`")
