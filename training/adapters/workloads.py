"""What ``veil finetune`` needs per method and per workload: the method table, the adapter config each method gets
on MiniLM (BERT module names) or the tiny ViT, method-specific flags generated from the method configs, and the
digits 0–4 → 5–9 ViT workload.

Method options live in the method configs: ``--<method>-<field>`` flags are generated from each config's own
fields, and ``--config JSON`` (inline or a file) sets any field of the chosen method's config.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.config import ConfigError

from .config import AdapterConfig
from .registry import AdapterMethod, get_method

if TYPE_CHECKING:  # torch is imported by the functions that train (the parser's flags need none of it)
    import torch
    from torch import nn

METHOD_CHOICES = [m.value for m in AdapterMethod] + ["probe"]
TEXT_TASKS = ["sentiment", "number", "topic"]
DIGITS_TASK = "digits-5to9"
VIT_DIGITS = "vit-digits"
# BERT names of the pieces the methods' LLaMA-style defaults name (q/k/v/o_proj, mlp, self_attn).
BERT_LINEARS = ["query", "key", "value", "dense"]
BERT_ATTENTION_PROJECTIONS = ["query", "key", "value", "attention.output.dense"]
# mtLoRA block adapters wrap whole sub-layers whose first argument is the sub-layer input: BertIntermediate (the
# FFN's up-projection + GELU; its input is the attention block's output) and BertAttention (self-attention +
# output projection; Δ is added to element 0 of its tuple output).
BERT_BLOCK_TARGETS = {"ffn": ["intermediate"], "attention": ["attention"], "both": ["intermediate", "attention"]}
# Fields the common flags (--r, --alpha, --dropout, --target-modules) already cover, or that are set per workload.
COMMON_FIELDS = {f.name for f in dataclasses.fields(AdapterConfig)} | {
    "lora_alpha", "lora_dropout", "psoft_alpha", "psoft_dropout", "share_intervals"}


def method_config_cls(method: str) -> type[AdapterConfig]:
    return get_method(method).config_cls


def own_fields(method: str) -> tuple[str, ...]:
    """Names of the ``--<method>-<field>`` flags: the method config's fields minus the common ones."""
    return tuple(f.name for f in dataclasses.fields(method_config_cls(method)) if f.name not in COMMON_FIELDS)


