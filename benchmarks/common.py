"""Shared by the benchmark scripts: replace (or append) one marked section of docs/results.md."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

from veil.config import write_atomic

DOCS = Path(__file__).resolve().parents[1] / "docs"


def write_section(results_md: Path, key: str, body: str) -> None:
    """Put ``body`` between ``<!-- key:begin -->`` and ``<!-- key:end -->``, keeping every other section.

    The body's leading heading becomes a level-2 heading (every section of results.md is a ``##`` sibling, whatever
    level the benchmark's own docs page embeds it at); the file is replaced atomically."""
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    body = re.sub(r"\A#+ ", "## ", body.strip())
    section = f"{begin}\n{body}\n{end}"
    text = results_md.read_text() if results_md.exists() else "# veil — measured results\n\n"
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    write_atomic(results_md, text)


def save_results(docs: Path, key: str, results: Any, body: str) -> None:
    """Write ``docs/results/<key>.json`` and the ``key`` section of ``docs/results.md`` (each atomically)."""
    write_atomic(docs / "results" / f"{key}.json", json.dumps(results, indent=1))
    write_section(docs / "results.md", key, body)


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, write ``path`` (PNG, 110 dpi; folders created) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment(threads: str = "", **versions: str) -> dict[str, str]:
    """Where and when a benchmark ran: date, machine (``threads`` appended, e.g. "1 thread") and package versions."""
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs" + (f", {threads}" if threads else "")
    return {"date": time.strftime("%Y-%m-%d"), "machine": machine, **versions}


def command_line(script: str, argv: list[str] | None) -> str:
    """The command line that reproduces a run: ``python benchmarks/<script> [argv...]``."""
    return f"python benchmarks/{Path(script).name}" + (" " + " ".join(argv) if argv else "")


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser: ``doc``'s first line as description, its last paragraph (the commands) as epilog,
    and ``--out`` (the docs folder that results.md, results/ and img/ go into)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0], epilog=doc.rsplit("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DOCS, help="docs folder to write into")
    return parser
