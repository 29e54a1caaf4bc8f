"""A latency plan's layouts chosen op by op and its linear ops packed (:func:`pack_latency`).

The layouts a value may take, the folding of narrow outputs and the broadcast of a matrix's common columns are
described in :mod:`veil.he.layout`; this module walks the lowered program, picks one layout per group of values
that must share slot positions, and materializes every linear op as masked diagonals and block vectors.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp
from veil.he.errors import CompileError
from veil.he.layout import (
    MAX_SLOTS,
    PRODUCTS_PER_ROTATION,
    Layout,
    candidates,
    natural,
    split_background,
)
from veil.he.lowering import entries, sparse
from veil.he.packing import best_split, block_vector, fold_steps, next_pow2, residue

if TYPE_CHECKING:
    from veil.he.plan import Plan


class _Groups:
    """Union-find over value names: values that must share slot positions."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, v: str) -> str:
        self.parent.setdefault(v, v)
        while self.parent[v] != v:
            self.parent[v] = self.parent[self.parent[v]]
            v = self.parent[v]
        return v

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


def pack_latency(builder, in_value: str, replicate: bool = False) -> dict[str, Any]:
    """Layouts, packed ops and tensors of a latency plan (``builder``: the lowering's values, ops, tensors).

    ``replicate``: every ciphertext holds one sample's block repeated over all its slots (the client tiles it), so
    a rotation by d equals one by d + D: each op's diagonals are merged modulo the block size D (a conv over C
    channels at stride W·H in a block of C·W·H slots has (2C - 1)·k² offsets, C·k² modulo D), and block sums are
    cyclic (no broadcast window doubling the block).

    Returns:
        {"ops", "values", "tensors", "period", "window"}: ops with masked diagonals and block vectors,
        values with their positions (and grids), the block size D and the broadcast window E (0: none).
    """
    values, ops = builder.values, builder.ops
    wide = {v for v, info in values.items() if info["features"] > 1}
    groups = _Groups()
    for op in ops:
        linked = [v for v in op["inputs"] + op["outputs"] if v in wide] if op["op"] != "linear" else \
            [v for v in op["outputs"] if v in wide]
        if op["op"] in ("linear", "mul", "add", "add_const"):
            for a, b in itertools.pairwise(linked):
                groups.union(a, b)
    clean = _clean_outputs(ops, wide, builder.producer)
    layouts: dict[str, Layout] = {in_value: natural(tuple(values[in_value]["shape"]))}
    for v, info in values.items():
        if info["features"] == 1:
            layouts[v] = Layout(np.zeros(1, dtype=np.int64), broadcast=True)
    chosen: dict[str, Layout] = {groups.find(in_value): layouts[in_value]} if in_value in wide else {}
    plans: list[dict[str, Any]] = []
    windowed = any(op["op"] == "sumsq" for op in ops) and not replicate
    for index, op in enumerate(ops):
        if op["op"] == "linear":
            plans.append(_plan_linear(index, op, builder, layouts, groups, chosen, clean, windowed))
            continue
        plans.append({})
        for out in op["outputs"]:
            if out in wide:
                source = next((v for v in op["inputs"] if v in wide), None)
                if source is None:
                    raise CompileError(f"node {op['node']!r}: a {op['op']} of one-feature values cannot have "
                                       f"{values[out]['features']} features")
                layouts[out] = layouts[source]
    extent = next_pow2(max(int(x.positions.max()) + 1 for x in layouts.values()))
    broadcasts = any(op["op"] == "sumsq" for op in ops) or any(p.get("broadcast") for p in plans)
    window = extent if broadcasts else 0
    period = 2 * extent if broadcasts and not replicate else extent
    if period > MAX_SLOTS >= extent:  # one block fills the largest ring: block sums wrap (packing.sum_steps)
        period = extent
    if replicate:  # offsets equal modulo the period may be one diagonal: each op takes its cheapest representation
        for op, plan in zip(ops, plans, strict=True):
            if op["op"] == "linear":
                _wrap_offsets(op, plan, [layouts[v] for v in op["inputs"]], values, period)
    return _materialize(builder, ops, plans, layouts, period, window)


