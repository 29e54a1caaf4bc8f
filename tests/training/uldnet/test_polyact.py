"""PolyAct: initial fits, Horner evaluation, per-channel coefficients, the c_i learning-rate scalers."""

from __future__ import annotations

import pytest
import torch
from veil.training.uldnet import PolyAct, PolyActConfig
from veil.training.uldnet.polyact import gaussian_fit

from veil.config import ConfigError


def test_relu_fit_matches_the_hermite_projection() -> None:
    # Least squares under N(0,1) onto {1, x, x^2}: p(x) = 1/(2 sqrt(2 pi)) + x/2 + x^2/(2 sqrt(2 pi)).
    s = 1.0 / (2.0 * (2.0 * torch.pi) ** 0.5)
    assert gaussian_fit("relu", 2) == pytest.approx((s, 0.5, s), abs=1e-9)
    assert gaussian_fit("relu", 1) == pytest.approx((2 * s, 0.5), abs=1e-9)


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_horner_equals_the_polynomial(degree: int) -> None:
    torch.manual_seed(0)
    act = PolyAct(6, PolyActConfig(degree=degree))
    with torch.no_grad():
        act.alpha.normal_()
    x = torch.randn(5, 6)
    coeffs = act.coefficients()  # (6, degree+1)
    expected = sum(coeffs[:, i] * x**i for i in range(degree + 1))
    torch.testing.assert_close(act(x), expected * torch.ones_like(x))


def test_per_channel_coefficients_on_feature_maps() -> None:
    act = PolyAct(3, PolyActConfig(degree=1, init="identity"), channel_dim=1)
    with torch.no_grad():
        act.alpha[:, 1] = torch.tensor([1.0, 2.0, 3.0])  # slopes per channel
    y = act(torch.ones(2, 3, 4, 4))
    assert torch.equal(y[:, :, 0, 0], torch.tensor([[1.0, 2.0, 3.0]] * 2))


def test_scales_act_as_learning_rate_factors() -> None:
    cfg = PolyActConfig(degree=2, per_channel=False, scales=[1.0, 1.0, 0.1])
    act = PolyAct(1, cfg)
    x = torch.tensor([[2.0]])
    act(x).sum().backward()
    # d/d alpha_i of alpha_i c_i x^i = c_i x^i
    torch.testing.assert_close(act.alpha.grad, torch.tensor([[1.0, 2.0, 0.4]]))


def test_frozen_coefficients_have_no_parameters() -> None:
    act = PolyAct(4, PolyActConfig(init="square", trainable=False))
    assert list(act.parameters()) == []
    torch.testing.assert_close(act(torch.tensor([[3.0, -2.0, 0.0, 1.0]])), torch.tensor([[9.0, 4.0, 0.0, 1.0]]))


def test_invalid_degree_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"PolyActConfig\.degree: expected 0\.\.3 \(depth <= 3\), received 4"):
        PolyActConfig(degree=4)
