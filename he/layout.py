"""Latency layouts: the slot positions of every value of a plan, chosen op by op, and the packed linear ops.

The input sits in natural NCHW order (slot ``c H W + i W + j`` of its block). A linear op's output layout is
chosen among a few candidates by the rotations it costs (:func:`veil.he.packing.best_split`):

- *in place* on the input's spatial grid: output (co, i, j) at ``co S + g s (i W0 + j)`` for a stride s
  (1, 2, 3, ...; a strided convolution or a pooling), so the gap g of he.md §7.2 is multiplied by s and the
  next layer's taps rotate by ``g s (di W0 + dj)``; a global pooling (s = H) leaves channel co at ``co S``;
- *multiplexed* in place (Lee et al. 2022, multiplexed parallel convolutions): the same grid with gap G = g s,
  but channel co on its own sub-lattice ``base_co + G (i W0 + j)``, ``base_co = q S + u W0 + v`` with
  (u, v) in [0, G)^2 the lattice's offset and q the channel-stride block: the G^2 - 1 slots a stride leaves
  empty around each output hold other channels, so a stride-2 conv that doubles the channels keeps the block
  (and needs no repack: its offsets do not depend on (i, j), unlike a compact output's);
- *compact* ``0 .. F - 1`` (a dense layer; for a (C, H, W) output a new dense base grid, which repacks a
  strided layer's output inside its own masks at no extra cost);
- *channel-strided* ``r S`` (a dense head over a channel-multiplexed input: offsets (c - r) S + pixel).

Elementwise ops keep their input's layout; operands of a product or a sum share one (a union-find over
values, so the first linear op of a group chooses for all). Flatten costs nothing: the head's masks read the
positions the layout left the features in.

A narrow output of a wide input (a dense head: 10 logits from 384 features) may be *folded* (Gazelle's hybrid
method): output r accumulates its partial sums at ``p_r + k S`` (S a power of two past every output position,
k chosen per entry so that the offset stays below S), and log2 K rotations by S, 2S, ... add them back to
``p_r``: ~S masked diagonals instead of one per input position. The slots outside the positions then hold
leftovers, so a value a sum of squares reads is never folded.

A matrix whose columns are mostly one value (a PolyNorm centring ``A - 1 E[A]``, dense by construction) is
split into its sparse part and a *broadcast* ``1 w^T``: the block sum of ``w (.) x`` (no level), which leaves
non-zero leftovers outside the output's positions. Values a sum of squares reads must be *clean* (exactly
zero outside their positions), so their producers keep the plain masked diagonals; see the lowering's
latency PolyNorm, which squares the uncentred values for that reason.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import numpy as np
import scipy.sparse as sp
from veil.he.lowering import Matrix, entries, identity, sparse
from veil.he.packing import best_split, block_vector, fold_steps, next_pow2, residue
from veil.he.params import POLY_MODULUS_DEGREES

MAX_SLOTS = POLY_MODULUS_DEGREES[-1] // 2  # the largest 128-bit ring's slots: a layout's block must fit them
BACKGROUND = 0.5  # a column's most common value is broadcast when it fills at least this share of its rows
PRODUCTS_PER_ROTATION = 20  # a plaintext product costs about 1/20 of a rotation (he.md §7: 0.4 vs 7.8 ms)


@dataclasses.dataclass(frozen=True)
class Grid:
    """A (C, H, W) value on the input's base grid: channel stride S, gap g, base row length W0 and rows H0."""

    channels: int
    height: int
    width: int
    channel_stride: int
    gap: int
    row: int
    rows: int
    bases: tuple[int, ...] | None = None  # multiplexed: channel c's first slot (else c S)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.bases is None:
            del out["bases"]
        else:
            out["bases"] = list(self.bases)
        return out

    def channel_bases(self) -> np.ndarray:
        """Each channel's first slot: ``bases`` when multiplexed, else ``c S``."""
        if self.bases is not None:
            return np.asarray(self.bases, dtype=np.int64)
        return np.arange(self.channels, dtype=np.int64) * self.channel_stride


