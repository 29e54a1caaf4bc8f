"""Export a codec checkpoint into the model repository: three ONNX graphs + codec.json, validated vs torch.

    <repo>/<name>/config.pbtxt         backend "veil_codec": BYTES image / bitstream in, BYTES out
    <repo>/<name>/1/codec.json         scales, active bits (group mask), d, code magnitudes, stride, prior inputs
    <repo>/<name>/1/encoder.onnx       image (1, 3, H, W) -> latent (1, d, H/16, W/16)
    <repo>/<name>/1/decoder.onnx       latent (1, d, h, w) -> image (1, 3, 16h, 16w)
    <repo>/<name>/1/prior.onnx         feats (1, L, 9d), pos (1, L, 4F), sid (1, L) -> logits (1, L, d)
    <repo>/<name>/veil.json            kind "codec", the artifact hash (the model hash in every stream), validation

The bitwise quantizer itself is a few lines of numpy in ``veil.codec.runtime`` (sign of an area-averaged
residual), shared with nothing else; all coding runs through these ONNX graphs with ONNX Runtime.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from veil.codec.runtime import artifact_hash
from veil.codec.tokens import prior_inputs
from veil.training.checkpoint import checkpoint_hash
from veil.training.codec.model import NextScalePrior, Tokenizer
from veil.training.codec.trainer import geometry, load_codec

from veil.atomic import write_atomic
from veil.kinds import Kind, codec_config

from .errors import ExportError
from .onnx_export import export_graph, package_versions
from .repository import NAME_PATTERN, model_folder

TOLERANCE = 1e-4


def _export(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], names: list[str], outputs: list[str],
            dims: dict[str, dict[int, str]], path: Path) -> dict[str, Any]:
    graph = export_graph(module, inputs, names, outputs, dims)
    onnx.save(graph.model, str(path))
    return graph.info


def _check(path: Path, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], names: list[str]) -> float:
    """max |ONNX Runtime - torch| on inputs of other shapes than the export example; raises past TOLERANCE."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})[0]
    with torch.no_grad():
        want = module(*inputs).numpy()
    diff = float(np.abs(got - want).max())
    if not diff <= TOLERANCE:
        raise ExportError(f"{path.name}: ONNX Runtime differs from torch by {diff:.2e} (> {TOLERANCE}) on shapes "
                          f"{[list(t.shape) for t in inputs]}")
    return diff


def export_graphs(tok: Tokenizer, prior: NextScalePrior, out: Path) -> dict[str, Any]:
    """Write the three graphs and codec.json into ``out``; returns the export info and validation report."""
    cfg, geo = tok.cfg, geometry(tok)
    gen = torch.Generator().manual_seed(0)
    info = {
        "encoder": _export(tok.encoder, (torch.rand(1, 3, 64, 96, generator=gen) - 0.5,), ["image"], ["latent"],
                           {"image": {2: "height", 3: "width"}}, out / "encoder.onnx"),
        "decoder": _export(tok.decoder, (torch.randn(1, cfg.d, 4, 6, generator=gen),), ["latent"], ["image"],
                           {"latent": {2: "h", 3: "w"}}, out / "decoder.onnx"),
    }
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 2, (hk, wk, m), dtype=np.uint8) for (hk, wk), m in
              zip([(1, 1), (1, 1), (1, 2), (2, 2), (2, 3), (2, 3), (3, 4), (4, 6), (6, 8), (8, 11)][:geo.K],
                  geo.bits, strict=False)]
    example = tuple(torch.from_numpy(a) for a in prior_inputs(tokens, 8, 11, geo, min(4, geo.K - 1)))
    info["prior"] = _export(prior, example, ["feats", "pos", "sid"], ["logits"],
                            {n: {1: "tokens"} for n in ("feats", "pos", "sid")}, out / "prior.onnx")
    spec = {"format": 1, "d": cfg.d, "scales": cfg.scales, "bits": cfg.bits, "alphas": geo.alphas,
            "stride": cfg.stride, "n_freq": cfg.n_freq, "quant": cfg.quant,
            "inputs": {"encoder": "image (1,3,H,W) float32 in [-0.5,0.5], H and W multiples of the stride",
                       "decoder": "latent (1,d,h,w)", "prior": "feats (1,L,9d), pos (1,L,4F), sid (1,L) int64"}}
    write_atomic(out / "codec.json", json.dumps(spec, indent=1, sort_keys=True))
    # validate at shapes other than the examples (sizes where the scales are not divisible)
    big = tuple(torch.from_numpy(a) for a in prior_inputs(tokens, 8, 11, geo, geo.K - 1 if geo.K <= 10 else 9))
    validation = {
        "encoder": _check(out / "encoder.onnx", tok.encoder, (torch.rand(1, 3, 80, 48, generator=gen) - 0.5,),
                          ["image"]),
        "decoder": _check(out / "decoder.onnx", tok.decoder, (torch.randn(1, cfg.d, 5, 3, generator=gen),), ["latent"]),
        "prior": _check(out / "prior.onnx", prior, big, ["feats", "pos", "sid"]),
        "tolerance": TOLERANCE,
    }
    return {"export": info, "validation": validation}


def export_codec(checkpoint: str | Path, repo: str | Path, name: str, version: int = 1) -> dict[str, Any]:
    """Export a `veil train codec` checkpoint as a servable codec model; returns the manifest (veil.json)."""
    if not NAME_PATTERN.match(name):
        raise ExportError(f"--name: expected letters, digits, '_', '.', '-', received {name!r}")
    tok, prior, config = load_codec(checkpoint)
    with model_folder(repo, name, version) as (folder, tmp):  # published whole: version, veil.json, config.pbtxt
        report = export_graphs(tok, prior, tmp)
        digest = artifact_hash(tmp)
        manifest = {
            "format": 1, "name": name, "version": version, "kind": Kind.CODEC.value, "model_hash": digest,
            "stream_model_hash": digest[:8], "scales": config["model"]["scales"], "bits": config["model"]["bits"],
            "training_images": config.get("images", []),
            "source": {"checkpoint": str(Path(checkpoint).resolve()), "sha256": checkpoint_hash(checkpoint)},
            "versions": package_versions(), **report,
        }
        write_atomic(folder / "veil.json", json.dumps(manifest, indent=2, sort_keys=True, default=str))
        write_atomic(folder / "config.pbtxt", codec_config(name))
    return manifest
