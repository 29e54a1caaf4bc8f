"""Sequential, memory-bounded calibration: block by block, with streaming float64 statistics on CPU.

Procedure (spec §1.5, docs/compress.md):
1. One forward pass per calibration batch up to the first block captures that block's inputs (hidden states
   and the block's other arguments: masks, rotary embeddings), then stops.
2. Block i: an uncompressed copy (the teacher) and the block being compressed (the student) see the teacher's
   and the student's hidden states. Its targeted Linears are processed in *input groups* in execution order
   (layers reading the same tensor: {q, k, v}, {o}, {gate, up}, {down} in a Llama block), so each group's
   statistics see every upstream layer compressed, inside the block too. The reproduction uses two phases
   ({q, k, v, gate, up} then {o, down}); ours is the finer ordering of the same rule.
3. Per input group (its layers share the input, hence the statistics), summed over real (unmasked) tokens, in
   float64: H = Σ x xᵀ (student inputs), H^f = Σ x_f x_fᵀ (teacher inputs), Δ = Σ (x_f − x) xᵀ. Each block
   pass stops at the group's input. Each factorisation replaces the Linear by a FactorizedLinear.
4. Both hidden-state streams advance through their block; the teacher copy is dropped.
Memory: one block copy, the n×n statistics of one input group, and the block-boundary hidden states of the
calibration set (kept in the model's dtype, on CPU with the model).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..calibration import Calibration
from ..recipe import find_blocks, select_modules
from .config import SAESConfig, SVDConfig, SVDLLMConfig
from .layer import FactorizedLinear, replace_module, weight_params
from .solvers import (
    aces_beta_closed_form,
    aces_beta_exact,
    cealc_target,
    cholesky_ridge,
    plain_svd,
    rank_for_ratio,
    retained_energy,
    svd_llm,
    whitened,
)


class _Stop(Exception):
    """Raised by the capture hook once the first block's inputs are recorded."""


