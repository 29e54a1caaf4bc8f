"""Properties of the PriorGuide training side (issue 32): closed forms of the score network and the simulators.

The preconditioned network is the exact score of N(μ, σ_d²) when its output layer is zero, and its EDM-weighted
regression target has unit variance for any data with that mean and spread; the simulators have known noise
laws; the trainer is deterministic for a seed and learns something beyond the Gaussian skip.
"""

from __future__ import annotations

import math

import pytest
import torch
from veil.posterior import Gaussian
from veil.training.priorguide import (
    SamplerTrainConfig,
    ScoreEstimator,
    ScoreNet,
    ScoreNetConfig,
    get_task,
    load_sampler,
    save_sampler,
    simulator_task,
    train_score,
)
from veil.training.priorguide.trainer import _noise, posterior_from_network

from veil.config import ConfigError


def stats_net(dim: int = 3, seed: int = 0) -> tuple[ScoreNet, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(20_000, dim, generator=gen) * torch.tensor([0.5, 2.0, 1.0][:dim]) + torch.tensor([1.0, -2.0, 0.0][:dim])
    net = ScoreNet(ScoreNetConfig(dim=dim, x_dim=2, hidden=16))
    net.set_statistics(theta, torch.randn(20_000, 2, generator=gen))
    return net, theta


def test_untrained_network_is_the_exact_score_of_the_standardising_gaussian() -> None:
    """F = 0 at init: s(θ_t, σ) = -(θ_t - μ) / (σ² + σ_d²), the score of N(μ, diag(σ_d²) + σ² I)."""
    net, _ = stats_net()
    theta_t = torch.randn(6, 3) * 3
    sigma = torch.tensor([1e-3, 0.01, 0.1, 1.0, 5.0, 15.0])
    with torch.no_grad():
        got = net(theta_t, sigma, torch.randn(6, 2))
    var = sigma[:, None] ** 2 + net.theta_std**2
    theta_req = theta_t.clone().requires_grad_(True)
    logp = torch.distributions.Normal(net.theta_mean, var.sqrt()).log_prob(theta_req).sum()
    (exact,) = torch.autograd.grad(logp, theta_req)
    assert torch.allclose(got, exact, rtol=1e-5, atol=1e-6)


def test_edm_target_has_unit_variance_so_the_untrained_loss_is_one() -> None:
    net, theta = stats_net()
    gen = torch.Generator().manual_seed(1)
    sigma = _noise(theta.shape[0], net.config, gen)
    with torch.no_grad():
        loss = float(net.loss(theta, torch.zeros(theta.shape[0], 2), sigma, torch.randn(theta.shape, generator=gen)))
    assert loss == pytest.approx(1.0, abs=0.03)


def test_statistics_are_saved_buffers_and_constant_columns_do_not_divide_by_zero() -> None:
    net = ScoreNet(ScoreNetConfig(dim=2, x_dim=1, hidden=8))
    theta = torch.stack([torch.linspace(-1, 1, 50), torch.full((50,), 3.0)], 1)
    net.set_statistics(theta, torch.ones(50, 1))
    assert float(net.theta_std[1]) == pytest.approx(1e-6) and float(net.x_std[0]) == pytest.approx(1e-6)
    assert float(net.theta_mean[1]) == pytest.approx(3.0)
    assert {"theta_mean", "theta_std", "x_mean", "x_std"} <= set(net.state_dict())
    with torch.no_grad():
        out = net(theta[:4], torch.full((4,), 0.5), torch.ones(4, 1))
    assert bool(torch.isfinite(out).all())


def test_noise_levels_are_log_uniform_between_sigma_min_and_sigma_max() -> None:
    cfg = ScoreNetConfig(sigma_min=1e-3, sigma_max=10.0)
    sigma = _noise(50_000, cfg, torch.Generator().manual_seed(0))
    assert float(sigma.min()) >= 1e-3 and float(sigma.max()) <= 10.0
    logs = sigma.log()
    assert float(logs.mean()) == pytest.approx((math.log(1e-3) + math.log(10.0)) / 2, abs=0.05)
    # a quarter of the draws below the first quartile of log σ
    q1 = math.log(1e-3) + 0.25 * (math.log(10.0) - math.log(1e-3))
    assert float((logs < q1).float().mean()) == pytest.approx(0.25, abs=0.01)


def small_training(seed: int = 0, held_out: float = 0.05, steps: int = 40):
    task = get_task("two_moons")
    theta, x = task.simulate_pairs(1000, seed=0)
    cfg = SamplerTrainConfig(simulations=1000, steps=steps, batch_size=128, held_out=held_out, seed=seed)
    return theta, train_score(theta, x, task.prior, ScoreNetConfig(hidden=16, depth=2), cfg, progress=False)


def test_training_is_deterministic_for_a_seed_and_changes_with_it() -> None:
    _, a = small_training(seed=3)
    _, b = small_training(seed=3)
    _, c = small_training(seed=4)
    sa, sb, sc = (r.model.state_dict() for r in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert a.metrics["held_out_loss"] == b.metrics["held_out_loss"]


def test_training_learns_more_than_the_gaussian_skip() -> None:
    """Two Moons is far from Gaussian: the trained correction F beats F = 0, whose loss is 1 (previous test)."""
    task = get_task("two_moons")
    theta, x = task.simulate_pairs(2000, seed=0)
    cfg = SamplerTrainConfig(simulations=2000, steps=300, batch_size=128, held_out=0.2, ema=0.9)  # 400 held out
    result = train_score(theta, x, task.prior, ScoreNetConfig(hidden=32, depth=2), cfg, progress=False)
    assert result.metrics["held_out_loss"] < 0.9  # measured 0.82; F = 0 on the same pairs: 0.99
    assert result.metrics["steps"] == 300 and result.metrics["simulations"] == 2000


def test_without_a_held_out_split_every_pair_sets_the_statistics() -> None:
    theta, result = small_training(held_out=0.0, steps=5)
    assert "held_out_loss" not in result.metrics
    assert torch.allclose(result.model.theta_mean, theta.float().mean(0), atol=1e-6)
    assert not any(p.requires_grad for p in result.model.parameters())  # the EMA copy is frozen


def test_train_score_names_the_shapes_it_expected() -> None:
    task = get_task("gaussian_linear", 3)
    theta, x = task.simulate_pairs(10)
    with pytest.raises(ValueError, match=r"expected θ \[N, 2\] and x \[N, 2\], received \(10, 3\) and \(10, 3\)"):
        train_score(theta, x, task.prior, ScoreNetConfig(), SamplerTrainConfig(steps=1), progress=False)
    with pytest.raises(ValueError, match=r"append_simulations: expected θ \[N, d\] and x \[N, d_x\], received \(10, 3\) "
                                         r"and \(9, 3\)"):
        ScoreEstimator(task.prior).append_simulations(theta, x[:9])


@pytest.mark.parametrize(("cls", "kwargs", "message"), [
    (ScoreNetConfig, {"sigma_min": 1.0, "sigma_max": 0.5},
     r"sigma_min, sigma_max: expected 0 < sigma_min < sigma_max, received 1.0, 0.5"),
    (ScoreNetConfig, {"hidden": 0}, r"hidden: expected an integer >= 1, received 0"),
    (SamplerTrainConfig, {"held_out": 0.5}, r"held_out: expected a fraction in \[0, 0.5\), received 0.5"),
    (SamplerTrainConfig, {"ema": 1.0}, r"ema: expected a decay in \[0, 1\), received 1.0"),
    (SamplerTrainConfig, {"batch_size": 0}, r"batch_size: expected an integer >= 1, received 0"),
])
def test_bad_configs_name_the_field_expected_and_received(cls, kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        cls(**kwargs)


def test_gaussian_linear_noise_has_variance_a_tenth_and_a_closed_form_posterior() -> None:
    task = get_task("gaussian_linear", 3)
    theta, x = task.simulate_pairs(40_000, seed=2)
    assert (x - theta).var(0).tolist() == pytest.approx([0.1] * 3, abs=0.004)
    assert theta.var(0).tolist() == pytest.approx([0.1] * 3, abs=0.004)  # the N(0, 0.1 I) training prior
    prior = Gaussian.diag([0.5] * 3, [0.2] * 3)  # precision 25 per axis; the likelihood adds 10
    x_o = torch.tensor([0.1, -0.3, 0.0])
    post = task.posterior(x_o, prior)
    assert torch.allclose(post.cov, torch.eye(3, dtype=torch.float64) / 35)
    assert torch.allclose(post.loc, (25 * 0.5 + 10 * x_o.double()) / 35)
    with pytest.raises(ValueError, match="received prior family 'uniform'"):
        get_task("gaussian_linear_uniform", 2).posterior(torch.zeros(2))


def test_two_moons_and_mixture_follow_their_noise_laws() -> None:
    moons = get_task("two_moons")
    zero = torch.zeros(5000, 2, dtype=torch.float64)
    p = moons.simulate_checked(zero, torch.Generator().manual_seed(0))  # θ = 0: no shift, the crescent itself
    radius = (p - torch.tensor([0.25, 0.0], dtype=torch.float64)).norm(dim=1)
    assert float(radius.mean()) == pytest.approx(0.1, abs=0.002) and float(radius.std()) == pytest.approx(0.01, abs=0.002)
    assert float(p[:, 0].min()) >= 0.25 - 0.05  # a half circle to the right of its centre
    mix = get_task("gaussian_mixture")
    noise = mix.simulate_checked(zero, torch.Generator().manual_seed(1))
    assert float(noise.var()) == pytest.approx(0.505, abs=0.03)  # ½ · 1 + ½ · 0.01


@pytest.mark.parametrize(("name", "low", "high", "x_dim"), [
    ("gaussian_linear_uniform", -1.0, 1.0, 10), ("two_moons", -1.0, 1.0, 2), ("slcp", -3.0, 3.0, 8),
    ("gaussian_mixture", -10.0, 10.0, 2)])
def test_uniform_tasks_draw_inside_their_box(name: str, low: float, high: float, x_dim: int) -> None:
    theta, x = get_task(name).simulate_pairs(500, seed=4)
    assert float(theta.min()) >= low and float(theta.max()) <= high and x.shape == (500, x_dim)
    assert float(theta.min()) < low + 0.1 * (high - low)  # and fill it


def test_predictive_pairs_share_theta_and_x_with_simulate_pairs() -> None:
    task = get_task("gaussian_linear", 2)
    xi, x = task.simulate_predictive(300, seed=5)
    theta, x_pairs = task.simulate_pairs(300, seed=5)
    assert xi.shape == (300, 4) and torch.equal(xi[:, :2], theta) and torch.equal(x, x_pairs)
    assert not torch.equal(xi[:, 2:], x)  # x* is a second, independent simulation
    assert (xi[:, 2:] - x).var(0).tolist() == pytest.approx([0.2, 0.2], abs=0.05)  # two noises of variance 0.1


def test_a_simulator_returning_nan_is_refused_at_the_boundary() -> None:
    task = simulator_task("nan", lambda th, g: th / 0.0 * 0.0, Gaussian.diag([0.0], [1.0]))
    with pytest.raises(ValueError, match="task 'nan': simulator output expected finite values"):
        task.simulate_pairs(4)
    with pytest.raises(ValueError, match=r"expected an \[n, d_x\] tensor, received shape \(2,\) for n=2"):
        simulator_task("flat", lambda th, g: th[:, 0], Gaussian.diag([0.0], [1.0]))


def test_wrong_checkpoint_kind_is_refused_and_posteriors_freeze_the_network(tmp_path) -> None:
    _, result = small_training(steps=2)
    save_sampler(result, tmp_path / "ck", {"name": "two_moons"})
    model, prior, _ = load_sampler(tmp_path / "ck")
    assert prior == get_task("two_moons").prior
    (tmp_path / "ck" / "config.json").write_text('{"kind": "codec"}')
    with pytest.raises(ValueError, match=r"expected kind 'priorguide-sampler', received 'codec'"):
        load_sampler(tmp_path / "ck")
    model.requires_grad_(True)
    posterior_from_network(model, prior, 1000)
    assert not any(p.requires_grad for p in model.parameters())
