"""Prior specs (round trip, stable hash, refusals) and the ratio's methods and cache."""

from __future__ import annotations

import json

import pytest
import torch
from veil.posterior import Gaussian, Mixture, PriorSpecError, Uniform, prior_from_spec
from veil.posterior.ratio import FitSettings, RatioError, prior_ratio

SPECS = [
    {"family": "gaussian", "mean": [0.0, 1.0], "std": [0.5, 2.0]},
    {"family": "gaussian", "mean": [0.0, 1.0], "cov": [[1.0, 0.3], [0.3, 2.0]]},
    {"family": "uniform", "low": [-1.0, -2.0], "high": [1.0, 0.5]},
    {"family": "mixture", "weights": [0.25, 0.75],
     "components": [{"family": "gaussian", "mean": [0.0, 0.0], "std": [1.0, 1.0]},
                    {"family": "uniform", "low": [0.0, 0.0], "high": [1.0, 1.0]}]},
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["family"])
def test_spec_round_trip_and_hash(spec) -> None:
    prior = prior_from_spec(json.dumps(spec))
    again = prior_from_spec(prior.to_spec())
    assert again.to_spec() == prior.to_spec() and again.hash() == prior.hash() and again == prior
    theta = prior.sample(50, torch.Generator().manual_seed(0))
    assert theta.shape == (50, 2) and torch.isfinite(prior.log_prob(theta)).all()


def test_equal_priors_hash_equally_whichever_way_written() -> None:
    a = prior_from_spec({"family": "gaussian", "mean": [0, 0], "std": 0.5})
    b = prior_from_spec({"family": "gaussian", "mean": [0.0, 0.0], "var": [0.25, 0.25]})
    c = prior_from_spec({"family": "gaussian", "mean": [0.0, 0.0], "std": [0.5, 0.6]})
    assert a.hash() == b.hash() != c.hash()
    assert a.hash() == "5baee0cceaa1e789085c77a645a11bbedef84b9f9e31c539f1278c1347a027f4"  # pinned: caches and artifacts key on it


@pytest.mark.parametrize(("spec", "dim", "words"), [
    ({"family": "beta"}, None, ["prior.family", "'beta'"]),
    ({"family": "gaussian", "mean": [0, 0], "cov": [[1, 2], [2, 1]]}, None, ["prior.cov", "positive-definite"]),
    ({"family": "gaussian", "mean": [0, 0], "std": [1, 1, 1]}, None, ["prior.std", "expected 2"]),
    ({"family": "gaussian", "mean": [0, 0], "std": [1, -1]}, None, ["positive"]),
    ({"family": "gaussian", "mean": [0, 0]}, None, ["exactly one of"]),
    ({"family": "uniform", "low": [0, 0], "high": [1, -1]}, None, ["prior.high", "above low"]),
    ({"family": "gaussian", "mean": [0, 0, 0], "std": 1}, 2, ["expected dimension 2", "received 3"]),
    ({"family": "mixture", "weights": [1], "components": [{"family": "gaussian", "mean": [0], "std": 1},
                                                          {"family": "gaussian", "mean": [0], "std": 1}]},
     None, ["prior.weights", "expected 2"]),
    ({"family": "gaussian", "mean": ["a"], "std": 1}, None, ["prior.mean", "finite numbers"]),
    ({"family": "uniform", "low": [0], "high": [1], "mean": [0]}, None, ["unknown fields", "mean"]),
    ("{not json", None, ["invalid JSON"]),
])
def test_bad_specs_name_field_expected_and_received(spec, dim, words) -> None:
    with pytest.raises(PriorSpecError) as info:
        prior_from_spec(spec, dim=dim)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_ratio_methods_and_cache() -> None:
    train = Gaussian.diag([0.0, 0.0], [0.3, 0.3])
    strong = Gaussian.diag([0.1, 0.0], [0.06, 0.06])
    wide = Gaussian.diag([0.1, 0.0], [0.6, 0.6])  # wider than p_train: no closed form, so fitted
    assert prior_ratio(train, strong).method == "closed-form"
    assert prior_ratio(Uniform([-1, -1], [1, 1]), strong).method == "uniform-shortcut"
    assert prior_ratio(train, train).method == "identity"
    settings = FitSettings(k=2, steps=200, restarts=1, seed=3)
    first = prior_ratio(train, wide, fit=settings)
    second = prior_ratio(train, wide, fit=settings)
    assert first.method == "fit" and not first.cache_hit and second.cache_hit
    assert torch.equal(first.means, second.means)
    assert not prior_ratio(train, wide, fit=FitSettings(k=2, steps=200, restarts=1, seed=4)).cache_hit
    # the closed form is exact: log r̂ − log r is a constant 0
    theta = strong.sample(100, torch.Generator().manual_seed(0))
    exact = prior_ratio(train, strong)
    gap = exact.log_prob(theta) - (strong.log_prob(theta) - train.log_prob(theta))
    assert float(gap.abs().max()) < 1e-9


def test_ratio_refuses_unrepresentable_priors() -> None:
    box = Uniform([-1, -1], [1, 1])
    with pytest.raises(RatioError, match="uniform"):
        prior_ratio(box, Uniform([0, 0], [0.5, 0.5]))
    with pytest.raises(RatioError, match="support everywhere"):
        prior_ratio(Gaussian.diag([0, 0], [1, 1]), Mixture([1, 1], [box, Gaussian.diag([0, 0], [0.1, 0.1])]))
    with pytest.raises(RatioError, match="dimension 2"):
        prior_ratio(Gaussian.diag([0, 0], [1, 1]), Gaussian.diag([0], [1]))


def test_torch_distributions_are_accepted_as_sbi_users_write_them() -> None:
    from torch import distributions as D
    from veil.posterior import GaussianLinearScore, PriorGuidePosterior
    from veil.posterior.priors import as_prior

    box = D.Independent(D.Uniform(torch.zeros(2), torch.ones(2)), 1)  # sbi's BoxUniform
    assert as_prior(box) == Uniform([0, 0], [1, 1])
    mvn = D.MultivariateNormal(torch.zeros(2), torch.tensor([[1.0, 0.2], [0.2, 1.0]]))
    assert as_prior(mvn).to_spec()["cov"][0][1] == pytest.approx(0.2)
    assert as_prior(D.Independent(D.Normal(torch.zeros(2), 0.5 * torch.ones(2)), 1)) == Gaussian.diag([0, 0], [0.5, 0.5])
    mix = D.MixtureSameFamily(D.Categorical(torch.tensor([0.3, 0.7])),
                              D.MultivariateNormal(torch.zeros(2, 2), torch.eye(2).expand(2, 2, 2)))
    assert isinstance(as_prior(mix), Mixture)
    with pytest.raises(PriorSpecError, match="received Gamma"):
        as_prior(D.Gamma(torch.ones(2), torch.ones(2)))
    train = D.MultivariateNormal(torch.zeros(2), 0.1 * torch.eye(2))
    post = PriorGuidePosterior(GaussianLinearScore(as_prior(train), 0.1 * torch.eye(2)), train)
    out = post.sample((50,), x=torch.zeros(2), prior=D.MultivariateNormal(torch.zeros(2), 0.01 * torch.eye(2)),
                      steps=5, langevin_steps=0, pilot=10)
    assert out.theta.shape == (50, 2) and out.diagnostics["ratio"]["method"] == "closed-form"
    with pytest.raises(PriorSpecError, match="expected dimension 2"):
        post.sample((5,), x=torch.zeros(2), prior={"family": "gaussian", "mean": [0], "std": 1})