def _wrap_offsets(op: dict[str, Any], plan: dict[str, Any], inputs: list[Layout], values, period: int) -> None:
    """A replicated op's offsets as they are, modulo the period in [0, D) or centred in [-D/2, D/2) (all equal
    rotations on a tiled ciphertext): the one with the fewest rotations plus products / PRODUCTS_PER_ROTATION
    (merging shrinks the products, but a split over the merged offsets can take more rotations), its split kept."""
    best = None
    for wrap in (0, period, -period):
        rotations, modulus, signed = _cost(plan["layout"], inputs, plan["terms"], op, values, plan["folds"], wrap)
        total = rotations + _products(plan["layout"], inputs, plan["terms"], op, values, plan["folds"],
                                      wrap) / PRODUCTS_PER_ROTATION
        if best is None or total < best[0]:
            best = (total, wrap, modulus, signed)
    _, plan["wrap"], plan["modulus"], plan["signed"] = best


def _clean_outputs(ops: list[dict[str, Any]], wide: set[str], producer: dict[str, Any]) -> set[str]:
    """Linear outputs that must be exactly zero outside their positions: every value a sum of squares reads."""
    need, stack = set(), [op["inputs"][0] for op in ops if op["op"] == "sumsq"]
    while stack:
        v = stack.pop()
        if v in need or v not in producer:
            continue
        need.add(v)
        op = producer[v]
        if op["op"] == "add" and any(x not in wide for x in op["inputs"]):
            raise CompileError(f"node {op['node']!r}: a sum of squares reads a value plus a one-feature value")
        if op["op"] in ("mul", "add", "add_const"):
            stack.extend(x for x in op["inputs"] if x in wide)
    return need


def _plan_linear(index: int, op: dict[str, Any], builder, layouts: dict[str, Layout], groups: _Groups,
                 chosen: dict[str, Layout], clean: set[str], windowed: bool) -> dict[str, Any]:
    """Sparse terms of every (output, input) pair and the output layout with the fewest rotations."""
    values, tensors = builder.values, builder.tensors
    inputs = [layouts[v] for v in op["inputs"]]
    terms: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = []
    broadcast: list[list[np.ndarray | None]] = []
    for out, row in zip(op["outputs"], op["weights"], strict=True):
        one = values[out]["features"] == 1
        terms.append([])
        broadcast.append([])
        for name in row:
            matrix = tensors[name]
            if one:
                rest, w = sp.csr_array(matrix.shape), sparse(matrix).toarray()[0]
            else:  # a broadcast input is read in place: its column never needs a block sum
                rest, w = split_background(matrix, out not in clean and not inputs[len(terms[-1])].broadcast)
            terms[-1].append(entries(rest))
            broadcast[-1].append(w if w is not None and np.any(w) else None)
    main = next((v for v in op["outputs"] if values[v]["features"] > 1), None)
    layout = None
    if main is not None:
        layout = chosen.get(groups.find(main))
        if layout is None:
            options = candidates(tuple(values[main]["shape"]), inputs)
            extent = max(int(x.positions.max()) + 1 for x in layouts.values())
            # a block the largest ring cannot hold twice (a sum of squares' broadcast window) is taken only when
            # nothing else fits (its block sums then wrap around the whole ring), one it cannot hold at all last
            fits = [o for o in options if _block(o, extent) * (2 if windowed else 1) <= MAX_SLOTS]
            options = fits or [o for o in options if _block(o, extent) <= MAX_SLOTS] or options
            costs = [_cost(option, inputs, terms, op, values)[0] * _block(option, extent) for option in options]
            layout = options[int(np.argmin(costs))]
            chosen[groups.find(main)] = layout
        for v in op["outputs"]:
            if values[v]["features"] > 1:
                if values[v]["features"] != len(layout.positions):
                    raise ValueError(f"op {index} at node {op['node']!r}: outputs of different sizes")
                layouts[v] = layout
    folds = _choose_folds(layout, inputs, terms, op, values, clean)
    _, modulus, signed = _cost(layout, inputs, terms, op, values, folds)
    return {"terms": terms, "broadcast": any(w is not None for row in broadcast for w in row),
            "weights": broadcast, "modulus": modulus, "signed": signed, "layout": layout, "folds": folds}


def _choose_folds(layout: Layout | None, inputs: list[Layout], terms, op: dict[str, Any], values,
                  clean: set[str]) -> list[tuple[int, int] | None]:
    """Fold (stride S, count K) every eligible output when that costs less (rotations plus products / 20)."""
    plain: list[tuple[int, int] | None] = [None] * len(op["outputs"])
    if layout is None or layout.broadcast:
        return plain
    stride = next_pow2(int(layout.positions.max()) + 1)
    reach = next_pow2(max(int(x.positions.max()) + 1 for x in inputs if not x.broadcast) if
                      any(not x.broadcast for x in inputs) else 1)
    count = reach // stride
    eligible = [values[v]["features"] > 1 and v not in clean for v in op["outputs"]]
    if count < 2 or not any(eligible):
        return plain
    folded = [(stride, count) if ok else None for ok in eligible]

    def total(folds) -> float:
        rotations = _cost(layout, inputs, terms, op, values, folds)[0]
        return rotations + _products(layout, inputs, terms, op, values, folds) / PRODUCTS_PER_ROTATION

    return folded if total(folded) < total(plain) else plain


