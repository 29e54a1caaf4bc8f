"""The options every `veil export` verb shares: where the model goes (``--repo``, ``--name``, ``--version``).

One parent parser (argparse ``parents=[...]``, as CompressAI's CLIs share theirs), so the flags, their checks and
their help read the same in every verb. Imports argparse only: building a verb's parser stays instant.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def version_number(text: str) -> int:
    """argparse type of ``--version``: a version folder number, an integer >= 1 (Triton's layout)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (the version folder), received {text!r}")
    return value


def repository_arguments(name_default: str | None = None) -> argparse.ArgumentParser:
    """The parent parser of ``--repo`` (required), ``--name`` and ``--version`` (default 1).

    Args:
        name_default: how the verb names the model when ``--name`` is not given (e.g. ``"from the source"``);
            None makes ``--name`` required.
    """
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("model repository")
    group.add_argument("--repo", type=Path, required=True, help="model repository folder (created if missing)")
    if name_default is None:
        group.add_argument("--name", required=True, help="model name in the repository")
    else:
        group.add_argument("--name", default=None, help=f"model name in the repository (default: {name_default})")
    group.add_argument("--version", type=version_number, default=1, help="version folder to write (default: 1)")
    return parent