@dataclasses.dataclass
class Layout:
    """Slot positions (F,) inside the block; a grid when spatial; ``broadcast`` for one-feature values."""

    positions: np.ndarray
    grid: Grid | None = None
    broadcast: bool = False


def natural(shape: tuple[int, ...]) -> Layout:
    """The input layout: C-order positions, on a grid when the shape is (C, H, W)."""
    positions = np.arange(math.prod(shape), dtype=np.int64)
    if len(shape) == 3:
        c, h, w = shape
        return Layout(positions, Grid(c, h, w, h * w, 1, w, h))
    return Layout(positions)


def in_place(grid: Grid, shape: tuple[int, ...], stride: int, multiplex: bool = False) -> Layout | None:
    """Outputs (co, i, j) at ``base_co + g stride (i W0 + j)``, or None when they leave the base grid.

    ``base_co`` is ``co S``, or with ``multiplex`` the co-th sub-lattice offset :func:`multiplexed_bases` gives.
    """
    channels, height, width = shape
    gap = grid.gap * stride
    if gap * (height - 1) >= grid.rows or gap * (width - 1) >= grid.row:
        return None
    bases = multiplexed_bases(grid, (channels, height, width), gap) if multiplex else None
    layout_grid = Grid(channels, height, width, grid.channel_stride, gap, grid.row, grid.rows, bases)
    i, j = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    positions = layout_grid.channel_bases()[:, None] + (gap * (i * grid.row + j)).reshape(1, -1)
    return Layout(positions.reshape(-1).astype(np.int64), layout_grid)


