"""Every ```python block in docs/*.md and README.md runs, page by page, like a notebook.

The blocks of one page run in order in one namespace, in a process of their own (forked from this one, so the
heavy imports are paid once) whose working directory is a fresh temporary folder. A block that cannot run here
says so in the page, right above its fence::

    <!-- not-run: needs a running server (veil serve models) -->

and a page whose blocks take minutes carries ``<!-- docs-test: slow -->`` anywhere in it (the test is then
marked ``slow``). New pages are picked up by the glob; nothing here lists them.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import multiprocessing
import os
import re
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md"])
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not-run:((?:(?!-->).)*)-->\s*\Z", re.S)  # the marker, directly above a fence
ANY_NOT_RUN = re.compile(r"<!--\s*not-run\b")
SLOW = re.compile(r"<!--\s*docs-test:\s*slow\s*-->")
PAGE_TIMEOUT_S = 900


@dataclass(frozen=True)
class Block:
    """One fenced python block: its first code line in the page (1-based), its code, why it is not run (or None)."""

    line: int
    code: str
    not_run: str | None


def page_blocks(text: str) -> list[Block]:
    """The page's python blocks in order, each with the reason of a ``not-run`` marker directly above it."""
    blocks = []
    for match in FENCE.finditer(text):
        before = text[:match.start()]
        marker = NOT_RUN.search(before)
        reason = marker.group(1).strip() if marker else None
        blocks.append(Block(before.count("\n") + 2, match.group(1), reason))
    return blocks


def _run_page(page: str, blocks: list[Block], workdir: str, conn) -> None:
    """Child process: run the blocks in ``workdir``; send None on success, else the failing block's traceback."""
    import torch

    torch.set_num_threads(1)  # the forked child must not reuse the parent's intra-op pool (as DataLoader workers)
    os.chdir(workdir)
    namespace: dict = {"__name__": "__main__"}
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            for block in blocks:
                # leading newlines make traceback line numbers the page's own
                exec(compile("\n" * (block.line - 1) + block.code, page, "exec"), namespace)
        conn.send(None)
    except BaseException:  # everything a block raises is the report
        conn.send(f"{traceback.format_exc()}\n--- output of the page's blocks ---\n{out.getvalue()[-4000:]}")
    finally:
        conn.close()
        os._exit(0)


def run_page(page: Path, workdir: Path) -> str | None:
    """Run ``page``'s runnable blocks in a forked process; None when all passed, else the error report."""
    blocks = [b for b in page_blocks(page.read_text()) if b.not_run is None]
    name = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_run_page, args=(name, blocks, str(workdir), child))
    process.start()
    child.close()
    if not parent.poll(PAGE_TIMEOUT_S):
        process.kill()
        process.join()
        return f"{page.name}: the blocks did not finish within {PAGE_TIMEOUT_S} s"
    try:
        report = parent.recv()
    except EOFError:
        report = "the page's process died without a report"
    process.join()
    return report if report is None or process.exitcode == 0 else f"{report} (exit {process.exitcode})"


def _params() -> list:
    params = []
    for page in PAGES:
        text = page.read_text()
        if not any(b.not_run is None for b in page_blocks(text)):
            continue
        marks = [pytest.mark.slow] if SLOW.search(text) else []
        params.append(pytest.param(page, id=str(page.relative_to(ROOT)), marks=marks))
    return params


@pytest.fixture(scope="module")
def warm_imports() -> None:
    """Import, in this process, every module the runnable blocks import, so each forked page starts warm.

    On a busy 2-core machine ``import transformers`` alone takes ~10 s; paid once here instead of once per page.
    A module that fails to import here is left to fail in its page, with the page's line.
    """
    for page in PAGES:
        for block in page_blocks(page.read_text()):
            if block.not_run is not None:
                continue
            try:
                tree = ast.parse(block.code)
            except SyntaxError:
                continue  # reported by the page's own run
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
                for name in names:
                    with contextlib.suppress(Exception):
                        module = importlib.import_module(name)
                        for alias in node.names if isinstance(node, ast.ImportFrom) else ():
                            getattr(module, alias.name, None)  # resolves transformers' lazy attributes
    return None


@pytest.mark.parametrize("page", _params())
def test_page_blocks_run(page: Path, tmp_path: Path, warm_imports: None) -> None:
    report = run_page(page, tmp_path)
    assert report is None, f"{page.relative_to(ROOT)}: a python block failed:\n{report}"


def test_not_run_markers_sit_on_a_block_and_give_a_reason() -> None:
    """A marker that is not directly above a python fence, or has no reason, is a typo that hides nothing."""
    problems = []
    for page in PAGES:
        text = page.read_text()
        attached = sum(b.not_run is not None for b in page_blocks(text))
        if len(ANY_NOT_RUN.findall(text)) != attached:
            problems.append(f"{page.name}: a not-run marker is not directly above a ```python fence")
        problems += [f"{page.name}:{b.line}: not-run marker without a reason"
                     for b in page_blocks(text) if b.not_run == ""]
    assert not problems, problems


def test_block_parser() -> None:
    text = "# t\n```python\nx = 1\n```\n<!-- not-run: needs a GPU -->\n\n```python\ny = 2\n```\n```bash\nls\n```\n"
    assert page_blocks(text) == [Block(3, "x = 1\n", None), Block(8, "y = 2\n", "needs a GPU")]
    # a marker further up never reaches over other text to a later block
    later = text + "<!-- docs-test: slow -->\n```python\nz = 3\n```\n"
    assert page_blocks(later)[-1] == Block(15, "z = 3\n", None)


def test_a_failing_block_is_reported_with_its_page_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("intro\n```python\nx = 1\n```\ntext\n```python\nprint(x)\nundefined_name\n```\n")
    report = run_page(page, tmp_path)
    assert report is not None and "NameError" in report and "line 8" in report and "1\n" in report