def fold_rows(rows: np.ndarray, sources: np.ndarray, fold: tuple[int, int] | None) -> np.ndarray:
    """Where each entry's product accumulates: its output slot, or (folded) that slot plus k S, the k that
    keeps the offset ``source - row`` in [0, S) where it can (0 .. K - 1)."""
    if fold is None:
        return rows
    stride, count = fold
    return rows + stride * np.clip((sources - rows) // stride, 0, count - 1)


def _products(layout: Layout, inputs: list[Layout], terms, op: dict[str, Any], values, folds, wrap: int = 0) -> int:
    """Masked diagonals (one plaintext product each) of the op with ``folds`` (``wrap`` as :func:`_offsets`)."""
    count = 0
    for out, row, fold in zip(op["outputs"], terms, folds, strict=True):
        for i, (r, c, _) in enumerate(row):
            if len(r):
                rows = layout.positions[r] if values[out]["features"] > 1 else np.zeros(len(r), dtype=np.int64)
                src = _sources(inputs[i], c, rows)
                count += len(np.unique(_offsets(src, fold_rows(rows, src, fold), wrap)))
    return count


def _block(layout: Layout, extent: int) -> int:
    """The block size a plan would need with ``layout`` beside values reaching ``extent``: rotations cost per image
    what they cost per ciphertext times the block (fewer images fit a ciphertext when the block grows)."""
    return next_pow2(max(extent, int(layout.positions.max()) + 1))


def _cost(layout: Layout | None, inputs: list[Layout], terms, op: dict[str, Any], values,
          folds: list[tuple[int, int] | None] | None = None, wrap: int = 0) -> tuple[int, int, bool]:
    """(rotations, modulus, signed) of the op's cheapest baby-step / giant-step split, fold rotations included
    (``wrap`` as :func:`_offsets`)."""
    folds = folds or [None] * len(op["outputs"])
    per_input: list[list[np.ndarray]] = [[] for _ in inputs]
    per_output: list[np.ndarray] = []
    for out, row, fold in zip(op["outputs"], terms, folds, strict=True):
        deltas = []
        for i, (r, c, _) in enumerate(row):
            if not len(r):
                continue
            rows = layout.positions[r] if values[out]["features"] > 1 else np.zeros(len(r), dtype=np.int64)
            src = _sources(inputs[i], c, rows)
            d = np.unique(_offsets(src, fold_rows(rows, src, fold), wrap))
            per_input[i].append(d)
            deltas.append(d)
        per_output.append(np.unique(np.concatenate(deltas)) if deltas else np.zeros(0, dtype=np.int64))
    strides = {g.channel_stride for g in [x.grid for x in inputs] + [layout.grid if layout else None] if g}
    strides |= {g.gap * g.row for g in [x.grid for x in inputs] if g}
    flat = [np.unique(np.concatenate(d)) if d else np.zeros(0, dtype=np.int64) for d in per_input]
    rotations, modulus, signed = best_split(flat, per_output, strides)
    return rotations + sum(len(fold_steps(f)) for f in folds), modulus, signed


def _offsets(sources: np.ndarray, rows: np.ndarray, wrap: int = 0) -> np.ndarray:
    """The rotation each product needs, ``source - row``: as it is (``wrap`` 0), or on a replicated ciphertext of
    period D modulo D, in [0, D) (``wrap`` = D) or centred in [-D/2, D/2) (``wrap`` = -D)."""
    deltas = sources - rows
    if wrap > 0:
        return np.mod(deltas, wrap)
    return np.mod(deltas - wrap // 2, -wrap) + wrap // 2 if wrap < 0 else deltas


def _sources(layout: Layout, columns: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The slots an op reads its input's features from: their positions; a broadcast value is read in place."""
    return rows if layout.broadcast else layout.positions[columns]


def _materialize(builder, ops: list[dict[str, Any]], plans: list[dict[str, Any]], layouts: dict[str, Layout],
                 period: int, window: int) -> dict[str, Any]:
    """The packed ops with their tensors: masks (n, D) per (output, input), block biases and constants."""
    tensors: dict[str, np.ndarray] = {}

    def tensor(array: np.ndarray) -> str:
        name = f"t{len(tensors)}"
        tensors[name] = np.asarray(array, dtype=np.float64)
        return name

    def place(vector: np.ndarray, value: str) -> np.ndarray:
        layout = layouts[value]
        if layout.broadcast:
            return np.asarray(vector, dtype=np.float64).reshape(1)
        return block_vector(vector, layout.positions, period)

    packed = []
    for op, plan in zip(ops, plans, strict=True):
        record = {k: v for k, v in op.items() if k not in ("weights", "biases", "const")}
        if op["op"] == "add_const":
            record["const"] = tensor(place(builder.tensors[op["const"]], op["inputs"][0]))
        elif op["op"] == "sumsq":
            record["window"] = window
        elif op["op"] == "linear":
            record.update(_pack_linear(op, plan, layouts, period, tensor, place, builder), window=window)
        packed.append(record)
    out_values = {}
    for v, info in builder.values.items():
        layout = layouts.get(v)
        entry = dict(info)
        if layout is not None and not layout.broadcast:
            entry["positions"] = layout.positions.tolist()
            if layout.grid is not None:
                entry["grid"] = layout.grid.to_dict()
        out_values[v] = entry
    return {"ops": packed, "values": out_values, "tensors": tensors, "period": period, "window": window}


def _pack_linear(op, plan, layouts, period, tensor, place, builder) -> dict[str, Any]:
    inputs = [layouts[v] for v in op["inputs"]]
    modulus, signed = plan["modulus"], plan["signed"]
    diagonals, broadcast, babies, giants = [], [], [set() for _ in inputs], []
    for out, row, weights, fold in zip(op["outputs"], plan["terms"], plan["weights"], plan["folds"], strict=True):
        out_positions = layouts[out].positions if not layouts[out].broadcast else None
        diagonals.append([])
        giants.append(set())
        for i, (r, c, vals) in enumerate(row):
            if not len(r):
                diagonals[-1].append(None)
                continue
            rows = out_positions[r] if out_positions is not None else np.zeros(len(r), dtype=np.int64)
            src = _sources(inputs[i], c, rows)
            rows = fold_rows(rows, src, fold)
            offsets, inverse = np.unique(_offsets(src, rows, plan.get("wrap", 0)), return_inverse=True)
            masks = np.zeros((len(offsets), period))
            np.add.at(masks, (inverse, rows), vals)
            diagonals[-1].append({"offsets": offsets.tolist(), "masks": tensor(masks)})
            b = residue(offsets, modulus, signed)
            babies[i].update(int(s) for s in np.unique(b) if s)
            giants[-1].update(int(s) for s in np.unique(offsets - b) if s)
        broadcast.append([None if w is None else tensor(block_vector(w, inputs[i].positions, period))
                          for i, w in enumerate(weights)])
        broadcast[-1] = broadcast[-1] if any(t is not None for t in broadcast[-1]) else None
        diagonals[-1] = diagonals[-1] if any(d is not None for d in diagonals[-1]) else None
        if diagonals[-1] is None and broadcast[-1] is None:
            raise ValueError(f"node {op['node']!r}: output {out} has no weights")
    return {"diagonals": diagonals, "broadcast": broadcast, "split": {"modulus": modulus, "signed": signed},
            "folds": [list(f) if f else None for f in plan["folds"]],
            "baby_steps": [sorted(b) for b in babies], "giant_steps": [sorted(g) for g in giants],
            "biases": [tensor(place(builder.tensors[b], out)) for b, out in zip(op["biases"], op["outputs"],
                                                                                 strict=True)]}


def replicated_segments(plans: list[Plan], replicate: bool | None) -> list[bool]:
    """Which of a cutting's (latency) segments to compile replicated: all (True), none (False or a throughput plan),
    or (None) each whose block leaves slots free, when the smallest batch capacity is 1 anyway. A request then
    holds one image, and a replicated segment computes it at fewer diagonals: a plan that batches is left alone.
    ``plans`` may be skeletons (spec only)."""
    if replicate is not None or not plans or plans[0].mode != "latency":
        return [bool(replicate) and p.mode == "latency" for p in plans]
    if min(int(p.spec["batch_capacity"]) for p in plans) > 1:
        return [False] * len(plans)
    return [p.replicated or replicated_period(p) < p.slots for p in plans]


def replicated_period(plan: Plan) -> int:
    """The block a latency plan would have replicated: its values' extent, which an unreplicated plan doubles for a
    broadcast window (``window`` = the extent there) and a replicated one does not (block sums are cyclic)."""
    return int(plan.spec.get("window") or plan.spec["period"])
