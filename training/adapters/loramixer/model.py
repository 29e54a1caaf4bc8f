"""``LoraMixerModel``: injects :class:`LoraMixerLinear` into the attention projections; RSL (+ L_preserve) as aux loss;
``from_peft_adapters`` routes over frozen PEFT LoRA folders (plug-and-play, spec §3.2 (ii))."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import load_file
from torch import nn

from ..model import PEFT_PREFIX, AdapterModel
from .config import LoraMixerConfig
from .layer import LoraMixerLinear


class LoraMixerModel(AdapterModel):
    """A base model with LoRA-Mixer layers (Li et al., "LoRA-Mixer: Coordinate Modular LoRA Experts Through Serial
    Attention Routing", ICLR 2026, arXiv 2507.00029).

    Joint regime (spec §3.2 (i)): ``set_routing("hard")`` + ``set_domains(ids)`` per batch trains expert d on domain
    d; ``begin_soft_stage()`` switches to soft routing and anchors ``preserve_experts``; ``set_routing("topk")`` for
    sparse inference. ``aux_loss()`` = mean over layers of the RSL + ``L_preserve``.

    Example:
        >>> model = inject(llama, LoraMixerConfig(r=8, num_experts=4, routing="hard"))
        >>> model.set_domains(batch["domain"]); loss = task_loss + model.aux_loss()
        >>> mixer = LoraMixerModel.from_peft_adapters(base, ["lora/math", "lora/code"], LoraMixerConfig(top_k=1))
    """

    config: LoraMixerConfig

    def __init__(self, model: nn.Module, config: LoraMixerConfig) -> None:
        super().__init__(model, config)
        self.anchors: dict[str, torch.Tensor] = {}  # θ_i^(0) of preserve_experts, set by begin_soft_stage

    def create_layer(self, base: nn.Linear, name: str) -> LoraMixerLinear:
        return LoraMixerLinear(base, self.config, self.config.expert_shapes(name))

    def mixer_layers(self) -> list[LoraMixerLinear]:
        return [m for m in self.adapter_layers().values() if isinstance(m, LoraMixerLinear)]

    def set_routing(self, mode: Literal["hard", "soft", "topk"]) -> None:
        """Switch every layer's routing regime (the saved config follows)."""
        self.config = self.config.replace(routing=mode)
        for layer in self.mixer_layers():
            layer.config, layer.routing_mode = self.config, mode
            layer.last_probs = layer.last_dispatch = None

    def set_domains(self, domain_ids: torch.Tensor | Sequence[int]) -> None:
        """The expert of each sample of the next batches (hard routing), shape (B,)."""
        ids = torch.as_tensor(domain_ids, dtype=torch.long)
        if ids.dim() != 1 or ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.config.num_experts:
            raise ValueError(f"set_domains: domain_ids: expected a (B,) tensor of expert ids in "
                             f"0..{self.config.num_experts - 1}, received {ids.tolist()}")
        for layer in self.mixer_layers():
            layer.domain_ids = ids

    def begin_soft_stage(self) -> None:
        """Stage 2 of the joint regime: soft routing, and snapshot θ^(0) of ``preserve_experts`` for L_preserve."""
        self.set_routing("soft")
        self.anchors = {f"{n}.experts.{i}.{k}": p.detach().clone() for n, layer in self.adapter_layers().items()
                        for i in self.config.preserve_experts
                        for k, p in layer.experts[i].named_parameters()}  # type: ignore[union-attr]

    def preserve_loss(self) -> torch.Tensor:
        """``β Σ_{i∈C} ‖θ_i − θ_i^(0)‖²`` over the anchored experts (zero before ``begin_soft_stage``)."""
        if not self.anchors or self.config.preserve_beta == 0.0:
            return torch.zeros(())
        params = dict(self.model.named_parameters())
        return self.config.preserve_beta * sum(((params[k] - v) ** 2).sum() for k, v in self.anchors.items())

    def aux_loss(self) -> torch.Tensor:
        losses = [layer.aux_loss() for layer in self.mixer_layers()]
        rsl_mean = torch.stack(losses).mean() if losses else torch.zeros(())
        return rsl_mean + self.preserve_loss()

    def merge(self) -> None:
        if self.config.fixed_expert is None:
            raise NotImplementedError(
                "LoraMixerModel.merge: LoRA-Mixer is not mergeable while it routes: the weights w(x) depend on the "
                "input, so no single W + ΔW reproduces it (spec §0); set fixed_expert=<e> to merge one expert")
        super().merge()

    @classmethod
    def from_peft_adapters(cls, base_model: nn.Module, paths: Sequence[str | Path],
                           config: LoraMixerConfig | None = None) -> LoraMixerModel:
        """Route over PEFT LoRA folders as frozen experts; only the router trains (plug-and-play, spec §3.2 (ii)).

        Each folder holds ``adapter_config.json`` (``peft_type`` LORA) and ``adapter_model.safetensors`` with
        ``base_model.model.<path>.lora_A.weight`` / ``.lora_B.weight``; expert e gets scale lora_alpha/r of folder e.
        Every folder must adapt the same modules. ``config`` supplies the routing fields; its targets, expert
        count, ranks and alphas are replaced by the folders'.

        Raises:
            ValueError: no folder, a folder that is not plain LoRA, or folders adapting different module sets.
        """
        from ..checkpoint import CONFIG_NAME, WEIGHTS_NAME
        from ..lora import LoraConfig

        if not paths:
            raise ValueError("from_peft_adapters: paths: expected at least one PEFT LoRA folder, received none")
        ranks, alphas, states, modules = [], [], [], None
        for path in map(Path, paths):
            data = json.loads((path / CONFIG_NAME).read_text())
            if data.get("peft_type") != "LORA":
                raise ValueError(f"from_peft_adapters: {path}: peft_type: expected 'LORA', received {data.get('peft_type')!r}")
            lora = LoraConfig.from_peft_dict(data)
            if lora.rank_pattern or lora.alpha_pattern:
                raise ValueError(f"from_peft_adapters: {path}: rank_pattern/alpha_pattern: expected none (one rank "
                                 f"per expert), received {lora.rank_pattern} / {lora.alpha_pattern}")
            state = load_file(str(path / WEIGHTS_NAME))
            found = sorted({k[len(PEFT_PREFIX):].rsplit(".lora_", 1)[0] for k in state if ".lora_" in k})
            if len(found) * 2 != len(state):
                warnings.warn(f"from_peft_adapters: {path}: only lora_A/lora_B tensors become experts; the others "
                              f"(e.g. modules_to_save heads) are not loaded", stacklevel=2)
            if modules is not None and found != modules:
                raise ValueError(f"from_peft_adapters: {path}: expected the modules of {paths[0]} ({modules[:4]}...), "
                                 f"received {found[:4]}...")
            modules = found
            ranks.append(lora.r)
            # rsLoRA scales by alpha / √r: the same expert as alpha·√r over r
            alphas.append(float(lora.lora_alpha) * (math.sqrt(lora.r) if lora.use_rslora else 1.0))
            states.append(state)
        config = (config or LoraMixerConfig()).replace(
            target_modules=modules, num_experts=len(states), expert_r=ranks, expert_alpha=alphas, train_experts=False,
            top_k=min((config or LoraMixerConfig()).top_k, len(states)), rank_pattern={}, alpha_pattern={})
        model = cls(base_model, config)
        with torch.no_grad():
            for name, layer in model.adapter_layers().items():
                for expert, state in zip(layer.experts, states, strict=True):  # type: ignore[union-attr, arg-type]
                    for part in ("lora_A", "lora_B"):
                        getattr(expert, part).weight.copy_(state[f"{PEFT_PREFIX}{name}.{part}.weight"])
        return model


LoraMixer = LoraMixerModel  # the name the issue uses: LoraMixer.from_peft_adapters(base, dirs, config)
