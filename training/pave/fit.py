"""Fitting PAVE vectors: a model's on its own predictions over a probe set, a user's on their labelled examples.

    tau_h = argmin_tau sum_x  CE( g(f(x; theta0 + tau)), h(x) )      model vector: fits p(y_hat | x), not labels
    tau_u = argmin_tau sum_i  CE( g(f(x_i; theta0 + tau)), y_i )     user vector: fits the few labels

with tau = [B_1 A_1, ..., B_L A_L], A frozen and seeded, B from zero, a few full-batch steps; the spec is the unit
concatenation of the B's (cos(B1 A, B2 A) ~ cos(B1, B2) since E[A A^T] = s I). Fitting the model's predictions
makes a badly trained model's vector drift from its task's, which ranks it below the clean model (the paper's
built-in quality filter). Reference: *A Study on PAVE Specification for Learnware* (ICLR 2026); ``other_seeds.md`` §2.

Example:
    >>> base = SpecBase.bundled(PaveConfig(rank=8))
    >>> model = model_spec(base, classifier_predictor(clf, tokenizer), probe_texts)
    >>> user = user_spec(base, texts, labels)
    >>> rank_models(user, {"sentiment": model})
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from veil.pave import PaveVector, SpecMismatch

from .base import SpecBase

Predictor = Callable[[list[str]], np.ndarray]


def fit_vector(base: SpecBase, cache: dict[str, Any], targets: torch.Tensor) -> tuple[np.ndarray, list[float]]:
    """B fitted to soft ``targets`` (n, C) from B = 0 on the head's first C outputs; returns (the concatenated B's,
    the loss per step).

    The softmax spans the task's C classes only: with all K outputs every task with fewer classes would push its
    unused outputs down, a direction shared by all such tasks that swamps what tells them apart."""
    cfg = base.config
    torch.manual_seed(cfg.projection_seed)  # nothing random is drawn; kept for kernels that might be
    bs = [torch.zeros(m.out_features, cfg.rank, requires_grad=True) for _, m in base.targets]  # (out, r) each
    opt = (torch.optim.SGD(bs, lr=cfg.lr) if cfg.optimizer == "sgd" else torch.optim.Adam(bs, lr=cfg.lr))
    losses = []
    for _ in range(cfg.steps):
        logp = nn.functional.log_softmax(base.logits(cache, bs)[:, :targets.shape[1]], dim=-1)  # (n, C)
        loss = -(targets * logp).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return torch.cat([b.detach().flatten() for b in bs]).numpy(), losses


def _fit(base: SpecBase, kind: str, texts: Sequence[str], targets: torch.Tensor, how: str) -> PaveVector:
    cache = base.encode(list(texts))
    vector, losses = fit_vector(base, cache, targets)
    cfg = base.config
    fit = {"targets": how, "examples": len(texts), "classes": int(targets.shape[1]), "steps": cfg.steps, "lr": cfg.lr, "optimizer": cfg.optimizer,
           "max_length": cfg.max_length, "loss_first": round(losses[0], 6), "loss_last": round(losses[-1], 6)}
    return PaveVector(kind, base.identity, vector, fit)


def model_spec(base: SpecBase, predict: Predictor, probe_texts: Sequence[str], *, fit_labels: Sequence[int] | None = None,
               model_base_sha256: str | None = None) -> PaveVector:
    """The PAVE vector of a model fine-tuned from ``base``: fitted on its own predictions over ``probe_texts``.

    Args:
        predict: texts -> (n, C) class probabilities of the model (C <= ``num_outputs``; class c is head output c).
        probe_texts: inputs from the model's task (its training inputs, or a probe set of them).
        fit_labels: fit these labels instead of the predictions (the paper's PAVE-club ablation; not the default).
        model_base_sha256: the weight hash of the base the model was fine-tuned from, when known: refused if it is
            not this base's.

    Raises:
        SpecMismatch: the model comes from another base.
        ValueError: predictions of the wrong shape, not probabilities, or more classes than the head has.
    """
    if model_base_sha256 is not None and model_base_sha256 != base.base_sha256:
        raise SpecMismatch(f"identity.base_sha256: expected {base.base_sha256} (the spec base {base.name}), received "
                           f"{model_base_sha256} (the model's base): vectors from different bases cannot be matched")
    if fit_labels is not None:
        return _fit(base, "model", probe_texts, _one_hot(base, fit_labels, len(probe_texts), None), "labels")
    probs = np.asarray(predict(list(probe_texts)), dtype=np.float64)
    k = base.config.num_outputs
    if probs.ndim != 2 or probs.shape[0] != len(probe_texts) or not 1 <= probs.shape[1] <= k:
        raise ValueError(f"predict: expected ({len(probe_texts)}, C <= num_outputs={k}) probabilities, received "
                         f"shape {probs.shape}")
    if not np.all(np.isfinite(probs)) or probs.min() < 0 or np.abs(probs.sum(1) - 1).max() > 1e-3:
        raise ValueError("predict: expected rows of class probabilities (>= 0, summing to 1), received other values")
    return _fit(base, "model", probe_texts, torch.from_numpy(probs).float(), "predictions")


def _one_hot(base: SpecBase, labels: Sequence[int], n: int, classes: int | None) -> torch.Tensor:
    """(n, C) one-hot labels; C = ``classes`` or the largest label + 1 (at least 2)."""
    k = base.config.num_outputs
    if len(labels) != n:
        raise ValueError(f"labels: expected {n} labels (one per text), received {len(labels)}")
    for i, y in enumerate(labels):
        if isinstance(y, bool) or not isinstance(y, (int, np.integer)) or not 0 <= int(y) < k:
            raise ValueError(f"labels[{i}]: expected an int in 0..{k - 1} (num_outputs={k}), received {y!r}")
    ys = [int(y) for y in labels]
    if classes is not None and not max(ys) < classes <= k:
        raise ValueError(f"classes: expected an int in {max(ys) + 1}..{k} (above every label, at most num_outputs), "
                         f"received {classes}")
    return nn.functional.one_hot(torch.tensor(ys), classes or max(2, max(ys) + 1)).float()


def user_spec(base: SpecBase, texts: Sequence[str], labels: Sequence[int], classes: int | None = None) -> PaveVector:
    """The PAVE vector of a user's task: fitted on their few labelled examples (labels 0..num_outputs-1).

    ``classes`` is the task's class count (default: the largest label + 1), so a few shots that miss a class still
    describe the right task.

    Raises:
        ValueError: no texts, a label count that differs from the text count, or a label out of range.
    """
    if not texts:
        raise ValueError("texts: expected at least one labelled example, received none")
    return _fit(base, "user", texts, _one_hot(base, labels, len(texts), classes), "labels")


def classifier_predictor(model: nn.Module, tokenizer: Any, max_length: int = 32, batch_size: int = 64) -> Predictor:
    """texts -> softmax probabilities of a veil text classifier (``(input_ids, attention_mask) -> logits``)."""

    def predict(texts: list[str]) -> np.ndarray:
        model.eval()
        out = []
        with torch.no_grad():
            for i in range(0, len(texts), batch_size):
                enc = tokenizer(texts[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                                return_tensors="pt")
                out.append(torch.softmax(model(enc["input_ids"], enc["attention_mask"]), -1).numpy())
        return np.concatenate(out)

    return predict
