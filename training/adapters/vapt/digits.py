"""Issue §3 workload: a tiny ViT pre-trained on scikit-learn digits 0–4, adapted to digits 5–9 with VAPT (Le et al.,
ICLR 2026, arXiv 2501.18936) versus a linear probe on the same frozen backbone.

Run: ``python -m veil.training.adapters.vapt.digits`` (prints JSON; about a minute on 2 CPU cores).
"""

from __future__ import annotations

import copy
import json

import torch
import torch.nn.functional as F
from torch import nn
from transformers import ViTConfig, ViTForImageClassification

from .. import inject
from .config import VaptConfig

TINY_VIT = {"image_size": 8, "patch_size": 2, "num_channels": 1, "hidden_size": 32, "num_hidden_layers": 3,
            "num_attention_heads": 4, "intermediate_size": 64, "num_labels": 5}


def digit_split(low: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test) for digits 0–4 (``low``) or 5–9 relabelled 0–4; x (B, 1, 8, 8) in [0, 1]."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (n, 1, 8, 8)
    y = torch.tensor(data.target)
    keep = y < 5 if low else y >= 5
    x, y = x[keep], y[keep] % 5
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(0.7 * len(y))
    return x[perm[:cut]], y[perm[:cut]], x[perm[cut:]], y[perm[cut:]]


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, seed: int = 0,
        progress: bool = False, desc: str = "fit") -> None:
    """AdamW on the trainable parameters, batch 64, cross-entropy; ``progress``: one bar / log line per ``desc``."""
    from veil.progress import progress as progress_bar

    torch.manual_seed(seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=1e-4)
    model.train()
    for _ in progress_bar(range(epochs), desc=desc, enabled=progress, leave=False):
        for idx in torch.randperm(len(y)).split(64):
            opt.zero_grad()
            F.cross_entropy(model(pixel_values=x[idx]).logits, y[idx]).backward()
            opt.step()
    model.eval()


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return (model(pixel_values=x).logits.argmax(-1) == y).float().mean().item()


def run_digits(pretrain_epochs: int = 30, adapt_epochs: int = 30, num_tokens: int = 4, seed: int = 0) -> dict:
    """Pre-train on 0–4, then adapt to 5–9 two ways on the frozen backbone (new 5-class head each):
    a linear probe (head only) and VAPT (prompts + head). Returns accuracies and trainable counts."""
    torch.manual_seed(seed)
    base = ViTForImageClassification(ViTConfig(**TINY_VIT))
    xa, ya, xa_test, ya_test = digit_split(low=True, seed=seed)
    fit(base, xa, ya, pretrain_epochs, lr=3e-3, seed=seed)
    xb, yb, xb_test, yb_test = digit_split(low=False, seed=seed)
    out: dict = {"pretrain_accuracy_0_4": accuracy(base, xa_test, ya_test)}
    for name, extra in (("probe", None), ("vapt", VaptConfig(num_tokens=num_tokens, modules_to_save=["classifier"]))):
        model = copy.deepcopy(base)
        torch.manual_seed(seed + 1)
        model.classifier.reset_parameters()  # the same new head for both
        if extra is None:
            model.requires_grad_(False)
            model.classifier.requires_grad_(True)
        else:
            model = inject(model, extra)
        fit(model, xb, yb, adapt_epochs, lr=1e-2, seed=seed)
        out[f"{name}_accuracy"] = accuracy(model, xb_test, yb_test)
        out[f"{name}_trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return out


if __name__ == "__main__":
    print(json.dumps(run_digits(), indent=2))