def _hidden_of(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args: tuple, kwargs: dict[str, Any], hidden: torch.Tensor) -> tuple[tuple, dict[str, Any]]:
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _run_block(block: nn.Module, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    out = block(*args, **kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out


@torch.no_grad()
def capture_block_inputs(model: nn.Module, block: nn.Module, calibration: Calibration
                         ) -> list[tuple[tuple, dict[str, Any], torch.Tensor | None]]:
    """Per batch: (args, kwargs) of the first block's call and the (B, T) token mask (None: all real)."""
    captured: list[tuple[tuple, dict[str, Any], torch.Tensor | None]] = []
    mask: list[torch.Tensor | None] = [None]

    def hook(_module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        captured.append((args, dict(kwargs), mask[0]))
        raise _Stop

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for batch in calibration.batches:
            mask[0] = batch.get("attention_mask")
            with contextlib.suppress(_Stop):
                model(**batch)
    finally:
        handle.remove()
    return captured


def _flat(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T, n) layer input -> (N_real, n) float64 rows of the real tokens."""
    rows = x.reshape(-1, x.shape[-1]).double()
    return rows if mask is None else rows[mask.reshape(-1).bool()]


@torch.no_grad()
def input_groups(block: nn.Module, names: list[str], args: tuple, kwargs: dict[str, Any]) -> list[list[str]]:
    """``names`` (relative to ``block``) grouped by the input tensor they read, groups in execution order."""
    seen: dict[tuple, list[str]] = {}
    keep: list[torch.Tensor] = []  # holds the inputs alive so their storage is not reused during the pass
    handles = []
    for name in names:
        def hook(_m: nn.Module, inp: tuple, _name: str = name) -> None:
            x = inp[0]
            keep.append(x)
            seen.setdefault((x.data_ptr(), tuple(x.shape), x.stride()), []).append(_name)
        handles.append(block.get_submodule(name).register_forward_pre_hook(hook))
    try:
        _run_block(block, args, kwargs)
    finally:
        for h in handles:
            h.remove()
    groups = list(seen.values())
    missing = sorted(set(names) - {n for g in groups for n in g})
    if missing:
        raise ValueError(f"targets {missing}: not called by their block's forward; add them to ignore")
    return groups


@torch.no_grad()
def group_statistics(student: nn.Module, teacher: nn.Module, name: str,
                     inputs: list[tuple[tuple, dict[str, Any], torch.Tensor | None]],
                     student_h: list[torch.Tensor], teacher_h: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Streaming H, H^f and Δ (float64, CPU) of the input of layer ``name`` (shared by its whole input group)
    over all calibration batches. Each block pass stops as soon as that input exists."""
    current: dict[str, torch.Tensor] = {}
    handles = []
    for side, block in (("s", student), ("t", teacher)):
        def hook(_m: nn.Module, inp: tuple, _side: str = side) -> None:
            current[_side] = inp[0]
            raise _Stop
        handles.append(block.get_submodule(name).register_forward_pre_hook(hook))
    st: dict[str, torch.Tensor] = {}
    try:
        for (args, kwargs, mask), hs, ht in zip(inputs, student_h, teacher_h, strict=True):
            for block, h in ((student, hs), (teacher, ht)):
                with contextlib.suppress(_Stop):
                    _run_block(block, *_with_hidden(args, kwargs, h))
            x, xf = _flat(current["s"], mask), _flat(current["t"], mask)  # (N, n) each
            if not st:
                st = {k: torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64) for k in ("h", "hf", "delta")}
            st["h"] += x.T @ x
            st["hf"] += xf.T @ xf
            st["delta"] += (xf - x).T @ x
    finally:
        for h in handles:
            h.remove()
    return st


def output_error(w_new: torch.Tensor, w: torch.Tensor, st: dict[str, torch.Tensor]) -> float:
    """||W'X − W X^f||_F / ||W X^f||_F from the statistics: the layer's error against the uncompressed layer
    on uncompressed inputs, the same yardstick for every method."""
    h, hf, delta = st["h"], st["hf"], st["delta"]
    ref = float(torch.einsum("ij,jk,ik->", w, hf, w))
    err = (float(torch.einsum("ij,jk,ik->", w_new, h, w_new)) - 2 * float(torch.einsum("ij,jk,ik->", w_new, h + delta.T, w))
           + ref)
    return (max(err, 0.0) / ref) ** 0.5 if ref > 0 else 0.0


def factorise(method: str, config: SVDConfig, layer: nn.Linear, st: dict[str, torch.Tensor] | None
              ) -> tuple[FactorizedLinear, dict[str, Any]]:
    """One Linear -> (FactorizedLinear, extra log fields) by ``method``."""
    w = layer.weight.detach().double()
    m, n = w.shape
    rank = rank_for_ratio(m, n, config.ratio)
    extra: dict[str, Any] = {"rank": rank}
    if method == "svd":
        a, b = plain_svd(w, rank)
    elif method == "svd_llm":
        assert isinstance(config, SVDLLMConfig) and st is not None
        a, b = svd_llm(w, st["hf"], rank, config.ridge)
    else:
        assert isinstance(config, SAESConfig) and st is not None
        chol, lam = cholesky_ridge(st["h"], config.ridge)
        g0, gd = cealc_target(w, st["h"] + lam * torch.eye(n, dtype=w.dtype), st["delta"], chol)
        lo, hi = config.beta_min, config.beta_max
        if config.beta is not None:
            beta = config.beta
        elif config.aces == "exact":
            beta = aces_beta_exact(g0, gd, rank, lo, hi)
        else:
            beta = aces_beta_closed_form(g0, gd, rank, lo, hi, config.beta_shrink)
        a, b, _ = whitened(w, g0 + beta * gd, chol, rank)
        extra.update(beta=beta, rho=retained_energy(g0 + beta * gd, rank))
        if config.aces_check:
            exact = aces_beta_exact(g0, gd, rank, lo, hi)
            extra.update(beta_exact=exact, rho_exact=retained_energy(g0 + exact * gd, rank))
    bias = None if layer.bias is None else layer.bias.detach()
    new = FactorizedLinear.from_factors(a, b, bias, dtype=layer.weight.dtype).to(layer.weight.device)
    return new, extra


def compress_lowrank(method: str, model: nn.Module, config: SVDConfig, calibration: Calibration | None,
                     log: Callable[..., None]) -> dict[str, Any]:
    """Factorise every targeted Linear of ``model`` in place by ``method`` ('svd', 'svd_llm', 'saes_svd')."""
    start = time.perf_counter()
    prefix, blocks = find_blocks(model)
    names = select_modules(model, config.targets, config.ignore)
    if not config.targets:  # default: the Linears inside the repeated blocks
        names = [n for n in names if n.startswith(prefix + ".")]
    if not names:
        raise ValueError(f"{method}: targets {config.targets} / ignore {config.ignore} select no nn.Linear")
    ranks: dict[str, int] = {}
    betas: dict[str, float] = {}
    before = after = 0

    def apply(full: str, layer: nn.Linear, st: dict[str, torch.Tensor] | None, t0: float) -> None:
        nonlocal before, after
        new, extra = factorise(method, config, layer, st)
        w, w_new = layer.weight.detach().double(), new.dense_weight().detach().double()
        error = output_error(w_new, w, st) if st is not None else float((w - w_new).norm() / w.norm())
        replace_module(model, full, new)
        ranks[full] = new.rank
        if "beta" in extra:
            betas[full] = extra["beta"]
        before, after = before + weight_params(layer), after + weight_params(new)
        log(full, seconds=time.perf_counter() - t0, error=error, params_before=weight_params(layer),
            params_after=weight_params(new), **extra)

    if method == "svd":
        for full in names:
            apply(full, model.get_submodule(full), None, time.perf_counter())
    else:
        if calibration is None:
            raise ValueError(f"{method}: calibration data is required")
        outside = [n for n in names if not n.startswith(prefix + ".")]
        if outside:
            raise ValueError(f"{method}: targets {outside} lie outside the repeated blocks {prefix!r}; only block "
                             f"Linears are calibrated sequentially: add them to ignore (or use method 'svd')")
        _compress_blocks(method, model, prefix, blocks, names, calibration, apply)
    return {"method": method, "ratio": config.ratio, "keep_ratio": 1.0 - config.ratio, "modules": len(ranks),
            "weight_params_before": before, "weight_params_after": after, "ranks": ranks,
            **({"betas": betas} if betas else {}), "seconds": round(time.perf_counter() - start, 3)}


@torch.no_grad()
def _compress_blocks(method: str, model: nn.Module, prefix: str, blocks: nn.ModuleList, names: list[str],
                     calibration: Calibration, apply: Callable[..., None]) -> None:
    """The sequential loop of the module docstring; ``apply(full_name, layer, stats, t0)`` factorises one layer."""
    was_training = model.training
    model.eval()
    inputs = capture_block_inputs(model, blocks[0], calibration)
    teacher_h = [_hidden_of(a, k) for a, k, _ in inputs]
    student_h = [h.clone() for h in teacher_h]
    for i, block in enumerate(blocks):
        local = [n[len(f"{prefix}.{i}."):] for n in names if n.startswith(f"{prefix}.{i}.")]
        teacher = copy.deepcopy(block)
        if local:
            args, kwargs, _ = inputs[0]
            for group in input_groups(block, local, *_with_hidden(args, kwargs, student_h[0])):
                t0 = time.perf_counter()
                stats = group_statistics(block, teacher, group[0], inputs, student_h, teacher_h)
                for name in group:
                    apply(f"{prefix}.{i}.{name}", block.get_submodule(name), stats, t0)
                    t0 = time.perf_counter()
        teacher_h = [_run_block(teacher, *_with_hidden(a, k, h)) for (a, k, _), h in zip(inputs, teacher_h, strict=True)]
        student_h = [_run_block(block, *_with_hidden(a, k, h)) for (a, k, _), h in zip(inputs, student_h, strict=True)]
        del teacher
    model.train(was_training)
