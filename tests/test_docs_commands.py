"""Every `veil <group> <verb>` the guides write in code exists, and every script or test file they name (issue 33:
the guides re-walked from a fresh clone).

docs/deploy.md's Triton table named `veil export uldnet`, a verb that never existed (`veil export onnx` exports
ULD-Net checkpoints); a newcomer who types it gets `unknown verb`. Fenced blocks and inline code spans of
docs/*.md and README.md are read; prose is not (it says "`veil export` writes ...").
"""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

from veil.cli import GROUPS

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md"])
CODE = re.compile(r"^```[^\n]*\n(.*?)^```|`([^`\n]+)`", re.S | re.M)
COMMAND = re.compile(r"(?<![\w./-])veil ([a-z]+) ([a-z][\w-]*)")


def verbs_by_group() -> dict[str, set[str]]:
    """Each group that has verbs: the top-level table's, or those of a one-command group's own parser."""
    found = {}
    for group, (_, verbs, _) in GROUPS.items():
        if "" not in verbs:
            found[group] = set(verbs)
            continue
        module = importlib.import_module(verbs[""])
        if hasattr(module, "VERBS"):
            found[group] = set(module.VERBS)
            continue
        try:
            parser = module.build_parser()
        except TypeError:
            continue
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found[group] = set(action.choices)
    return found


def unknown_commands(text: str, verbs: dict[str, set[str]]) -> list[str]:
    """`veil <group> <verb>` in ``text``'s code whose verb the group does not have."""
    bad = []
    for match in CODE.finditer(text):
        code = match.group(1) or match.group(2)
        for group, verb in COMMAND.findall(code):
            if group in verbs and verb not in verbs[group]:
                bad.append(f"veil {group} {verb}")
    return bad


def test_the_verb_table_is_read() -> None:
    verbs = verbs_by_group()
    assert {"onnx", "he", "adapters"} <= verbs["export"] and {"keygen", "decrypt"} <= verbs["he"]
    assert {"encode", "bench"} <= verbs["codec"] and "uldnet" not in verbs["export"]
    assert unknown_commands("| plain ONNX (`veil export uldnet`) |\n```bash\nveil codec encod x\n```\n", verbs) == [
        "veil export uldnet", "veil codec encod"]


def test_every_veil_command_in_the_guides_exists() -> None:
    verbs = verbs_by_group()
    bad = {page.relative_to(ROOT).as_posix(): found for page in PAGES
           if (found := unknown_commands(page.read_text(), verbs))}
    assert bad == {}


FILE = re.compile(r"(?<![\w/.-])((?:examples|benchmarks|tests)/[\w/]+\.py)")


def test_every_script_and_test_file_the_guides_name_exists() -> None:
    """docs/optim.md pointed at tests/test_benchmarks_optim_lora.py, which never existed (the test is in
    tests/test_benchmarks.py)."""
    missing = {f"{page.relative_to(ROOT).as_posix()}: {path}" for page in PAGES
               for path in FILE.findall(page.read_text()) if not (ROOT / path).is_file()}
    assert missing == set()
