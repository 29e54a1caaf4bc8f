"""PolyNorm: g's constants (he.md §1.3), closeness to LayerNorm, per-sample statistics, boundedness."""

from __future__ import annotations

import math

import pytest
import torch
from veil.training.uldnet import PolyNorm, PolyNormConfig
from veil.training.uldnet.polynorm import output_std, set_warmup, variance_penalty

from veil.config import ConfigError


def test_paper_constants_match_the_spec() -> None:
    a, b, c = PolyNormConfig().quadratic()  # k=4, mu=2
    assert a == pytest.approx(0.0147314, abs=1e-7)
    assert b == 8.0
    assert c == pytest.approx(0.1767767, abs=1e-7)
    # expanded: g(x) = 0.014731 x^2 - 0.235702 x + 1.119586
    assert (a, -2 * a * b, a * b * b + c) == pytest.approx((0.014731, -0.235702, 1.119586), abs=2e-6)


@pytest.mark.parametrize(("k", "mu"), [(4.0, 2.0), (3.0, 1.0), (2.5, 0.5)])
def test_g_matches_inverse_sqrt_in_value_and_slope_at_mu(k: float, mu: float) -> None:
    norm = PolyNorm(4, PolyNormConfig(k=k, mu=mu))
    x = torch.tensor(mu, dtype=torch.float64, requires_grad=True)
    y = norm.g(x)
    y.backward()
    assert y.item() == pytest.approx(mu**-0.5, rel=1e-12)
    assert x.grad.item() == pytest.approx(-0.5 * mu**-1.5, rel=1e-12)


def test_g_stays_below_inverse_sqrt_on_the_valid_interval() -> None:
    cfg = PolyNormConfig()
    norm = PolyNorm(1, cfg)
    x = torch.linspace(1e-3, cfg.k * cfg.mu, 2000, dtype=torch.float64)
    assert torch.all(norm.g(x) <= x.rsqrt() + 1e-12)


def test_k_range_is_enforced() -> None:
    with pytest.raises(ConfigError, match=r"PolyNormConfig\.k: expected 1 < k < 5, received 5.5"):
        PolyNormConfig(k=5.5)
    with pytest.warns(UserWarning, match="no longer holds"):
        PolyNormConfig(k=2.0)


def test_output_std_table_of_the_spec() -> None:
    expected = {0.25: 0.71, 0.5: 0.90, 1: 1.00, 2: 0.82, 3: 0.58, 4: 0.50, 6: 1.43}
    for v, std in expected.items():
        assert output_std(v, PolyNormConfig()) == pytest.approx(std, abs=0.006)


def _calibrated(norm: PolyNorm, x: torch.Tensor) -> PolyNorm:
    """Track the running variance on x (momentum 1 at the first batch), then freeze it."""
    norm.train()
    norm(x)
    return norm.eval()


def test_equals_layernorm_when_variance_equals_running_mean() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 16, 4, 4) * 3 + 1
    norm = _calibrated(PolyNorm(16, PolyNormConfig(affine=False), layout="channels"), x)
    reference = torch.nn.functional.layer_norm(x, x.shape[1:], eps=0.0)
    torch.testing.assert_close(norm(x), reference, rtol=1e-5, atol=1e-5)


def test_close_to_layernorm_when_variance_is_near_running_mean() -> None:
    torch.manual_seed(0)
    base = torch.nn.functional.layer_norm(torch.randn(64, 32), (32,), eps=0.0)  # every sample: variance 1
    norm = _calibrated(PolyNorm(32, PolyNormConfig(affine=False)), base)
    for scale in (0.9, 1.1):  # variance ratio v = 0.81 and 1.21: g is off 1/sqrt by about 1.2 %
        x = base * scale
        ln = torch.nn.functional.layer_norm(x, (32,), eps=0.0)
        rel = ((norm(x) - ln).norm(dim=-1) / ln.norm(dim=-1)).max().item()
        assert 0.005 < rel < 0.02


def test_statistics_are_per_sample_in_eval() -> None:
    torch.manual_seed(0)
    norm = _calibrated(PolyNorm(8, PolyNormConfig(), layout="channels"), torch.randn(16, 8, 4, 4))
    x = torch.randn(4, 8, 4, 4)
    alone = torch.cat([norm(x[i:i + 1]) for i in range(4)])
    mixed = norm(torch.cat([x, 100 * torch.randn(4, 8, 4, 4)]))[:4]
    torch.testing.assert_close(mixed, alone)


@pytest.mark.parametrize(("stats", "dims"), [("feature", (-1,)), ("sample", (1, 2))])
def test_token_statistics_axes(stats: str, dims: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8) * torch.linspace(0.5, 2, 5)[None, :, None]
    norm = PolyNorm(8, PolyNormConfig(token_stats=stats, affine=False))
    set_warmup(norm, True)  # exact LayerNorm over the chosen axes
    y = norm.train()(x)
    assert torch.allclose(y.mean(dim=dims), torch.zeros(()), atol=1e-5)
    assert torch.allclose(y.pow(2).mean(dim=dims), torch.ones(()), atol=1e-3)


def test_running_variance_tracks_in_training_and_freezes_in_eval() -> None:
    norm = PolyNorm(4, PolyNormConfig(momentum=0.5))
    norm.train()
    norm(torch.randn(256, 4) * 2)  # first batch: momentum 1 -> running_var = batch mean variance (about 4*3/4)
    first = norm.running_var.item()
    norm(torch.randn(256, 4) * 4)
    assert norm.running_var.item() == pytest.approx(0.5 * first + 0.5 * 12, rel=0.25)
    frozen = norm.running_var.clone()
    norm.eval()(torch.randn(8, 4) * 10)
    assert torch.equal(norm.running_var, frozen)


def test_deep_stack_stays_bounded_for_off_distribution_inputs() -> None:
    """30 x (orthogonal Linear -> PolyNorm -> x^2 + x): per-sample stats keep every layer bounded (he.md §1.2)."""
    torch.manual_seed(0)
    width, layers = 64, 30
    linears = [torch.nn.init.orthogonal_(torch.empty(width, width)) for _ in range(layers)]
    norms = [PolyNorm(width, PolyNormConfig(affine=False)) for _ in range(layers)]

    def run(x: torch.Tensor, train: bool) -> list[float]:
        stds = []
        for w, norm in zip(linears, norms, strict=True):
            norm.train(train)
            x = norm(x @ w)
            stds.append(x.std().item())
            x = 0.5 * x * x + x - 0.5  # a degree-2 polynomial activation
        return stds

    run(torch.randn(512, width), train=True)  # calibrate the running variances
    # Input variance 0.09x .. 2.25x the calibration. Far beyond that (v > k for some samples after the
    # squares) the parabola of g rises again and a deep stack can diverge: the reason for the v penalties.
    for scale in (0.3, 0.7, 1.2, 1.5):
        stds = run(scale * torch.randn(256, width), train=False)
        assert all(math.isfinite(s) for s in stds)
        assert max(stds) < 1.5 and min(stds) > 0.3, (scale, stds)


def test_variance_penalty_terms() -> None:
    norm = PolyNorm(4, PolyNormConfig())
    norm.train()
    norm(torch.randn(32, 4))
    norm(torch.randn(32, 4) * 2)
    v = norm.last_v
    got = variance_penalty(norm, lambda1=0.3, lambda2=0.7)
    torch.testing.assert_close(got, 0.3 * v.mean() + 0.7 * ((v - 1) ** 2).mean())
