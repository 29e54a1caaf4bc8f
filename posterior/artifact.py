"""The exported sampler artifact (a model-repository version folder), loaded without any training code.

    <version>/sampler.json   format, dims (θ's, x's, and the score's: larger for a predictive model), VE schedule, training prior spec and hash, N_train, defaults
    <version>/score.pt2      the score network as a ``torch.export`` program (gradients flow through it)

``load_artifact`` is what the engine's sampler service and ``veil sample`` use: the same
:class:`PriorGuidePosterior` as in Python, over the exported program.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .priors import Prior, prior_from_spec
from .sampler import PriorGuidePosterior, SamplerSettings
from .score import NetworkScore, VESchedule

SAMPLER_FILE, PROGRAM_FILE, FORMAT = "sampler.json", "score.pt2", 1


@dataclass
class SamplerArtifact:
    """A loaded artifact: the posterior over the exported score, the training prior and the defaults."""

    posterior: PriorGuidePosterior
    train_prior: Prior
    defaults: SamplerSettings
    spec: dict[str, Any]


def resolve(path: str | Path) -> Path:
    """sampler.json itself, in a version folder, or in a model folder's highest numeric version."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / SAMPLER_FILE).is_file():
        return path / SAMPLER_FILE
    versions = sorted((int(p.name) for p in path.glob("*") if p.is_dir() and p.name.isdigit()), reverse=True)
    for v in versions:
        if (path / str(v) / SAMPLER_FILE).is_file():
            return path / str(v) / SAMPLER_FILE
    raise FileNotFoundError(f"model: expected a {SAMPLER_FILE} in {str(path)!r} or its version folders, found none")


def load_artifact(path: str | Path) -> SamplerArtifact:
    """Load a sampler (``sampler.json``, its version folder or its model folder) and its ``torch.export`` program.

    Raises:
        FileNotFoundError: a file is missing. ValueError: sampler.json is malformed (the message names the field).
    """
    spec_path = resolve(path)
    spec = json.loads(spec_path.read_text())
    if spec.get("format") != FORMAT or spec.get("kind") != "priorguide-sampler":
        raise ValueError(f"{spec_path}: expected format {FORMAT} of kind 'priorguide-sampler', received format "
                         f"{spec.get('format')!r} kind {spec.get('kind')!r}")
    program_path = spec_path.parent / spec.get("program", PROGRAM_FILE)
    if not program_path.is_file():
        raise FileNotFoundError(f"{spec_path.parent}: expected the score program {program_path.name}, not found")
    program = torch.export.load(str(program_path)).module()
    for p in program.parameters():
        p.requires_grad_(False)
    spec.setdefault("theta_dim", spec["dim"])  # dim > theta_dim: a predictive model of the joint (θ, x*)
    train_prior = prior_from_spec(spec["train_prior"], dim=spec["theta_dim"], where="sampler.json train_prior")
    sde = spec["sde"]
    if sde.get("type") != "ve":
        raise ValueError(f"{spec_path}: sde.type expected 've', received {sde.get('type')!r}")
    posterior = PriorGuidePosterior(NetworkScore(program, spec["dim"], spec["x_dim"]), train_prior, spec["n_train"],
                                    VESchedule(sde["sigma_min"], sde["sigma_max"]))
    return SamplerArtifact(posterior, train_prior, SamplerSettings.from_dict(spec.get("defaults", {})), spec)
