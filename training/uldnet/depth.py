"""Multiplicative-depth accounting: the CKKS levels each operator of a model consumes, and the total.

The model is traced with torch.fx (veil's layers kept whole) and every node gets
``level_out = max(level_in) + cost``; the total is the level at the output, so residual branches cost
their longer side. Costs follow the level accounting of ../shared/specs/he.md §1.7: every plaintext
multiplication counts a level (TenSEAL rescales after each), and scalars are folded into neighbouring
plaintext products where the spec shows how:

    Linear / Conv                 1 level  (plaintext weights)
    AvgPool / GAP / token mean    1 level  (a sum of rotations times the plaintext 1/k)
    PolyNorm                      3 levels (x^2 of the pre-scaled centred input, (sqrt(a) mu v - sqrt(a) b)^2,
                                            the product with x - E[x]; centring and scalars folded)
    PolyAct, degree n             n - 1 levels (the leading coefficient folds into the producer of x,
                                  as veil.he.compile does: y (q2 y + q1) + q0; n - 1 ct x ct products)
    LinearAttention               3 levels (RoPE plaintext cos/sin, K^T V, Q (K^T V)); qkv/proj are Linear
    add / sub / reshape           0

A non-polynomial operator (ReLU, LayerNorm, softmax, MaxPool, a PolyNorm still in warm-up) makes the
model non-evaluable under CKKS: it is listed with ``levels=None`` and the total is None.

Per block (``DepthReport.per_block()``): the levels between a residual or transformer block's input and
its output (a ResNet block at degree 2: conv 1 + PolyNorm 3 + PolyAct 1, twice = 10), which is what a
bootstrapping or refresh schedule cuts at.
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field

import torch
from torch import fx, nn

from .attention import LinearAttention, SoftmaxAttention
from .polyact import PolyAct
from .polynorm import PolyNorm

# Modules fx must keep whole: veil's own layers and the standard-op ones they are compared with.
LEAF_MODULES: tuple[type[nn.Module], ...] = (PolyNorm, PolyAct, LinearAttention, SoftmaxAttention)
FREE_FUNCTIONS = {getattr, operator.add, operator.sub, operator.neg, operator.getitem, torch.add, torch.flatten, torch.cat}
FREE_METHODS = {"add", "sub", "flatten", "reshape", "view", "transpose", "permute", "contiguous", "size", "unsqueeze", "squeeze"}
POOLING_METHODS = {"mean", "sum"}
NON_POLYNOMIAL = (nn.ReLU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Softmax, nn.LayerNorm, nn.BatchNorm1d,
                  nn.BatchNorm2d, nn.GroupNorm, nn.MaxPool2d, nn.AdaptiveMaxPool2d, SoftmaxAttention)


@dataclass
class OpDepth:
    """One operator: its levels (None when not polynomial) and its ciphertext-ciphertext depth."""

    name: str
    op: str
    levels: int | None
    ct_depth: int | None
    level_out: int | None


@dataclass
class DepthReport:
    """Per-operator and total multiplicative depth of a model."""

    ops: list[OpDepth] = field(default_factory=list)
    total: int | None = 0
    block_prefixes: list[str] = field(default_factory=list)  # qualified names of the residual / transformer blocks

    @property
    def polynomial(self) -> bool:
        return self.total is not None

    @property
    def max_op_levels(self) -> int | None:
        levels = [o.levels for o in self.ops]
        return None if any(v is None for v in levels) else max(levels, default=0)

    def non_polynomial(self) -> list[str]:
        return [f"{o.name} ({o.op})" for o in self.ops if o.levels is None]

    def per_block(self) -> list[dict]:
        """Levels each block consumes: ``{"block", "level_in", "level_out", "levels"}`` in model order (None
        levels where a block holds a non-polynomial operator)."""
        rows = []
        for prefix in self.block_prefixes:
            ops = [o for o in self.ops if o.name.startswith(prefix + ".")]
            if not ops:
                continue
            if any(o.levels is None or o.level_out is None for o in ops):
                rows.append({"block": prefix, "level_in": None, "level_out": None, "levels": None})
                continue
            level_in = min(o.level_out - o.levels for o in ops)
            level_out = max(o.level_out for o in ops)
            rows.append({"block": prefix, "level_in": level_in, "level_out": level_out, "levels": level_out - level_in})
        return rows

    def to_dict(self) -> dict:
        return {"total": self.total, "max_op_levels": self.max_op_levels, "ops": [asdict(o) for o in self.ops]}

    def table(self) -> str:
        rows = [f"{'operator':<28} {'op':<18} {'levels':>6} {'ct-ct':>5} {'level out':>9}"]
        for o in self.ops:
            fmt = lambda v: "-" if v is None else str(v)  # noqa: E731
            rows.append(f"{o.name:<28} {o.op:<18} {fmt(o.levels):>6} {fmt(o.ct_depth):>5} {fmt(o.level_out):>9}")
        rows.append(f"total depth: {'not polynomial: ' + ', '.join(self.non_polynomial()) if self.total is None else self.total}")
        return "\n".join(rows)


def module_cost(module: nn.Module) -> tuple[int | None, int | None]:
    """(levels, ct-ct depth) of one leaf module; (None, None) when it is not polynomial."""
    if isinstance(module, PolyNorm):
        return (None, None) if module.exact else (3, 3)
    if isinstance(module, PolyAct):
        n = module.config.degree
        return max(n - 1, 0), max(n - 1, 0)
    if isinstance(module, LinearAttention):
        return 3, 2
    if isinstance(module, NON_POLYNOMIAL):
        return None, None
    if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)):
        return 1, 0
    if isinstance(module, (nn.Identity, nn.Flatten, nn.Dropout)):
        return 0, 0
    raise TypeError(f"multiplicative_depth: no cost known for module type {type(module).__name__}; "
                    "add it to veil.training.uldnet.depth.module_cost")


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, LEAF_MODULES) or super().is_leaf_module(m, qualname)


def multiplicative_depth(model: nn.Module) -> DepthReport:
    """Per-operator and total CKKS levels of ``model`` (see the module docstring for the cost model)."""
    from .models import PreActBlock, ResidualBlock, TransformerBlock  # models never imports depth: no cycle

    graph = _Tracer().trace(model)
    modules = dict(model.named_modules())
    report = DepthReport(block_prefixes=[n for n, m in modules.items() if isinstance(m, (PreActBlock, ResidualBlock, TransformerBlock))])
    level: dict[fx.Node, int | None] = {}
    for node in graph.nodes:
        inputs = [level[a] for a in node.all_input_nodes]
        level_in = None if any(v is None for v in inputs) else max(inputs, default=0)
        if node.op in ("placeholder", "get_attr"):
            level[node] = 0
            continue
        if node.op == "output":
            report.total = level_in
            continue
        if node.op == "call_module":
            cost, ct = module_cost(modules[node.target])
            op = type(modules[node.target]).__name__
            name = str(node.target)
        elif (node.op == "call_function" and node.target in FREE_FUNCTIONS) or (node.op == "call_method" and node.target in FREE_METHODS):
            cost, ct, op, name = 0, 0, "", ""
        elif node.op == "call_method" and node.target in POOLING_METHODS:
            cost, ct, op, name = 1, 0, f"{node.target} (pool)", node.name
        else:
            raise TypeError(f"multiplicative_depth: no cost known for {node.op} {node.target} (node {node.name})")
        out = None if cost is None or level_in is None else level_in + cost
        level[node] = out
        structural = node.op == "call_module" and isinstance(modules[node.target], (nn.Identity, nn.Flatten, nn.Dropout))
        if op and not structural and (cost or cost is None or node.op == "call_module"):
            report.ops.append(OpDepth(name, op, cost, ct, out))
    return report
