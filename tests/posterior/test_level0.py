"""Level-0 analytic checks of PriorGuide (spec C6 a–h): Gaussian-linear model, exact score, no training."""

from __future__ import annotations

import math

import pytest
import torch
from veil.posterior import Gaussian, GaussianLinearScore, Mixture, PriorGuidePosterior, Uniform, c2st
from veil.posterior.diagnostics import ood_fraction, sir_report
from veil.posterior.ratio import FitSettings, prior_ratio
from veil.posterior.sampler import SamplerSettings, _Guidance
from veil.posterior.score import gaussian_linear_posterior

S_P = math.sqrt(0.1)  # training prior std (sbibm GL: variance 0.1)


def setup(d: int, seed: int = 0):
    train = Gaussian.diag([0.0] * d, [S_P] * d)
    noise = 0.1 * torch.eye(d, dtype=torch.float64)
    score = GaussianLinearScore(train, noise)
    gen = torch.Generator().manual_seed(seed)
    mu = (torch.rand(d, generator=gen, dtype=torch.float64) * 2 - 1) * 1.5 * S_P
    strong = Gaussian.diag(mu, [0.2 * S_P] * d)
    x = strong.sample(1, gen)[0] + math.sqrt(0.1) * torch.randn(d, generator=gen, dtype=torch.float64)
    return train, noise, score, strong, x


def gaussian_kl(theta: torch.Tensor, target: Gaussian) -> float:
    """KL(N(m̂, Ĉ) || target) from the draws' moments: one number for mean and covariance error."""
    m, c = theta.mean(0), torch.cov(theta.T)
    prec = torch.linalg.inv(target.cov)
    diff = target.loc - m
    d = m.numel()
    return float(0.5 * (torch.trace(prec @ c) + diff @ prec @ diff - d + torch.logdet(target.cov) - torch.logdet(c)))


def test_a_identity_prior_gives_bit_identical_draws() -> None:
    train, _, score, _, x = setup(3)
    post = PriorGuidePosterior(score, train)
    guided = post.sample((500,), x=x, prior=Gaussian.diag([0.0] * 3, [S_P] * 3), seed=7)
    unguided = post.sample((500,), x=x, seed=7)
    assert guided.diagnostics["ratio"]["method"] == "identity" and guided.diagnostics["ratio"]["K"] == 0
    assert torch.equal(guided.theta, unguided.theta)


@pytest.mark.parametrize("d", [2, 5])
def test_b_exact_kernel_and_ratio_recover_the_analytic_posterior(d: int) -> None:
    train, noise, score, strong, x = setup(d, seed=d)
    target = gaussian_linear_posterior(strong, noise, x)
    post = PriorGuidePosterior(score, train)
    out = post.sample((4000,), x=x, prior=strong, steps=500, langevin_steps=0, pilot=0, kernel="paper",
                      kernel_cov=score.posterior(x).cov, seed=1)
    theta = out.theta
    se = (target.cov.diagonal() / theta.shape[0]).sqrt()
    assert bool(((theta.mean(0) - target.loc).abs() < 4 * se).all())
    assert float(torch.linalg.norm(torch.cov(theta.T) - target.cov) / torch.linalg.norm(target.cov)) < 0.1
    ref = target.sample(2000, torch.Generator().manual_seed(2))
    assert c2st(ref, theta[:2000], trees=50) <= 0.55
    unguided = post.sample((2000,), x=x, steps=100, langevin_steps=0, seed=1).theta
    assert c2st(ref, unguided, trees=50) >= 0.7  # the control: the test tells the two apart


def test_c_paper_kernel_error_falls_with_langevin_steps() -> None:
    train, noise, score, strong, x = setup(3, seed=11)
    target = gaussian_linear_posterior(strong, noise, x)
    post = PriorGuidePosterior(score, train)
    errors = {}
    for n_l in (0, 2, 8):
        errors[n_l] = sum(gaussian_kl(post.sample((3000,), x=x, prior=strong, steps=25, langevin_steps=n_l,
                                                  kernel="paper", pilot=0, seed=s).theta, target)
                          for s in range(3)) / 3
    assert errors[0] > 2 * errors[2] > 0 and errors[8] < errors[2] * 1.1, errors


