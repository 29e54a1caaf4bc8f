"""Export a ULD-Net checkpoint as an encrypted-inference model: ONNX -> HE plan in the model repository.

    <repo>/<name>/config.pbtxt     backend "veil_he": BYTES ciphertext envelope in, BYTES envelope out
    <repo>/<name>/1/plan.json      the compiled program (ops, levels, CKKS parameters, key manifest)
    <repo>/<name>/1/plan.safetensors   its plaintext weights
    <repo>/<name>/veil.json        kind "he-plan", parameters and their hash, plan hash, key manifest, source

With ``refresh=True`` (``veil export he --refresh``) a plan deeper than one 128-bit parameter set is cut
into segments run in client-refresh rounds (:mod:`veil.he.segments`): ``<version>/segments.json`` plus a
plan per ``segment_<k>/``, and ``veil.json`` records the segmentation (rounds, cuts, per-segment levels,
N and why).

The ONNX graph is the one ``veil export onnx`` validates against PyTorch; the plan is compiled from it, so
plaintext and encrypted inference are the same function by construction.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from veil.he.compiler import compile as he_compile
from veil.he.cost import MAX_KEY_BYTES
from veil.he.params import describe
from veil.he.segments import compile_segmented
from veil.training.checkpoint import checkpoint_hash
from veil.training.uldnet import load_uldnet

from veil.kinds import Kind, he_config
from veil.progress import stage

from .errors import ExportError
from .he_params import parameter_choice
from .onnx_export import export_graph
from .repository import NAME_PATTERN, model_folder
from .uldnet import input_contract

if TYPE_CHECKING:
    from veil.he.plan import Plan


def plan_manifest(name: str, version: int, mode: str, plan: Plan) -> dict[str, Any]:
    """The ``veil.json`` fields every ``he-plan`` model records: mode, levels, CKKS parameters and their hash, the
    plan hash, the Galois steps, what the set costs (``describe``) and why it is the smallest ring that holds it."""
    params = plan.parameters()
    return {"format": 1, "name": name, "version": version, "kind": Kind.HE_PLAN.value, "mode": mode,
            "levels": plan.levels, "parameters": params.to_dict(), "params_hash": params.hash(),
            "plan_hash": plan.hash(), "galois_steps": plan.galois_steps,
            "describe": describe(params, plan.galois_steps), "parameter_choice": parameter_choice(plan)}


def write_plan_model(repo: str | Path, name: str, version: int, manifest: dict[str, Any],
                     save: Callable[[Path], None], filename: str = "plan.json") -> None:
    """Publish an HE plan model whole: ``save(version_folder)`` writes the plan, then veil.json and config.pbtxt."""
    with model_folder(repo, name, version) as (folder, version_folder):
        save(version_folder)
        (folder / "veil.json").write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
        (folder / "config.pbtxt").write_text(he_config(name, filename))

def export_he(checkpoint: str | Path, repo: str | Path, name: str, mode: str = "latency", version: int = 1,
              precision_bits: int = 20, refresh: bool = False,
              max_poly_modulus_degree: int | None = None, rotation_keys: str = "exact",
              max_key_bytes: int = MAX_KEY_BYTES, progress: bool = True, replicate: bool | None = None) -> dict[str, Any]:
    """Compile a ULD-Net checkpoint into an HE plan and write it into ``repo``; returns the manifest.

    With ``progress`` (and TQDM_DISABLE unset) each stage (ONNX export, compile, write) ends with one stderr
    line: a deep model's compile takes minutes.

    ``rotation_keys`` is the latency plan's key manifest ("exact": fastest, "pow2", "binary": fewest keys,
    "budget:K"); ``replicate`` True compiles it for one image per ciphertext, tiled over every slot (``he.compile``),
    False never, None (default) each segment whose block leaves slots free when the plan holds one image per
    ciphertext anyway (``he.latency.replicated_segments``).

    ``refresh`` opts this model into client-refresh rounds when it is deeper than one parameter set
    (off: such a model is refused); ``max_poly_modulus_degree`` (with ``refresh``) also cuts where a
    segment would need a larger ring; ``max_key_bytes`` bounds the keys (with ``refresh``: of all segments;
    the segment search's budget, :mod:`veil.he.cost`).
    """
    if not NAME_PATTERN.match(name):
        raise ExportError(f"--name: expected letters, digits, '_', '.', '-', received {name!r}")
    model, config = load_uldnet(checkpoint)
    shape = list(config["model"]["input_shape"])
    with stage(f"export he {name}: ONNX graph", enabled=progress):
        graph = export_graph(model, (torch.randn(4, *shape),), ["x"], ["logits"], {"x": {0: "batch"}})
    with stage(f"export he {name}: compile ({mode})", enabled=progress) as info:
        segmented = compile_segmented(graph.model, mode=mode, precision_bits=precision_bits, refresh=refresh,
                                      max_poly_modulus_degree=max_poly_modulus_degree, max_key_bytes=max_key_bytes,
                                      replicate=replicate,
                                      compiler=functools.partial(he_compile, rotation_keys=rotation_keys,
                                                                 **({"replicate": True} if replicate else {})))
        info["rounds"] = segmented.rounds
    plan = segmented.plans[0]
    manifest = plan_manifest(name, version, mode, plan) | {
        "classes": config["data"]["classes"], "input_shape": shape, "input": input_contract(config),
        "source": {"checkpoint": str(Path(checkpoint).resolve()), "sha256": checkpoint_hash(checkpoint)},
        "export": graph.info, "rounds": segmented.rounds, "cuts": segmented.cuts,
        "segmentation": segmented.report,
        "segments": [s | {"describe": describe(p.parameters(), p.galois_steps)}
                     for s, p in zip(segmented.segments(), segmented.plans, strict=True)],
    }
    if segmented.rounds > 1:  # the first round's set stays at the top; the model hash covers every segment
        manifest |= {"plan_hash": segmented.hash(), "levels": sum(p.levels for p in segmented.plans)}
    filename = "segments.json" if segmented.rounds > 1 else "plan.json"
    with stage(f"export he {name}: write plan", enabled=progress):  # published whole, config.pbtxt included
        write_plan_model(repo, name, version, manifest, segmented.save, filename)
    return manifest
