"""Conservation law of intrinsic training dynamics (other_seeds.md §5.2b) as a gradient check of PolyMLP.

For a hidden neuron with a p-homogeneous activation (here x^2, p = 2), incoming weights u_j (bias included)
and outgoing weights v_j, h_j = ||u_j||^2 - p ||v_j||^2 is conserved under gradient flow. Plain GD with
lr = 1e-3 to horizon t = 2 must keep it within 1e-3, while the wrong law (p = 1) drifts by more than 1e-2.
A wrong gradient through PolyAct (or the layers around it) breaks the law.
"""

from __future__ import annotations

import torch
from veil.training.uldnet import ModelConfig, PolyActConfig, build_model


def _laws(model: torch.nn.Module, p: float) -> torch.Tensor:
    first, last = model.net[1], model.net[4]  # Flatten, Linear, Identity (no norm), PolyAct, Linear
    u2 = first.weight.pow(2).sum(dim=1) + first.bias.pow(2)  # (hidden,)
    v2 = last.weight.pow(2).sum(dim=0)  # (hidden,)
    return u2 - p * v2


def test_square_activation_conserves_u2_minus_2v2_under_gradient_descent() -> None:
    torch.manual_seed(0)
    config = ModelConfig(arch="mlp", input_shape=[5], num_classes=3, width=6, depth=1, normalize=False,
                         act=PolyActConfig(degree=2, init="square", trainable=False, per_channel=False))
    model = build_model(config).double()
    x = torch.randn(64, 5, dtype=torch.float64)
    target = torch.randn(64, 3, dtype=torch.float64)
    h2_start, h1_start = _laws(model, 2.0).detach(), _laws(model, 1.0).detach()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(2000):  # horizon t = steps * lr = 2
        optimizer.zero_grad()
        loss = ((model(x) - target) ** 2).sum(dim=1).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]  # the weights really moved
    drift_true = (_laws(model, 2.0) - h2_start).abs().max().item()
    drift_wrong = (_laws(model, 1.0) - h1_start).abs().max().item()
    assert drift_true < 1e-3
    assert drift_wrong > 1e-2
