"""The compression report: parameter counts with both ratio conventions, metrics, and the depth-wise drift table.

Ratio convention (spec §1.6, the SVD-LLM / SAES-SVD one): for the factorised layers, ``compression_ratio`` is the
fraction of their weight parameters REMOVED and ``keep_ratio = 1 − compression_ratio`` the fraction kept. The
whole model's counts are reported too: embeddings, norms and the output head are not factorised, so the
whole-model removal is smaller than the nominal ratio.

Drift table: for every repeated block ℓ, over the real tokens of the evaluation batches,
``rel_error_ℓ = ||h_ℓ − h̃_ℓ||_F / ||h_ℓ||_F`` and the mean per-token cosine of h̃_ℓ to h_ℓ, where h is the
uncompressed model's block output and h̃ the compressed one's (forward hooks; same inputs). It shows *where* the
error enters and how it grows with depth.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .calibration import Calibration
from .lowrank.layer import FactorizedLinear
from .recipe import find_blocks


def count_params(model: nn.Module) -> int:
    """Unique parameters (a tied embedding/head counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def factorised_params(model: nn.Module) -> dict[str, Any]:
    """Weight parameters of the factorised layers before (m n) and after (k (m + n)), with both ratios."""
    before = after = 0
    layers = 0
    for module in model.modules():
        if isinstance(module, FactorizedLinear):
            layers += 1
            before += module.in_features * module.out_features
            after += module.rank * (module.in_features + module.out_features)
    keep = after / before if before else 1.0
    return {"layers": layers, "weight_params_before": before, "weight_params_after": after,
            "keep_ratio": keep, "compression_ratio": 1.0 - keep}


def parameter_report(params_before: int, compressed: nn.Module) -> dict[str, Any]:
    """Whole-model and factorised-layer counts, each with keep and compression (removal) ratios spelled out;
    ``params_before`` is :func:`count_params` of the uncompressed model."""
    before, after = params_before, count_params(compressed)
    return {
        "whole_model": {"params_before": before, "params_after": after, "keep_ratio": after / before,
                        "compression_ratio": 1.0 - after / before},
        "factorised_layers": factorised_params(compressed),
        "convention": "compression_ratio = fraction of parameters removed; keep_ratio = 1 - compression_ratio "
                      "(SVD-LLM / SAES-SVD convention; per matrix rank k = floor(m n (1 - ratio) / (m + n)))",
    }


def _block_output(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


@torch.no_grad()
def drift_table(reference: nn.Module, compressed: nn.Module, data: Calibration) -> list[dict[str, float]]:
    """Per block: relative hidden-state error ||h − h̃||/||h|| and mean token cosine, compressed vs reference."""
    _, ref_blocks = find_blocks(reference)
    _, cmp_blocks = find_blocks(compressed)
    if len(ref_blocks) != len(cmp_blocks):
        raise ValueError(f"drift: reference has {len(ref_blocks)} blocks, compressed {len(cmp_blocks)}")
    outputs: dict[str, list[torch.Tensor | None]] = {"ref": [None] * len(ref_blocks), "cmp": [None] * len(ref_blocks)}
    handles = []
    for side, blocks in (("ref", ref_blocks), ("cmp", cmp_blocks)):
        for i, block in enumerate(blocks):
            def hook(_m: nn.Module, _inp: Any, out: Any, _side: str = side, _i: int = i) -> None:
                outputs[_side][_i] = _block_output(out).detach()
            handles.append(block.register_forward_hook(hook))
    err2 = torch.zeros(len(ref_blocks), dtype=torch.float64)
    ref2 = torch.zeros_like(err2)
    cos_sum = torch.zeros_like(err2)
    tokens = 0
    modes = reference.training, compressed.training
    reference.eval()
    compressed.eval()
    try:
        for batch in data.batches:
            reference(**batch)
            compressed(**batch)
            mask = batch.get("attention_mask")
            for i in range(len(ref_blocks)):
                h = outputs["ref"][i].reshape(-1, outputs["ref"][i].shape[-1]).double()  # (B T, d)
                g = outputs["cmp"][i].reshape(-1, outputs["cmp"][i].shape[-1]).double()
                if mask is not None:
                    keep = mask.reshape(-1).bool()
                    h, g = h[keep], g[keep]
                err2[i] += (h - g).pow(2).sum()
                ref2[i] += h.pow(2).sum()
                cos_sum[i] += torch.nn.functional.cosine_similarity(h, g, dim=-1).sum()
            tokens += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
    finally:
        for handle in handles:
            handle.remove()
        reference.train(modes[0])
        compressed.train(modes[1])
    return [{"block": i, "rel_error": float((err2[i] / ref2[i]).sqrt()), "cosine": float(cos_sum[i] / tokens)}
            for i in range(len(ref_blocks))]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def to_markdown(report: dict[str, Any]) -> str:
    """report.md: ratios, metrics, drift table, per-stage summaries and the per-module log."""
    params = report["parameters"]
    whole, fac = params["whole_model"], params["factorised_layers"]
    lines = ["# Compression report", "",
             f"Recipe seed {report['recipe']['seed']}; stages: "
             f"{', '.join(s['method'] for s in report['recipe']['stages'])}. "
             f"Calibration: {report['calibration']['source']} ({report['calibration']['sequences']} sequences, "
             f"{report['calibration']['tokens']} tokens, sha256 {report['calibration']['sha256'][:16]}...).", "",
             "## Parameters", "", f"Convention: {params['convention']}.", "",
             "| | before | after | keep_ratio | compression_ratio (removed) |", "|---|---|---|---|---|",
             f"| whole model | {whole['params_before']} | {whole['params_after']} | {whole['keep_ratio']:.4f} | "
             f"{whole['compression_ratio']:.4f} |",
             f"| factorised layers ({fac['layers']}, weights) | {fac['weight_params_before']} | "
             f"{fac['weight_params_after']} | {fac['keep_ratio']:.4f} | {fac['compression_ratio']:.4f} |", ""]
    if report.get("metrics"):
        lines += ["## Held-out metrics", "", "| metric | uncompressed | compressed |", "|---|---|---|"]
        before, after = report["metrics"]["before"], report["metrics"]["after"]
        lines += [f"| {k} | {_fmt(before.get(k))} | {_fmt(after[k])} |" for k in after]
        lines.append("")
    if report.get("drift"):
        lines += ["## Depth-wise drift (compressed vs uncompressed, per block output)", "",
                  "| block | rel. error ‖h−h̃‖/‖h‖ | cosine |", "|---|---|---|"]
        lines += [f"| {r['block']} | {r['rel_error']:.4f} | {r['cosine']:.5f} |" for r in report["drift"]]
        lines.append("")
    lines += ["## Per-module log", "", "| stage | module | seconds | error | params before | after | extra |",
              "|---|---|---|---|---|---|---|"]
    core = {"stage", "module", "seconds", "error", "params_before", "params_after"}
    for r in report["modules"]:
        extra = ", ".join(f"{k}={_fmt(v)}" for k, v in r.items() if k not in core)
        lines.append(f"| {r['stage']} | {r['module']} | {r['seconds']:.3f} | {_fmt(r['error'])} | "
                     f"{r['params_before']} | {r['params_after']} | {extra} |")
    return "\n".join(lines) + "\n"