def add_method_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` plus one generated ``--<method>-<field>`` flag per method-specific config field."""
    parser.add_argument("--config", default=None, metavar="JSON",
                        help="the method config's fields as a JSON object, inline or a file path (overrides --r etc.)")
    for method in METHOD_CHOICES[:-1]:
        cls = method_config_cls(method)
        hints = typing.get_type_hints(cls)
        skip = tuple(n for n in hints if n in COMMON_FIELDS or typing.get_origin(hints[n]) is dict)
        cls.add_arguments(parser, prefix=f"{method}-", skip=skip)


def read_config_json(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    path = Path(text)
    data = json.loads(path.read_text() if not text.lstrip().startswith("{") and path.exists() else text)
    if not isinstance(data, dict):
        raise ConfigError(f"--config: expected a JSON object, received {type(data).__name__}")
    return data


def adapter_config(cfg, args: argparse.Namespace, base_name: str, vit: bool = False) -> AdapterConfig | None:
    """The method config for ``cfg.method`` on MiniLM or the tiny ViT (same module names); None for ``probe``.

    Precedence: the method's defaults < the common flags < ``--config`` < ``--<method>-<field>`` flags.
    """
    if cfg.method == "probe":
        return None
    cls = method_config_cls(cfg.method)
    names = {f.name for f in dataclasses.fields(cls)}
    base: dict[str, Any] = {"r": cfg.r, "modules_to_save": ["classifier"], "task_type": "SEQ_CLS",
                            "base_model_name_or_path": base_name}
    for key in ("lora_alpha", "psoft_alpha"):
        if key in names:
            base[key] = cfg.alpha
    for key in ("lora_dropout", "psoft_dropout"):
        if key in names:
            base[key] = cfg.dropout
    target = default_targets(cfg, args, vit)
    if target is not None:
        base["target_modules"] = target
    if cfg.method == "e2lora":  # MiniLM's pooler is unused by the mean-pool head: no gradient for the probe
        base["exclude_modules"] = ["pooler.dense"]
    base.update(read_config_json(getattr(args, "config", None)))
    return cls.from_args(args, prefix=f"{cfg.method}-", base=base)


def default_targets(cfg, args: argparse.Namespace, vit: bool = False) -> list[str] | str | None:
    """``--target-modules`` if given, else the method's targets in BERT names (None: the config's default); on the
    tiny ViT, LoRA takes every Linear of the blocks (``all-linear``: q/k/v/o_proj, fc1, fc2; not the head)."""
    if args.target_modules is not None:  # given on the command line
        return "all-linear" if cfg.target_modules == ["all-linear"] else list(cfg.target_modules)
    if cfg.method == "vapt":
        return None
    if vit:
        return "all-linear"  # VaptConfig's default: transformers' ViT blocks
    if cfg.method == "mtlora":
        return list(BERT_BLOCK_TARGETS[getattr(args, "mtlora_block_adapter_type", None) or "ffn"])
    if cfg.method == "loramixer":
        return list(BERT_ATTENTION_PROJECTIONS)
    return list(BERT_LINEARS)


def e2lora_plan(base: nn.Module, config, batch: dict[str, torch.Tensor], forward) -> AdapterConfig:
    """E²LoRA's planning pass (``plan_sharing``) on one training batch; ``forward(model, batch)`` gives logits."""
    from torch import nn

    from .e2lora import plan_sharing

    def loss_fn(model: nn.Module) -> torch.Tensor:
        return nn.functional.cross_entropy(forward(model, batch), batch["labels"])

    return plan_sharing(base, config, loss_fn)


def save_adapter(folder: Path, model: nn.Module) -> None:
    """The native checkpoint, plus the plain-LoRA export (E²LoRA ``save_as_lora``, PSOFT ``lora_state_dict``)."""
    from .checkpoint import write_files

    base = type(model.model).__name__  # checked when veil loads the adapter (checkpoint.load_adapter)
    write_files(folder, model.config.to_peft_dict(), model.adapter_state_dict(), base)
    if hasattr(model, "save_as_lora"):
        model.save_as_lora(folder / "as_lora")
    elif hasattr(model, "lora_state_dict"):
        write_files(folder / "as_lora", model.lora_config().to_peft_dict(), model.lora_state_dict(), base)


# -- the digits workload --------------------------------------------------------------------------------------------
def build_vit_digits(cfg, progress: bool = False) -> tuple[nn.Module, dict[str, Any]]:
    """The tiny ViT pre-trained (seeded) on digits 0–4 with a fresh 5-class head for 5–9, and its pre-train accuracy.

    ``progress``: the pre-training's epochs as a bar (a line in a log); it is most of a digits run's time.
    """
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    from .vapt.digits import TINY_VIT, accuracy, digit_split, fit

    torch.manual_seed(cfg.seed)
    base = ViTForImageClassification(ViTConfig(**TINY_VIT))
    xa, ya, xa_test, ya_test = digit_split(low=True, seed=cfg.seed)
    fit(base, xa, ya, cfg.pretrain_epochs, lr=3e-3, seed=cfg.seed, progress=progress,
        desc="pre-train the tiny ViT on digits 0-4")
    info = {"pretrain_accuracy_0_4": accuracy(base, xa_test, ya_test)}
    torch.manual_seed(cfg.seed + 1)
    base.classifier.reset_parameters()
    return base, info


def vit_logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(pixel_values=batch["pixel_values"]).logits


def train_digits(model: nn.Module, cfg, lr: float, progress: bool = True) -> dict[str, Any]:
    """Adapt to digits 5–9 (relabelled 0–4): AdamW, ``cfg.batch_size``, cross-entropy + ``aux_loss()``."""
    import torch
    from torch import nn

    from veil.progress import progress as progress_bar

    from .. import distributed
    from .vapt.digits import accuracy, digit_split

    x, y, x_test, y_test = digit_split(low=False, seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    # DDP under torchrun (training/distributed.py), else the model itself; routed adapters (LoRA-Mixer) may
    # leave experts unused in a step
    net = distributed.wrap(model, find_unused_parameters=True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
    history, start = [], time.perf_counter()
    bar = progress_bar(total=cfg.epochs, desc=f"finetune {cfg.method} on {DIGITS_TASK}",
                       enabled=progress and distributed.is_main(), leave=False)
    for epoch in range(cfg.epochs):
        model.train()
        total = aux_sum = 0.0
        chunks = torch.randperm(len(y)).split(cfg.batch_size)
        for idx in chunks:  # every rank drew the same permutation (same seed): each trains on its slice
            rows, local = distributed.batch_rows(len(idx))
            loss = nn.functional.cross_entropy(vit_logits(net, {"pixel_values": x[idx[rows]]}), y[idx[rows]])
            aux = model.aux_loss() if hasattr(model, "aux_loss") else torch.zeros(())
            opt.zero_grad()
            ((loss + aux) * distributed.loss_scale(local, len(idx))).backward()
            opt.step()
            total = total + distributed.global_mean(loss.item(), local, len(idx))
            aux_sum = aux_sum + distributed.global_mean(aux.item(), local, len(idx))
        history.append({"epoch": epoch + 1, "loss": total / len(chunks), "aux_loss": aux_sum / len(chunks)})
        bar.update(1)
    bar.close()
    model.eval()
    return {"history": history, "test_accuracy": accuracy(model, x_test, y_test),
            "train_seconds": round(time.perf_counter() - start, 2), "trainable_params": sum(p.numel() for p in params)}
