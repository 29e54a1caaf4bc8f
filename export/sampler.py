"""Export a PriorGuide sampler checkpoint into the model repository: a ``torch.export`` score program.

    <repo>/<name>/config.pbtxt      backend "veil_sampler": FP32 x, optional BYTES prior -> FP32 samples, BYTES diagnostics
    (a predictive model, trained on the joint (θ, x*), adds the FP32 output predictive: x* draws)
    <repo>/<name>/1/sampler.json    dims, VE schedule, training prior (spec + hash), N_train, sampling defaults
    <repo>/<name>/1/score.pt2       the score network (``torch.export``; the guidance differentiates through it)
    <repo>/<name>/veil.json         kind "priorguide-sampler", source checkpoint hash, validation report

ONNX cannot give the input gradient the guidance needs at serve time, so the network travels as an exported
program. Export checks it against the eager network on fresh batch sizes: outputs and input gradients.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from veil.posterior.artifact import FORMAT, PROGRAM_FILE, SAMPLER_FILE
from veil.posterior.sampler import MAX_SAMPLES, SamplerSettings
from veil.training.checkpoint import checkpoint_hash
from veil.training.priorguide import ScoreNet, load_sampler

from veil.atomic import write_atomic
from veil.kinds import Kind, sampler_config

from .errors import ExportError
from .repository import NAME_PATTERN, model_folder

TOLERANCE = 1e-4  # max |program − eager| relative to the largest |eager| value, outputs and gradients


def export_program(model: ScoreNet) -> torch.export.ExportedProgram:
    """``torch.export`` of s(θ_t [n, d], σ [n], x [n, d_x]) with a dynamic batch dimension n."""
    cfg = model.config
    n = torch.export.Dim("n", min=1, max=MAX_SAMPLES)
    example = (torch.randn(4, cfg.dim), torch.rand(4) + 0.1, torch.randn(4, cfg.x_dim))
    return torch.export.export(model.eval(), example, dynamic_shapes=({0: n}, {0: n}, {0: n}))


def validate_program(model: ScoreNet, program: torch.nn.Module, seed: int = 0) -> dict[str, Any]:
    """Compare program and eager network on batches of 1, 3 and 257 over the whole σ range."""
    cfg, gen = model.config, torch.Generator().manual_seed(seed)
    worst_out = worst_grad = 0.0
    for n in (1, 3, 257):
        sigma = cfg.sigma_min * (cfg.sigma_max / cfg.sigma_min) ** torch.rand(n, generator=gen)
        theta = model.theta_mean + model.theta_std * torch.randn(n, cfg.dim, generator=gen) * (1 + sigma[:, None])
        x = model.x_mean + model.x_std * torch.randn(n, cfg.x_dim, generator=gen)
        outs, grads = [], []
        for fn in (model, program):
            leaf = theta.clone().requires_grad_(True)
            out = fn(leaf, sigma, x)
            (grad,) = torch.autograd.grad((out * torch.linspace(-1, 1, cfg.dim)).sum(), leaf)  # a VJP, as guidance
            outs.append(out.detach())
            grads.append(grad)
        worst_out = max(worst_out, float((outs[0] - outs[1]).abs().max() / outs[0].abs().max().clamp_min(1e-12)))
        worst_grad = max(worst_grad, float((grads[0] - grads[1]).abs().max() / grads[0].abs().max().clamp_min(1e-12)))
    report = {"batches": [1, 3, 257], "max_rel_error_output": worst_out, "max_rel_error_vjp": worst_grad,
              "tolerance": TOLERANCE}
    if worst_out > TOLERANCE or worst_grad > TOLERANCE:
        raise ExportError(f"score program: expected outputs and VJPs within {TOLERANCE} of the eager network, "
                          f"received {worst_out:.2e} (outputs) and {worst_grad:.2e} (VJPs)")
    return report


def export_sampler(checkpoint: str | Path, repo: str | Path, name: str, version: int = 1,
                   defaults: SamplerSettings | None = None) -> dict[str, Any]:
    """Write a `veil train sampler` checkpoint as a ``veil_sampler`` model into ``repo``; returns the manifest."""
    if not NAME_PATTERN.match(name):
        raise ExportError(f"--name: expected letters, digits, '_', '.', '-', received {name!r}")
    model, prior, config = load_sampler(checkpoint)
    model.requires_grad_(False)
    cfg = model.config
    program = export_program(model)
    report = validate_program(model, program.module())
    spec = {"format": FORMAT, "kind": "priorguide-sampler", "program": PROGRAM_FILE, "dim": cfg.dim,
            "theta_dim": prior.dim, "x_dim": cfg.x_dim, "sde": {"type": "ve", "sigma_min": cfg.sigma_min, "sigma_max": cfg.sigma_max},
            "train_prior": prior.to_spec(), "train_prior_hash": prior.hash(),
            "n_train": config["train"]["simulations"], "task": config.get("task", {}),
            "defaults": (defaults or SamplerSettings()).to_dict(), "max_samples": MAX_SAMPLES}
    manifest = {"format": 1, "name": name, "version": version, "kind": Kind.PRIORGUIDE_SAMPLER.value,
                "dim": cfg.dim, "x_dim": cfg.x_dim, "train_prior_hash": prior.hash(), "task": config.get("task", {}),
                "source": {"checkpoint": str(Path(checkpoint).resolve()), "sha256": checkpoint_hash(checkpoint)},
                "export": {"format": "torch.export", "torch": torch.__version__, "validation": report}}
    with model_folder(repo, name, version) as (folder, tmp):  # published whole: version, veil.json, config.pbtxt
        torch.export.save(program, str(tmp / PROGRAM_FILE))
        (tmp / SAMPLER_FILE).write_text(json.dumps(spec, indent=2, sort_keys=True))
        write_atomic(folder / "veil.json", json.dumps(manifest, indent=2, sort_keys=True))
        # a joint (θ, x*) model also draws x* ("predictive")
        write_atomic(folder / "config.pbtxt", sampler_config(name, prior.dim, cfg.x_dim, cfg.dim - prior.dim))
    return manifest
