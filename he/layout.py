"""Latency layouts: the slot positions a value of a plan may take, and the candidates a linear op chooses among.

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

:func:`veil.he.latency.pack_latency` applies these rules to a whole plan: it chooses each value's layout op by
op and packs the linear ops.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import scipy.sparse as sp
from veil.he.lowering import Matrix, identity, sparse
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
