"""veil.LinearAttention under CKKS: RoPE(Q) (RoPE(K)^T V) / N lowered to two ct x ct products.

The attention-only model (Linear -> LinearAttention -> Linear) runs encrypted and must match ONNX Runtime;
the lowering's bookkeeping (RoPE as a matrix, replication/contraction index maps) is checked in numpy
against the torch layer, so a wrong index or sign is caught without encryption.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn
from veil.export import export_graph
from veil.he.attention import rope_matrix
from veil.he.compiler import compile
from veil.he.evaluate import PlanEvaluator
from veil.he.keys import SecretKeyring
from veil.training.uldnet import ModelConfig, PolyViT
from veil.training.uldnet.attention import MultiHeadAttention, apply_rope, rope_tables
from veil.training.uldnet.config import PolyNormConfig


class AttentionOnly(nn.Module):
    """(B, 1, 8, 8) -> 4 tokens of 16 -> multi-head linear attention (2 heads of 8) -> mean -> 3 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.attn, self.fc = MultiHeadAttention(16, 2, 4, linear=True), nn.Linear(16, 3)

    def forward(self, x):
        tokens = x.reshape(x.shape[0], 4, 16)
        return self.fc(self.attn(tokens).mean(dim=1))


def _export(model: nn.Module):
    return export_graph(model.eval(), (torch.randn(4, 1, 8, 8),), ["x"], ["logits"], {"x": {0: "batch"}}).model


def _ort(model, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString()).run(None, {"x": x.astype(np.float32)})[0]


def test_rope_matrix_is_the_torch_rope() -> None:
    cos, sin = rope_tables(4, 8)
    x = torch.randn(2, 4, 8, dtype=torch.float64)  # (H, N, hd)
    expected = apply_rope(x, cos.double(), sin.double()).reshape(-1).numpy()
    got = rope_matrix(cos.numpy(), sin.numpy(), heads=2) @ x.reshape(-1).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.slow  # ~1 min of ct x ct products at N = 16384 on one core
@pytest.mark.isolated
def test_linear_attention_encrypted_matches_onnx_runtime() -> None:
    torch.manual_seed(0)
    model = _export(AttentionOnly())
    plan = compile(model, mode="latency")
    assert plan.levels == 5  # replicate + product, twice, then the folded projection/mean/fc
    params = plan.parameters()
    ring = SecretKeyring.generate(params, plan.galois_steps)
    x = np.random.default_rng(0).normal(size=(2, 1, 8, 8))
    out = PlanEvaluator(plan, params).run(ring.encrypt(plan.encode_inputs(x)), ring.evaluation_keys())
    reference = _ort(model, x)
    assert np.abs(reference).max() > 0.05
    np.testing.assert_allclose(plan.decode_outputs(ring.decrypt(out), len(x)), reference, atol=1e-2, rtol=0)


@pytest.mark.parametrize("token_stats", ["sample", "feature"])
def test_polyvit_compiles_with_the_papers_per_sample_norm(token_stats: str) -> None:
    torch.manual_seed(0)
    config = ModelConfig(arch="vit", input_shape=[1, 8, 8], width=16, depth=1, heads=2, patch_size=4,
                         norm=PolyNormConfig(token_stats=token_stats))
    model = _export(PolyViT(config))
    if token_stats == "feature":  # per-token statistics are not the paper's (he.md §1.2): refused by name
        with pytest.raises(Exception, match="PolyNorm"):
            compile(model)
        return
    plan = compile(model, mode="latency")
    assert plan.levels > 12  # two PolyNorms, attention, the MLP's PolyAct: deeper than one small set
    assert any(op["node"].endswith("linear_attention") or "attention" in op["node"] for op in plan.ops)
