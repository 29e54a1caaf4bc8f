"""``VaptConfig``: VAPT's fields, with the official code's names and defaults (spec §5.2).

Le et al., "Revisit Visual Prompt Tuning: The Expressiveness of Prompt Experts" / "Visual Adaptive Prompt Tuning",
ICLR 2026 (arXiv 2501.18936); official code ``Minhchuyentoancbn/VAPT`` @ ff3e65b, ``src/configs/config.py``.
Spec: shared/specs/adapters.md §5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from veil.config import ConfigError, field

from ..config import AdapterConfig

VIT_BLOCKS = r"(.*\.)?(encoder\.layer|layers)\.\d+"  # transformers ViT blocks (4.x encoder.layer.i, 5.x layers.i)


@dataclass
class VaptConfig(AdapterConfig):
    """VAPT: deep visual prompt tuning whose prompts at block l >= ``vpt_depth`` are functions of the block's input
    patch tokens (prompt experts), ``P = G + s · W2 · ReLU(W1 · G)``, ``G = TokenWise(Conv_k(LN(X)))`` (spec §5.1).

    Args (besides :class:`AdapterConfig`'s; ``target_modules`` names whole transformer blocks, default
    ``transformers``' ViT blocks ``encoder.layer.<i>``; ``r`` is the shared feature projector's bottleneck
    ``HIDDEN_DIM``):
        num_tokens (int): N_p, prompt tokens inserted after the prefix (CLS) token of each adapted block.
        vpt_depth (int): the first ``vpt_depth`` adapted blocks get ordinary static VPT prompts.
        kernel_size (int): k of the channel-wise convolution (one k×k kernel shared by all d channels).
        padding (int): padding of that convolution.
        conv (bool): use the channel-wise convolution (False: the ablation Linear(H·W → N_p) on the tokens).
        conv_dropout (float): ``Dropout2d`` after the convolution.
        feature_projector (bool): apply the shared feature projector (False: the ablation without it).
        projector_residual (bool): official code's ``P = G + s·MLP(G)`` (True) or the paper's ``P = MLP(G)``.
        mlp_dropout (float): dropout after the projector's activation.
        learnable_scale (bool): train s (init 1) instead of fixing s = 1.
        prompt_dropout (float): dropout on the static VPT prompts.
        num_prefix_tokens (int): tokens before the patches (1 = CLS); prompts go right after them.

    Example:
        >>> cfg = VaptConfig(num_tokens=10, modules_to_save=["classifier"])
    """

    method: ClassVar[str] = "vapt"
    peft_type: ClassVar[str] = "VAPT"

    target_modules: list[str] | str | None = field(VIT_BLOCKS, "transformer block names or a regex (default: HF ViT)")
    r: int = field(8, "HIDDEN_DIM: bottleneck r of the shared feature projector")
    num_tokens: int = field(5, "N_p: prompt tokens per adapted block (code default 5, README example 10)")
    vpt_depth: int = field(1, "the first vpt_depth adapted blocks get static VPT prompts")
    kernel_size: int = field(2, "k: size of the channel-wise conv kernel shared by all channels")
    padding: int = field(0, "padding of the channel-wise conv")
    conv: bool = field(True, "use the channel-wise conv (False: ablation, Linear(H*W -> N_p) on the tokens)")
    conv_dropout: float = field(0.1, "Dropout2d probability after the channel-wise conv")
    feature_projector: bool = field(True, "apply the shared feature projector (False: ablation)")
    projector_residual: bool = field(True, "official code P = G + s*MLP(G) (True) or paper P = MLP(G) (False)")
    mlp_dropout: float = field(0.1, "dropout after the feature projector's ReLU")
    learnable_scale: bool = field(False, "train the projector scale s (init 1)")
    prompt_dropout: float = field(0.1, "dropout on the static VPT prompts")
    num_prefix_tokens: int = field(1, "tokens before the patches (CLS); prompts are inserted after them")

    def validate(self) -> None:
        super().validate()
        for name, low in (("r", 1), ("num_tokens", 1), ("vpt_depth", 0), ("kernel_size", 1), ("padding", 0),
                          ("num_prefix_tokens", 0)):
            if getattr(self, name) < low:
                raise ConfigError(f"VaptConfig.{name}: expected >= {low}, received {getattr(self, name)}")
        for name in ("conv_dropout", "mlp_dropout", "prompt_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"VaptConfig.{name}: expected 0 <= p < 1, received {getattr(self, name)}")
        for name in ("rank_pattern", "alpha_pattern"):
            if getattr(self, name):
                raise ConfigError(f"VaptConfig.{name}: expected {{}} (one feature projector is shared by all "
                                  f"blocks), received {getattr(self, name)}")

    def to_peft_dict(self) -> dict[str, Any]:
        """``adapter_config.json``: PEFT has no VAPT, so this is veil's own ``peft_type`` plus every field."""
        return dict(sorted({"peft_type": self.peft_type, **self.to_dict()}.items()))

    @classmethod
    def from_peft_dict(cls, data: dict[str, Any]) -> VaptConfig:
        return cls.from_dict({k: v for k, v in data.items() if k not in ("peft_type", "peft_version")})