def multiplexed_bases(grid: Grid, shape: tuple[int, int, int], gap: int) -> tuple[int, ...] | None:
    """The first slots of ``shape[0]`` disjoint sub-lattices of gap ``gap`` on ``grid``'s base grid, in the order
    (channel-stride block q, row offset u, column offset v), or None when one lattice per block is all there is."""
    channels, height, width = shape
    rows = [u for u in range(gap) if u + gap * (height - 1) < grid.rows]
    cols = [v for v in range(gap) if v + gap * (width - 1) < grid.row]
    cell = [u * grid.row + v for u in rows for v in cols]
    if len(cell) < 2:
        return None
    return tuple((c // len(cell)) * grid.channel_stride + cell[c % len(cell)] for c in range(channels))


def candidates(shape: tuple[int, ...], inputs: list[Layout]) -> list[Layout]:
    """In-place (on each input grid, by stride), compact and channel-strided layouts for ``shape``."""
    features = math.prod(shape)
    grids = list(dict.fromkeys(x.grid for x in inputs if x.grid is not None))
    found: list[Layout] = []
    for grid in grids if len(shape) == 3 else []:
        for stride in range(1, max(grid.rows, grid.row) + 1):
            for multiplex in (False, True):
                layout = in_place(grid, shape, stride, multiplex)
                if layout is not None and (layout.grid.bases is not None or not multiplex):
                    found.append(layout)
    found.append(natural(shape))  # compact: a new base grid when spatial (a repack inside this op's masks)
    grid = grids[0] if grids else None
    if grid is not None and features > 1:
        extent = max(int(x.positions.max()) + 1 for x in inputs)
        if features * grid.channel_stride <= 2 * extent:
            found.append(Layout(np.arange(features, dtype=np.int64) * grid.channel_stride))
    unique: dict[bytes, Layout] = {}
    for layout in found:
        unique.setdefault(layout.positions.tobytes(), layout)
    return list(unique.values())


def split_background(matrix: Matrix, allow: bool) -> tuple[sp.csr_array, np.ndarray | None]:
    """``matrix = sparse + 1 w^T``: w the columns' common value where it fills most rows (else 0).

    Only a column with non-zeros in at least :data:`BACKGROUND` of its rows can have a non-zero common value, so
    only those columns are made dense.
    """
    m = sparse(matrix)
    if not allow or m.shape[0] < 4 or not m.nnz:
        return m, None
    tol = 1e-12 * max(float(abs(m).max()), 1e-300)
    filled = np.flatnonzero(np.bincount(m.indices, minlength=m.shape[1]) >= BACKGROUND * m.shape[0])
    if not len(filled):
        return m, None
    columns = m[:, filled].toarray()
    w = np.median(columns, axis=0)
    common = (np.abs(columns - w[None, :]) <= tol).mean(axis=0) >= BACKGROUND
    w = np.where(common & (np.abs(w) > tol), w, 0.0)
    if not np.any(w):
        return m, None
    background = np.zeros(m.shape[1])
    background[filled] = w
    rest = m.copy()
    rest.data[np.abs(rest.data) <= tol] = 0.0
    shifted = columns - w[None, :]
    shifted[np.abs(shifted) <= tol] = 0.0
    keep = np.ones(m.shape[1])
    keep[filled] = 0.0
    place = sp.csr_array((np.ones(len(filled)), (np.arange(len(filled)), filled)), shape=(len(filled), m.shape[1]))
    return sparse(rest @ identity(m.shape[1], keep) + sp.csr_array(shifted) @ place), background


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


def pack_latency(builder, in_value: str) -> dict[str, Any]:
    """Layouts, packed ops and tensors of a latency plan (``builder``: the lowering's values, ops, tensors).

    Returns:
        {"ops", "values", "tensors", "period", "window"}: ops with masked diagonals and block vectors,
        values with their positions (and grids), the block size D and the broadcast window E (0: none).
    """
    from veil.he.compiler import CompileError

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
    windowed = any(op["op"] == "sumsq" for op in ops)
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
    period = 2 * extent if broadcasts else extent
    if period > MAX_SLOTS >= extent:  # one block fills the largest ring: block sums wrap (packing.sum_steps)
        period = extent
    return _materialize(builder, ops, plans, layouts, period, window)


def _clean_outputs(ops: list[dict[str, Any]], wide: set[str], producer: dict[str, Any]) -> set[str]:
    """Linear outputs that must be exactly zero outside their positions: every value a sum of squares reads."""
    from veil.he.compiler import CompileError

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


def _products(layout: Layout, inputs: list[Layout], terms, op: dict[str, Any], values, folds) -> int:
    """Masked diagonals (one plaintext product each) of the op with ``folds``."""
    count = 0
    for out, row, fold in zip(op["outputs"], terms, folds, strict=True):
        for i, (r, c, _) in enumerate(row):
            if len(r):
                rows = layout.positions[r] if values[out]["features"] > 1 else np.zeros(len(r), dtype=np.int64)
                src = _sources(inputs[i], c, rows)
                count += len(np.unique(src - fold_rows(rows, src, fold)))
    return count


def _block(layout: Layout, extent: int) -> int:
    """The block size a plan would need with ``layout`` beside values reaching ``extent``: rotations cost per image
    what they cost per ciphertext times the block (fewer images fit a ciphertext when the block grows)."""
    return next_pow2(max(extent, int(layout.positions.max()) + 1))


def _cost(layout: Layout | None, inputs: list[Layout], terms, op: dict[str, Any], values,
          folds: list[tuple[int, int] | None] | None = None) -> tuple[int, int, bool]:
    """(rotations, modulus, signed) of the op's cheapest baby-step / giant-step split, fold rotations included."""
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
            d = np.unique(src - fold_rows(rows, src, fold))
            per_input[i].append(d)
            deltas.append(d)
        per_output.append(np.unique(np.concatenate(deltas)) if deltas else np.zeros(0, dtype=np.int64))
    strides = {g.channel_stride for g in [x.grid for x in inputs] + [layout.grid if layout else None] if g}
    strides |= {g.gap * g.row for g in [x.grid for x in inputs] if g}
    flat = [np.unique(np.concatenate(d)) if d else np.zeros(0, dtype=np.int64) for d in per_input]
    rotations, modulus, signed = best_split(flat, per_output, strides)
    return rotations + sum(len(fold_steps(f)) for f in folds), modulus, signed


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
            deltas = src - rows
            offsets, inverse = np.unique(deltas, return_inverse=True)
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
