"""Rotations and Galois keys per linear op of a digits PolyCNN: the replicated dense layout vs slot layouts.

Counts only (no encryption, no timing): "before" is the replicated Halevi-Shoup layout veil used until
issue 17 (one image per ciphertext, features padded to a period D, 2^ceil(log2 sqrt D) shared baby steps,
giant steps per output, log2 D slot-sum rotations per PolyNorm), evaluated on the same lowered program
(whose PolyNorm no longer carries the dense centring, which made the old layout slightly costlier still);
"after" is :func:`veil.he.latency.pack_latency`. The program is lowered without choosing CKKS parameters, so
models too deep for one 128-bit set (the digits presets) can still be compared layer by layer.

    python benchmarks/he_layouts.py --width 8 --depth 1
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch
from onnx import numpy_helper
from veil.export import export_graph
from veil.he.compiler import _lower
from veil.he.latency import pack_latency
from veil.he.lowering import Affine, Builder
from veil.he.packing import decompose, key_manifest, rotation_uses, sum_steps
from veil.training.uldnet import ModelConfig, PolyCNN


def lower(graph) -> Builder:
    """The compiler's lowering of ``graph`` (one input, one output), without parameter selection."""
    builder = Builder()
    shape = tuple(d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim[1:])
    features = math.prod(shape)
    tensors = {graph.graph.input[0].name: Affine({builder.input(features, shape): np.eye(features)},
                                                 np.zeros(features), shape)}
    consts = {i.name: numpy_helper.to_array(i) for i in graph.graph.initializer}
    for node in graph.graph.node:
        _lower(node, tensors, consts, builder, list(graph.opset_import))
    builder.linear(tensors[graph.graph.output[0].name], "output")
    return builder


def replicated_costs(builder: Builder) -> tuple[int, list[tuple[str, str, int]], set[int]]:
    """(period, [(op, node, rotations)], Galois steps) of the replicated dense BSGS layout."""
    period = 1 << math.ceil(math.log2(max(v["features"] for v in builder.values.values())))
    baby = 1 << math.ceil(math.log2(math.isqrt(period - 1) + 1))
    rows, per_op, steps = np.arange(period), [], set()
    for op in builder.ops:
        if op["op"] == "sumsq":
            per_op.append(("sumsq", op["node"], int(math.log2(period))))
            steps |= {1 << k for k in range(int(math.log2(period)))}
        elif op["op"] == "linear":
            babies, giants = set(), 0
            for row in op["weights"]:
                out = set()
                for name in row:
                    matrix = builder.tensors[name]
                    padded = np.zeros((period, period))
                    padded[: matrix.shape[0], : matrix.shape[1]] = matrix
                    table = padded[rows[None, :], (rows[None, :] + rows[:, None]) % period]  # (i, j) -> A[j, j+i]
                    nonzero = np.flatnonzero(np.any(table != 0, axis=1))
                    babies |= set((nonzero % baby).tolist())
                    out |= set(((nonzero // baby) * baby).tolist())
                giants += len(out - {0})
                steps |= out
            steps |= babies
            per_op.append(("linear", op["node"], len(babies - {0}) + giants))
    return period, per_op, steps - {0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=8, help="PolyCNN base channels")
    parser.add_argument("--depth", type=int, default=1, help="residual blocks per stage")
    parser.add_argument("--slots", type=int, default=16384, help="N / 2 used for the key manifests")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = PolyCNN(ModelConfig(arch="cnn", input_shape=[1, 8, 8], width=args.width, depth=args.depth)).eval()
    graph = export_graph(model, (torch.randn(4, 1, 8, 8),), ["x"], ["logits"], {"x": {0: "batch"}}).model
    program = lower(graph)
    period, before, old_steps = replicated_costs(program)
    packed = pack_latency(program, "v0")
    uses = rotation_uses(packed["ops"], packed["period"])
    print(f"## PolyCNN width {args.width} depth {args.depth}, slots {args.slots}\n")
    print(f"before: period {period}, 1 image per ciphertext, {sum(c for *_, c in before)} rotations, "
          f"{len(old_steps)} Galois keys")
    print(f"after: block {packed['period']}, {args.slots // packed['period']} images per ciphertext, "
          f"{sum(uses.values())} rotations")
    for keys in ("exact", "pow2", "binary", "budget:16"):
        manifest = key_manifest(uses, keys, args.slots)
        switches = sum(n * len(decompose(s, set(manifest), args.slots)) for s, n in uses.items())
        print(f"  rotation_keys={keys}: {len(manifest)} Galois keys, {switches} key switches")
    print("\nbefore:\n\n| op | node | rotations |\n|---|---|---|")
    for kind, node, old in before:
        print(f"| {kind} | {node} | {old} |")
    print("\nafter:\n\n| op | node | rotations | baby + giant (outputs), block sums, masks, layout |\n|---|---|---|---|")
    for op in packed["ops"]:
        if op["op"] == "sumsq":
            print(f"| sumsq | {op['node']} | {len(sum_steps(op['window'], packed['period']))} | |")
        elif op["op"] == "linear":
            sums = sum(len(sum_steps(op["window"], packed["period"])) for part in op["broadcast"] if part)
            babies, giants = sum(map(len, op["baby_steps"])), sum(map(len, op["giant_steps"]))
            masks = sum(len(p["offsets"]) for row in op["diagonals"] if row for p in row if p)
            outs = sum(1 for v in op["outputs"] if packed["values"][v]["features"] > 1)
            grid = packed["values"][op["outputs"][0]].get("grid")
            where = f"gap {grid['gap']}, channel stride {grid['channel_stride']}" if grid else "flat"
            print(f"| linear | {op['node']} | {babies + giants + sums} | {babies} + {giants} ({outs}), {sums}, "
                  f"{masks}, {where} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
