"""Simulators, the score network's trainer and checkpoint, the sbi-style front end and `veil train sampler`."""

from __future__ import annotations

import json

import pytest
import torch
from veil.posterior import Gaussian, Uniform, c2st
from veil.training.priorguide import (
    TASKS,
    SamplerTrainConfig,
    ScoreEstimator,
    ScoreNetConfig,
    get_task,
    load_posterior,
    load_sampler,
    save_sampler,
    simulator_task,
    train_score,
)
from veil.training.priorguide.cli import main


@pytest.mark.parametrize("name", sorted(TASKS))
def test_tasks_simulate_finite_pairs(name: str) -> None:
    task = get_task(name)
    theta, x = task.simulate_pairs(64, seed=1)
    assert theta.shape == (64, task.dim) and x.shape == (64, task.x_dim) and torch.isfinite(x).all()
    again = task.simulate_pairs(64, seed=1)
    assert torch.equal(x, again[1])


def test_gaussian_linear_posterior_matches_moments_of_accepted_draws() -> None:
    task = get_task("gaussian_linear", 2)
    post = task.posterior(torch.tensor([0.2, -0.1]))
    assert torch.allclose(post.cov, torch.eye(2, dtype=torch.float64) * 0.05)  # (10 + 10)⁻¹
    assert torch.allclose(post.loc, torch.tensor([0.1, -0.05], dtype=torch.float64))
    with pytest.raises(ValueError, match="analytic posterior"):
        get_task("two_moons").posterior(torch.zeros(2))


def test_user_simulator_api_and_its_checks() -> None:
    task = simulator_task("mine", lambda th, g: th.sum(-1, keepdim=True) + 0.1 * torch.randn(th.shape[0], 1,
                                                                                              generator=g),
                          Uniform([0, 0], [1, 1]))
    assert task.x_dim == 1 and task.simulate_pairs(10)[1].shape == (10, 1)
    bad = simulator_task("bad", lambda th, g: th[:, :1], Uniform([0, 0], [1, 1]), x_dim=3)
    with pytest.raises(ValueError, match=r"expected shape \(5, 3\), received \(5, 1\)"):
        bad.simulate_pairs(5)
    with pytest.raises(ValueError, match="expected one of"):
        get_task("lotka")
    with pytest.raises(ValueError, match="dimension"):
        get_task("two_moons", dim=3)


def tiny(task_name: str = "gaussian_linear", dim: int = 2, steps: int = 300):
    task = get_task(task_name, dim)
    theta, x = task.simulate_pairs(2000, seed=0)
    cfg = SamplerTrainConfig(simulations=2000, steps=steps, batch_size=256)
    return task, train_score(theta, x, task.prior, ScoreNetConfig(dim=task.dim, x_dim=task.x_dim, hidden=32),
                             cfg, progress=False)


def test_checkpoint_round_trip(tmp_path) -> None:
    task, result = tiny()
    save_sampler(result, tmp_path / "ck", {"name": task.name, "dim": 2})
    model, prior, config = load_sampler(tmp_path / "ck")
    assert prior == task.prior and config["train"]["simulations"] == 2000
    args = torch.randn(5, 2), torch.rand(5) + 0.01, torch.randn(5, 2)
    assert torch.equal(model(*args), result.model(*args))
    assert json.loads((tmp_path / "ck" / "metrics.json").read_text())["held_out_loss"] > 0
    draws = load_posterior(tmp_path / "ck").sample((50,), x=torch.zeros(2), prior=Gaussian.diag([0, 0], [0.1, 0.1]),
                                                   steps=5, langevin_steps=1, pilot=10)
    assert draws.theta.shape == (50, 2) and draws.diagnostics["nfe"] == 10


def test_estimator_front_end_names_the_missing_call() -> None:
    est = ScoreEstimator(Gaussian.diag([0, 0], [0.3, 0.3]), ScoreNetConfig(hidden=16),
                         SamplerTrainConfig(steps=20, batch_size=64))
    with pytest.raises(RuntimeError, match="append_simulations"):
        est.train(progress=False)
    with pytest.raises(RuntimeError, match=r"\.train\(\)"):
        est.build_posterior()
    theta, x = get_task("gaussian_linear", 2).simulate_pairs(200)
    posterior = est.append_simulations(theta, x).train(progress=False).build_posterior()
    assert posterior.sample((20,), x=torch.zeros(2), steps=3, langevin_steps=0).theta.shape == (20, 2)


def test_train_sampler_cli(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "veil train sampler --task" in capsys.readouterr().out
    assert main(["--task", "two_moons", "--steps", "30", "--simulations", "500", "--hidden", "16",
                 "--out", str(tmp_path / "ck"), "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == 30 and (tmp_path / "ck" / "model.safetensors").is_file()
    assert load_sampler(tmp_path / "ck")[2]["task"]["name"] == "two_moons"


@pytest.mark.slow
def test_level1_trained_network_priorguide_matches_the_analytic_posterior() -> None:
    """Spec C6 Level 1: a small trained net on GL 2-D (10k simulations), C2ST ≤ 0.6 under a strong prior."""
    torch.set_num_threads(1)
    task = get_task("gaussian_linear", 2)
    theta, x = task.simulate_pairs(10_000, seed=0)
    result = train_score(theta, x, task.prior, ScoreNetConfig(dim=2, x_dim=2),
                         SamplerTrainConfig(steps=6000), progress=False)
    posterior = result.posterior()
    s = 0.1**0.5
    gen = torch.Generator().manual_seed(5)
    for mean in ([0.3, -0.2], [-0.4, 0.1]):
        q = Gaussian.diag(mean, [0.2 * s, 0.2 * s])
        x_o = task.simulate_checked(q.sample(1, gen), gen)[0]
        ref = task.posterior(x_o, q).sample(2000, gen)
        guided = posterior.sample((2000,), x=x_o, prior=q, seed=1).theta
        unguided = posterior.sample((2000,), x=x_o, seed=1).theta
        assert c2st(ref, guided, trees=50) <= 0.6
        assert c2st(ref, unguided, trees=50) >= 0.7
