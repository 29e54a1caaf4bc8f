"""``E2LoraConfig``: E²LoRA's fields — LoRA's, the options that pin the paper's ambiguities, and the sharing plan.

The plan (``share_intervals``) is computed once before training by :func:`~.plan.plan_sharing` and stored in the
config, so a saved checkpoint rebuilds the same shapes without a gradient probe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from veil.config import ConfigError, field

from ..config import AdapterConfig


@dataclass
class E2LoraConfig(AdapterConfig):
    """E²LoRA (Li, Ye, Ye, He, Chen, "Efficient and Effective LoRA with Entropy-Guided Adaptive Sharing", ICLR 2026;
    spec ``adapters.md`` §2): adjacent layers share one LoRA per target type, ranks follow gradient proxy entropy.

    Args (besides :class:`AdapterConfig`'s; ``r`` is the paper's ``r_vanilla``):
        lora_alpha (float): scaling numerator; an interval of rank ``r_k`` is scaled by ``lora_alpha / r_k``.
        lora_dropout (float): dropout on the input of A (training only).
        layer_pattern (str): regex whose first group is the layer index in a module name.
        gradient_scope (str): ``"layer"``: G_l concatenates the gradients of all targeted weights of layer l and one
            partition serves every target type; ``"module"``: one partition per target type (the note does not say).
        threshold_rule (str): whose τ a candidate's RMI with the interval's start layer must meet: ``"start"`` or
            ``"candidate"`` (not stated in the note).
        rank_budget (str): total rank ``K · r`` (``"intervals"``, K = number of intervals; the paper's ablation
            parameter counts imply it) or ``N · r`` (``"layers"``, the note's literal wording).
        allocation_weight (str): ``"abs"``: F_k ∝ |H_k|; ``"entropy_power"``: F_k ∝ exp(H_k) ∝ σ_k (always
            positive and increasing in H, unlike |H| when H < 0).
        grad_scale (float): gradients are multiplied by this before H (H shifts by log grad_scale, RMI changes).
        share_intervals (dict[str, list[list[int]]]): the plan: module template (layer index as ``{}``) ->
            ``[first_layer, last_layer, rank]`` per interval. Empty until :func:`plan_sharing` fills it.

    Example:
        >>> cfg = plan_sharing(base, E2LoraConfig(r=8, target_modules=["query", "value"]), loss_fn)
        >>> model = inject(base, cfg)
    """

    method: ClassVar[str] = "e2lora"
    peft_type: ClassVar[str] = "E2LORA"

    lora_alpha: float = field(16.0, "scaling numerator: an interval of rank r_k is scaled by lora_alpha / r_k")
    lora_dropout: float = field(0.0, "dropout probability on the input of A")
    layer_pattern: str = field(r"\.(\d+)\.", "regex whose first group is the layer index of a module name")
    gradient_scope: Literal["layer", "module"] = field("layer", "G_l over all targets of layer l, or per target type")
    threshold_rule: Literal["start", "candidate"] = field("start", "whose tau the RMI with the start layer must meet")
    rank_budget: Literal["intervals", "layers"] = field("intervals", "total rank K*r (intervals) or N*r (layers)")
    allocation_weight: Literal["abs", "entropy_power"] = field("abs", "F_k from |H_k| or from exp(H_k)")
    grad_scale: float = field(1.0, "gradient multiplier before the proxy entropy")
    share_intervals: dict[str, list[list[int]]] = field({}, "template -> [[first, last, rank], ...] (plan_sharing)")

    def validate(self) -> None:
        super().validate()
        name = type(self).__name__
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"{name}.lora_dropout: expected 0 <= p < 1, received {self.lora_dropout}")
        if self.grad_scale <= 0:
            raise ConfigError(f"{name}.grad_scale: expected > 0, received {self.grad_scale}")
        try:
            groups = re.compile(self.layer_pattern).groups
        except re.error as exc:
            raise ConfigError(f"{name}.layer_pattern: expected a valid regex, received {self.layer_pattern!r} "
                              f"({exc})") from None
        if groups < 1:
            raise ConfigError(f"{name}.layer_pattern: expected a regex with a group, received {self.layer_pattern!r}")
        for template, intervals in self.share_intervals.items():
            if not all(isinstance(iv, list) and len(iv) == 3 and iv[0] <= iv[1] and iv[2] >= 1 for iv in intervals):
                raise ConfigError(f"{name}.share_intervals[{template!r}]: expected [[first, last, rank>=1], ...] "
                                  f"with first <= last, received {intervals!r}")

    def split_name(self, module_name: str) -> tuple[str, int]:
        """(template, layer index): ``a.layer.3.q`` -> (``a.layer.{}.q``, 3) with the default ``layer_pattern``."""
        m = re.search(self.layer_pattern, module_name)
        if m is None:
            raise ValueError(f"{type(self).__name__}.layer_pattern: expected a match in module name "
                             f"{module_name!r}, received none for {self.layer_pattern!r}")
        return module_name[:m.start(1)] + "{}" + module_name[m.end(1):], int(m.group(1))

    def interval_of(self, module_name: str) -> tuple[int, int, int]:
        """``(first_layer, last_layer, rank)`` of the interval holding ``module_name``.

        Raises:
            ValueError: the plan is empty (call ``plan_sharing`` first) or does not cover the module.
        """
        if not self.share_intervals:
            raise ValueError("E2LoraConfig.share_intervals: expected a sharing plan, received {}; "
                             "call veil.training.adapters.e2lora.plan_sharing(model, config, loss_fn) before inject")
        template, layer = self.split_name(module_name)
        for first, last, rank in self.share_intervals.get(template, []):
            if first <= layer <= last:
                return first, last, rank
        raise ValueError(f"E2LoraConfig.share_intervals: expected an interval covering layer {layer} of "
                         f"{template!r}, received {self.share_intervals.get(template)!r}")

    def to_peft_dict(self) -> dict[str, Any]:
        """``adapter_config.json`` of the native (shared) checkpoint; PEFT has no E²LoRA, see ``save_as_lora``."""
        target = self.target_modules if isinstance(self.target_modules, str) else sorted(self.target_modules or [])
        return dict(sorted({**self.to_dict(), "target_modules": target, "peft_type": self.peft_type}.items()))

    @classmethod
    def from_peft_dict(cls, data: dict[str, Any]) -> E2LoraConfig:
        return cls.from_dict({k: v for k, v in data.items() if k not in {"peft_type", "peft_version"}})