def test_d_vjp_jacobian_is_exact_and_identity_jacobian_is_biased_at_high_noise() -> None:
    train, _, score, strong, x = setup(4, seed=3)
    S = score.posterior(x).cov
    ratio = prior_ratio(train, strong)
    guidance = _Guidance(ratio, torch.linalg.eigh(S))
    post = PriorGuidePosterior(score, train)
    theta = strong.sample(64, torch.Generator().manual_seed(0))
    eye = torch.eye(4, dtype=torch.float64)
    gaps = {}
    for sigma in (5.0, 0.5, 1e-3):
        s = score(theta, torch.full((64,), sigma, dtype=torch.float64), x)
        jac = eye - sigma**2 * torch.linalg.inv(S + sigma**2 * eye)  # ∇μ0|t, constant and symmetric
        mu0 = theta + sigma**2 * s
        cov = ratio.covs[0] + guidance.sigma0(sigma)
        inner = torch.linalg.solve(cov, (ratio.means[0] - mu0).T).T  # Σ̃⁻¹(μ_r − μ0), [n, d]
        vjp = post._guided_score(theta, sigma, x, guidance, "vjp") - s
        ident = post._guided_score(theta, sigma, x, guidance, "identity") - s
        assert torch.allclose(vjp, inner @ jac, atol=1e-6, rtol=1e-6)
        assert torch.allclose(ident, inner, atol=1e-6, rtol=1e-6)
        gaps[sigma] = float((ident - vjp).norm() / vjp.norm())
    assert gaps[5.0] > 0.5 and gaps[1e-3] < 1e-3, gaps


@pytest.mark.parametrize("training", ["wide-gaussian", "uniform"])
def test_e_mixture_prior_mode_fractions(training: str) -> None:
    d = 2
    wide = Gaussian.diag([0.0] * d, [10.0] * d)  # r ∝ q up to 1e-3 relative
    # a uniform box: the score is the wide Gaussian's (flat to 1e-3 where the posterior lives) and the ratio
    # takes the paper's shortcut r ∝ q
    train = Uniform([-30.0] * d, [30.0] * d) if training == "uniform" else wide
    noise = 0.1 * torch.eye(d, dtype=torch.float64)
    comps = [Gaussian.diag([0.4, 0.4], [0.1, 0.1]), Gaussian.diag([-0.4, -0.3], [0.1, 0.1])]
    q = Mixture([0.3, 0.7], comps)
    x = torch.tensor([0.1, 0.05], dtype=torch.float64)
    lik = torch.stack([Gaussian(c.loc, c.cov + noise).log_prob(x[None])[0] for c in comps])
    weights = torch.softmax(torch.log(q.weights) + lik, 0)  # π_k' ∝ π_k N(x | μ_k, Σ_k + Σ_x)
    posts = [gaussian_linear_posterior(c, noise, x) for c in comps]
    target = Mixture(weights, posts)
    out = PriorGuidePosterior(GaussianLinearScore(wide, noise), train).sample((4000,), x=x, prior=q, seed=0)
    assert out.diagnostics["ratio"]["method"] == ("uniform-shortcut" if training == "uniform" else "closed-form")
    logp = torch.stack([p.log_prob(out.theta) for p in posts], -1)  # [n, 2]
    share = float((logp.argmax(-1) == 0).double().mean())
    ref = target.sample(2000, torch.Generator().manual_seed(1))
    expected = float((torch.stack([p.log_prob(ref) for p in posts], -1).argmax(-1) == 0).double().mean())
    assert abs(share - expected) < 0.05, (share, expected, weights)
    assert c2st(ref, out.theta[:2000], trees=50) <= 0.6


@pytest.mark.parametrize("d", [2, 5])
def test_f_ratio_fit_error_and_exactness_with_the_fitted_mixture(d: int) -> None:
    train, noise, score, strong, x = setup(d, seed=20 + d)
    gen = torch.Generator().manual_seed(d)
    q = Mixture([0.4, 0.6], [Gaussian.diag(strong.loc, [0.2 * S_P] * d),
                             Gaussian.diag(-strong.loc * 0.5, [0.25 * S_P] * d)])
    fitted = prior_ratio(train, q, "fit", FitSettings(k=4, steps=600, restarts=2, seed=d))
    assert fitted.method == "fit" and fitted.fit_error <= 0.05, fitted.fit_error
    # (b) again, with the ratio of a Gaussian test prior fitted instead of exact
    target = gaussian_linear_posterior(strong, noise, x)
    out = PriorGuidePosterior(score, train).sample(
        (4000,), x=x, prior=strong, steps=300, langevin_steps=0, pilot=0, kernel="paper", ratio="fit", k=2,
        fit_steps=600, kernel_cov=score.posterior(x).cov, seed=int(torch.randint(100, (1,), generator=gen)))
    assert out.diagnostics["ratio"]["method"] == "fit" and out.diagnostics["ratio"]["fit_error"] <= 0.05
    se = (target.cov.diagonal() / 4000).sqrt()
    assert bool(((out.theta.mean(0) - target.loc).abs() < 4 * se).all())
    assert float(torch.linalg.norm(torch.cov(out.theta.T) - target.cov) / torch.linalg.norm(target.cov)) < 0.1


