"""The training side of ``veil recommend``: a repository's specs, the spec base they were fitted on, the user's data.

The user's spec is fitted on the user's machine with exactly the settings of the repository's specs (read from
their identity) on the same base (its weight hash is checked). Ranking it, locally, by a server or privately
(CKKS), is :func:`veil.recommend.recommend`'s: training never imports he.

Example:
    >>> specs = repository_specs("models")
    >>> base = base_for(next(iter(specs.values())).identity)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from veil.pave import PaveVector, SpecFormatError, SpecMismatch, spec_paths

from .base import SpecBase
from .config import PaveConfig


def repository_specs(repo: str | Path) -> dict[str, PaveVector]:
    """Every model spec of a repository folder (``<model>/pave.json``, ``<model>/pave/<adapter>.json``).

    Raises:
        FileNotFoundError: the folder does not exist or holds no spec.
        SpecFormatError: a spec file is malformed (the message names the file and the field).
    """
    repo = Path(repo)
    if not repo.is_dir():
        raise FileNotFoundError(f"--repo: expected a model repository folder, received {str(repo)!r}")
    specs = {}
    for folder in sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for name, path in spec_paths(repo, folder.name):
            specs[name] = PaveVector.from_json(path.read_bytes(), what=str(path.relative_to(repo)))
    if not specs:
        raise FileNotFoundError(f"--repo {repo}: expected PAVE specs (<model>/pave.json, written by `veil export ... "
                                "--spec`), received none")
    return specs


def config_from_identity(identity: dict[str, Any], **fit: Any) -> PaveConfig:
    """The PaveConfig that reproduces ``identity`` (rank, seed, scale, layers, targets, head); ``fit`` sets the rest."""
    try:
        names = [t.split(".", 3) for t in identity["targets"]]  # encoder.layer.<i>.<relative name>
        layers = sorted({int(n[2]) for n in names})
        targets = list(dict.fromkeys(n[3] for n in names))
        return PaveConfig(rank=identity["rank"], projection_seed=identity["projection_seed"], scale=identity["scale"],
                          layers=len(layers), targets=targets, num_outputs=identity["num_outputs"],
                          head_seed=identity["head_seed"], **fit)
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise SpecFormatError(f"identity: expected the fields of a veil.training.pave spec (targets, rank, "
                              f"projection_seed, scale, num_outputs, head_seed), received {sorted(identity)} ({exc})") from None


def base_for(identity: dict[str, Any], base: str | None = None, **fit: Any) -> SpecBase:
    """The spec base of ``identity`` (the bundled MiniLM, or the transformers folder ``base``), hash-checked.

    Raises:
        SpecMismatch: the loaded base's weights are not the ones the repository's specs were fitted on.
    """
    from veil.training.adapters.finetune import load_encoder

    config = config_from_identity(identity, **fit)
    if base is None and identity["base"] == "all-MiniLM-L6-v2":
        spec_base = SpecBase.bundled(config)
    elif base is None:
        raise ValueError(f"--base: expected the folder of the base {identity['base']!r} the repository's specs were "
                         "fitted on, received none")
    else:
        encoder, tokenizer = load_encoder(base)
        spec_base = SpecBase(identity["base"], encoder, tokenizer, config)
    if spec_base.identity != identity:
        diff = sorted(k for k in set(identity) | set(spec_base.identity) if identity.get(k) != spec_base.identity.get(k))
        raise SpecMismatch(f"base: the loaded base differs from the repository's spec base in {diff} (e.g. "
                           f"base_sha256 expected {identity['base_sha256']}, received {spec_base.base_sha256})")
    return spec_base


def read_few_shots(path: str | Path) -> tuple[list[str], list[int]]:
    """A JSONL file of ``{"text": str, "label": int}`` lines -> (texts, labels).

    Raises:
        ValueError: a line that is not such an object (the message names the line).
    """
    texts, labels = [], []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{i}: expected a JSON object, received invalid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or isinstance(row.get("label"), bool) \
                or not isinstance(row.get("label"), int):
            raise ValueError(f"{path}:{i}: expected {{\"text\": str, \"label\": int}}, received {line[:80]!r}")
        texts.append(row["text"])
        labels.append(row["label"])
    if not texts:
        raise ValueError(f"{path}: expected at least one labelled example, received none")
    return texts, labels
