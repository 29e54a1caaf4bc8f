"""Shared by the benchmark scripts: replace (or append) one marked section of docs/results.md."""

from __future__ import annotations

from pathlib import Path


def write_section(results_md: Path, key: str, body: str) -> None:
    """Put ``body`` between ``<!-- key:begin -->`` and ``<!-- key:end -->``, keeping every other section."""
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    section = f"{begin}\n{body.strip()}\n{end}"
    text = results_md.read_text() if results_md.exists() else "# veil — measured results\n\n"
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    results_md.parent.mkdir(parents=True, exist_ok=True)
    results_md.write_text(text)
