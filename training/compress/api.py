"""``compress(model, recipe, calibration, output_dir)``: run a recipe's stages in order and write the result.

The output folder (written atomically) holds ``model.safetensors`` (the compressed weights, factorised layers as
``<name>.first.weight`` / ``<name>.second.weight``), ``config.json`` (how to rebuild the base model, the rank of
every factorised layer, the recipe and the calibration hash), ``report.json`` and ``report.md``.
:func:`load_compressed` rebuilds the model from that folder.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from veil.atomic import atomic_dir

from .calibration import Calibration
from .log import ModuleLog
from .lowrank.layer import FactorizedLinear, replace_module
from .recipe import Recipe, load_recipe
from .report import count_params, drift_table, parameter_report, to_markdown

EvalFn = Callable[[nn.Module], dict[str, float]]


def describe_base(model: nn.Module) -> dict[str, Any]:
    """How to rebuild the uncompressed architecture: a transformers model (its class and config), optionally
    inside veil's SentenceEncoder wrapper; other modules cannot be rebuilt from the folder."""
    from transformers import PreTrainedModel
    from veil.training.encoder import SentenceEncoder

    if isinstance(model, SentenceEncoder):
        return {**describe_base(model.encoder), "type": "sentence_encoder", "normalize": model.normalize}
    if isinstance(model, PreTrainedModel):
        return {"type": "transformers", "class": type(model).__name__, "config": model.config.to_dict()}
    return {"type": "module", "class": type(model).__name__}


def factorised_ranks(model: nn.Module) -> dict[str, int]:
    return {name: m.rank for name, m in model.named_modules() if isinstance(m, FactorizedLinear)}


def compress(model: nn.Module, recipe: str | Path | dict[str, Any] | list[Any] | Recipe, calibration: Calibration,
             output_dir: str | Path | None = None, eval_fn: EvalFn | None = None,
             eval_data: Calibration | None = None, drift: bool = True, progress: bool = True) -> dict[str, Any]:
    """Compress ``model`` in place by ``recipe`` and return the report (also written to ``output_dir``).

    Args:
        model: the model to compress (changed in place; an uncompressed copy is kept while ``drift`` or
            ``eval_fn`` needs it).
        recipe: a YAML/JSON path, a dict/list, or a parsed Recipe.
        calibration: the calibration batches every stage reads.
        output_dir: where the compressed model and report.json/report.md go (None: write nothing).
        eval_fn: ``model -> {metric: value}`` on held-out data (e.g. perplexity), run before and after each stage.
        eval_data: held-out batches for the drift table (default: the calibration batches).
        drift: compute the depth-wise drift table.
    """
    recipe = load_recipe(recipe)
    torch.manual_seed(recipe.seed)
    params_before = count_params(model)
    reference = copy.deepcopy(model).eval() if (drift or eval_fn) else None  # the uncompressed model, kept only if used
    log = ModuleLog(progress=progress)
    before = eval_fn(reference) if eval_fn else {}
    stages, after_stage = [], []
    start = time.perf_counter()
    for entry in recipe.stages:
        log.stage = entry.stage.name
        t0 = time.perf_counter()
        summary = entry.stage.apply(model, entry.config, calibration, log)
        stages.append({"method": entry.stage.name, "seconds": round(time.perf_counter() - t0, 3), **summary})
        if eval_fn:
            after_stage.append({"method": entry.stage.name, **eval_fn(model)})
    model.eval()
    report: dict[str, Any] = {
        "recipe": recipe.to_dict(),
        "calibration": calibration.describe(),
        "parameters": parameter_report(params_before, model),
        "stages": stages,
        "seconds": round(time.perf_counter() - start, 3),
        "modules": log.records,
    }
    if eval_fn:
        last = {k: v for k, v in after_stage[-1].items() if k != "method"} if after_stage else {}
        report["metrics"] = {"before": before, "after": last, "after_each_stage": after_stage}
    if drift:
        report["drift"] = drift_table(reference, model, eval_data or calibration)
    if output_dir is not None:
        save_compressed(model, output_dir, report)
    return report


def save_compressed(model: nn.Module, output_dir: str | Path, report: dict[str, Any]) -> Path:
    """Write weights, config (base + ranks), report.json and report.md as one folder, atomically."""
    from safetensors.torch import save_model

    from .heapr import RaggedExperts, layout, moe_blocks

    ragged = any(isinstance(block.experts, RaggedExperts) for _, block in moe_blocks(model))
    config = {"kind": "compressed", "base": describe_base(model), "factorized": factorised_ranks(model),
              # pruned MoE blocks (HEAPr, expert_prune): expert count and per-expert widths
              "moe_layout": layout(model) if ragged else {},
              "recipe": report["recipe"], "calibration": report["calibration"]}
    with atomic_dir(output_dir) as tmp:
        save_model(model, str(tmp / "model.safetensors"))  # handles tied weights
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        (tmp / "report.json").write_text(json.dumps(report, indent=1))
        (tmp / "report.md").write_text(to_markdown(report))
    return Path(output_dir)


def load_compressed(folder: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild a compressed model (eval mode) from a :func:`compress` output folder; returns (model, config)."""
    import transformers
    from safetensors.torch import load_file, load_model

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"compressed model {str(folder)!r}: expected config.json, not found")
    config = json.loads((folder / "config.json").read_text())
    base = config.get("base", {})
    if config.get("kind") != "compressed" or base.get("type") not in ("transformers", "sentence_encoder"):
        raise ValueError(f"compressed model {str(folder)!r}: expected kind 'compressed' with a transformers base, "
                         f"received kind {config.get('kind')!r}, base {base.get('type')!r}")
    cls = getattr(transformers, base["class"])
    inner = cls(cls.config_class.from_dict(base["config"]))
    if base["type"] == "sentence_encoder":
        from veil.training.encoder import SentenceEncoder

        model: nn.Module = SentenceEncoder(inner, base["normalize"])
    else:
        model = inner
    if config.get("moe_layout"):  # pruned experts: ragged widths before the weights load
        from .heapr import apply_layout

        apply_layout(model, config["moe_layout"])
    state = load_file(str(folder / "model.safetensors"))
    for name, rank in config["factorized"].items():
        old = model.get_submodule(name)
        replace_module(model, name, FactorizedLinear(old.in_features, old.out_features, rank,
                                                     bias=f"{name}.second.bias" in state, dtype=old.weight.dtype))
    load_model(model, str(folder / "model.safetensors"))
    return model.eval(), config
