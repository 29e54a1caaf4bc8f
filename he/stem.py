"""The stem conv on the client's im2col patches: which Conv is the stem, its patches' gather index and block.

A latency plan whose input feeds one Conv may have the client encrypt that conv's im2col patches (TenSEAL's
``enc_matmul_encoding``), so the conv is a 1x1 channel mix on ciphertexts; :func:`veil.he.compiler.compile` lowers it
(``_lower_gathered_conv``) with these helpers.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from veil.he.layout import MAX_SLOTS
from veil.he.packing import next_pow2


def stem_conv(graph: onnx.GraphProto, source: str) -> onnx.NodeProto | None:
    """The Conv that is the graph input's only consumer, if there is one."""
    consumers = [n for n in graph.node if source in n.input]
    return consumers[0] if len(consumers) == 1 and consumers[0].op_type == "Conv" and not consumers[0].domain \
        else None


def im2col_gather(shape: tuple[int, ...], kernel: tuple[int, int], strides: tuple[int, int],
                  pads: tuple[int, int, int, int], dilations: tuple[int, int]) -> tuple[np.ndarray, tuple[int, ...]]:
    """For a 2-D conv on a (C, H, W) sample: the flat input index (-1: padding) of every patch entry, in
    (C, kh, kw, OH, OW) order, and that order's shape (C * kh * kw, OH, OW)."""
    (c, h, w), (kh, kw), (sy, sx), (dy, dx) = shape, kernel, strides, dilations
    oh = (h + pads[0] + pads[2] - dy * (kh - 1) - 1) // sy + 1
    ow = (w + pads[1] + pads[3] - dx * (kw - 1) - 1) // sx + 1
    ci, ky, kx, oy, ox = np.meshgrid(np.arange(c), np.arange(kh), np.arange(kw), np.arange(oh), np.arange(ow),
                                     indexing="ij")
    iy, ix = oy * sy - pads[0] + ky * dy, ox * sx - pads[1] + kx * dx
    inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
    index = np.where(inside, ci * h * w + iy * w + ix, -1).reshape(-1)
    return index, (c * kh * kw, oh, ow)


def stem_patches(node: onnx.NodeProto, shape: tuple[int, ...], consts: dict[str, np.ndarray]
                  ) -> tuple[np.ndarray, tuple[int, ...], np.ndarray, int, int] | None:
    """A stem Conv on a (C, H, W) sample as im2col patches: (:func:`im2col_gather`'s index and patch shape, the
    weight, the patches' block, the conv's own block: its input's or output's, the larger); None for a conv this
    does not cover (groups, auto_pad, non-2-D)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    weight = consts.get(node.input[1]) if len(node.input) > 1 else None
    if weight is None or weight.ndim != 4 or len(shape) != 3 or attrs.get("group", 1) != 1 \
            or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    index, patch_shape = im2col_gather(shape, tuple(weight.shape[2:]), tuple(attrs.get("strides", (1, 1))),
                                       tuple(attrs.get("pads", (0, 0, 0, 0))), tuple(attrs.get("dilations", (1, 1))))
    own = next_pow2(max(int(np.prod(shape)), weight.shape[0] * int(np.prod(patch_shape[1:]))))
    return index, patch_shape, weight, next_pow2(len(index)), own


def stem_may_grow(graph: onnx.GraphProto, shape: tuple[int, ...]) -> bool:
    """Whether the graph's stem Conv (on samples of ``shape``) has patches that need a larger block than its own,
    within the largest ring."""
    stem = stem_conv(graph, graph.input[0].name)
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer if stem is not None and i.name in stem.input}
    patches = None if stem is None else stem_patches(stem, shape, consts)
    return patches is not None and patches[4] < patches[3] <= MAX_SLOTS


def conv_taps(weight: np.ndarray, index: np.ndarray, positions: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A conv's products as (output row, patch entry, tap weight): patch entry k P + p (tap k, output position p,
    :func:`im2col_gather` order; padding left out) of output channel o lands on row o P + p with weight W[o, k]."""
    out_channels = weight.shape[0]
    entry = np.flatnonzero(index >= 0)
    k, p = np.divmod(entry, positions)
    rows = (np.arange(out_channels)[:, None] * positions + p[None, :]).reshape(-1)
    taps = weight.reshape(out_channels, -1).astype(np.float64)[:, k].reshape(-1)
    return rows, np.tile(entry, out_channels), taps