def test_g_sir_collapses_in_20d_while_priorguide_passes() -> None:
    train, noise, score, strong, x = setup(20, seed=5)
    target = gaussian_linear_posterior(strong, noise, x)
    post = PriorGuidePosterior(score, train)
    unguided = post.sample((2000,), x=x, seed=0).theta
    report = sir_report(unguided, train, strong)
    assert report["ess_fraction"] < 0.01 and not report["reliable"] and report["pareto_k"] > 0.7
    out = post.sample((2000,), x=x, prior=strong, seed=0)
    assert out.diagnostics["sir"]["ess_fraction"] < 0.05 and not out.diagnostics["sir"]["reliable"]
    assert gaussian_kl(out.theta, target) < 0.2  # sampling alone gives ≈ 0.06 at n = 2000 in 20-D
    assert c2st(target.sample(2000, torch.Generator().manual_seed(3)), out.theta, trees=50) <= 0.6


def test_h_ood_fraction_grows_with_the_prior_shift() -> None:
    d = 10
    train = Gaussian.diag([0.0] * d, [S_P] * d)
    unit = torch.ones(d, dtype=torch.float64) / math.sqrt(d)
    fractions = []
    for shift in (0.0, 3.0, 5.3, 8.0):  # Mahalanobis distance of the test mean under p_train
        q = Gaussian.diag(unit * shift * S_P, [0.2 * S_P] * d)
        fractions.append(ood_fraction(train, q, n_train=10_000))
    assert fractions[0]["fraction"] == 0 and fractions[1]["fraction"] == 0 and not fractions[1]["flagged"]
    assert fractions[2]["fraction"] > fractions[2]["alpha"] and fractions[2]["flagged"]
    assert fractions[3]["fraction"] > 0.99


def test_settings_budget_seeds_and_diagnostics() -> None:
    train, _, score, strong, x = setup(2)
    post = PriorGuidePosterior(score, train)
    a = post.sample((300,), x=x, prior=strong, seed=4)
    b = post.sample((300,), x=x, prior=strong, seed=4)
    c = post.sample((300,), x=x, prior=strong, seed=5)
    assert torch.equal(a.theta, b.theta) and not torch.equal(a.theta, c.theta)
    assert {"seed", "nfe", "ratio", "ood", "sir", "seconds", "vjp", "pilot"} <= set(a.diagnostics)
    assert a.diagnostics["nfe"] == 225 and a.diagnostics["seed"] == 4
    capped = post.sample((100,), x=x, prior=strong, nfe_budget=100)
    assert capped.diagnostics["steps"] == 25 and capped.diagnostics["langevin_steps"] == 3
    assert capped.diagnostics["nfe"] == 100
    tiny = SamplerSettings(nfe_budget=10).budgeted()
    assert tiny == (10, 0)


def test_posterior_predictive_mode_on_the_joint_matches_the_analytic_predictive() -> None:
    """Eq. 17: guidance by r(θ) on the joint (θ, x*) gives θ ~ q(θ | x) and x* ~ p(x* | θ)."""
    from veil.posterior.score import predictive_joint

    d = 2
    train, noise, _, strong, x = setup(d, seed=8)
    joint_score = GaussianLinearScore(train, noise, predictive=True)
    target = predictive_joint(gaussian_linear_posterior(strong, noise, x), noise)
    post = PriorGuidePosterior(joint_score, train)
    out = post.sample((4000,), x=x, prior=strong, steps=300, langevin_steps=0, pilot=0, kernel="paper",
                      kernel_cov=joint_score.posterior(x).cov, seed=2)
    xi = torch.cat([out.theta, out.predictive], 1)
    assert out.theta.shape == (4000, d) and out.predictive.shape == (4000, d)
    se = (target.cov.diagonal() / 4000).sqrt()
    assert bool(((xi.mean(0) - target.loc).abs() < 4 * se).all())
    assert float(torch.linalg.norm(torch.cov(xi.T) - target.cov) / torch.linalg.norm(target.cov)) < 0.1
    assert c2st(target.sample(2000, torch.Generator().manual_seed(1)), xi[:2000], trees=50) <= 0.55
    default = post.sample((1000,), x=x, prior=strong, seed=2)  # pilot kernel over the joint, N = 25, N_L = 8
    assert gaussian_kl(torch.cat([default.theta, default.predictive], 1), target) < 0.05
