"""Plans cut to the smallest ring (N = 4096: one level per segment at 14 bits) still compute the model."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch
from torch import nn
from veil.export import export_graph
from veil.he.evaluate import PlanEvaluator
from veil.he.keys import SecretKeyring
from veil.he.segments import compile_segmented


class Square(nn.Module):
    """x * x, the tutorial network's activation (one level; a degree-2 PolyAct takes two)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x


def test_segments_at_n_4096_run_encrypted_and_match_onnx_runtime() -> None:
    """Every segment at N = 4096 (each key ~7x smaller than at 8192): the client refreshes between one-level
    segments, and the logits match ONNX Runtime's (what benchmarks/he_cnn.py's refresh rows rely on)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 8), Square(), nn.Linear(8, 8), Square(), nn.Linear(8, 3)).eval()
    graph = export_graph(model, (torch.randn(4, 12),), ["x"], ["logits"], {"x": {0: "batch"}}).model
    plan = compile_segmented(graph, precision_bits=14, refresh=True, max_poly_modulus_degree=4096)
    assert plan.rounds >= 3 and {p.parameters().poly_modulus_degree for p in plan.plans} == {4096}
    assert all(p.levels <= p.parameters().levels for p in plan.plans)
    x = np.random.default_rng(1).uniform(-1, 1, size=(2, 12))
    y = x
    for p in plan.plans:  # one round each: fresh encryption under this segment's keys, server, decrypt
        params = p.parameters()
        ring = SecretKeyring.generate(params, p.galois_steps)
        out = PlanEvaluator(p, params).run(ring.encrypt(p.encode_inputs(y)), ring.evaluation_keys())
        y = p.decode_outputs(ring.decrypt(out), len(x))
    expected = ort.InferenceSession(graph.SerializeToString()).run(None, {"x": x.astype(np.float32)})[0]
    assert np.abs(y - expected).max() < 0.01 * np.abs(expected).max() + 1e-3, (y, expected)
    assert np.array_equal(y.argmax(1), expected.argmax(1))
